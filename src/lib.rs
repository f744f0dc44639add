//! Berth: a container runtime for Kubernetes nodes (CRI server, image service, node agent).

pub mod agent;
pub mod archive_api;
pub mod client;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod dbus;
pub mod image;
pub mod logging;
pub mod logs;
pub mod metrics;
pub mod net;
pub mod runtime;
pub mod sd_notify;
pub mod socket_access;
pub mod store;
pub mod stream;
pub mod util;
