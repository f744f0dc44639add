//! The agent and the CRI runtime: the configs it sends (and the runAsNonRoot check before
//! them), the labels it sets, the relist it reads.

pub mod container_config;
pub mod etc_hosts;
pub mod labels;
pub mod non_root;
pub mod relist;
pub mod resources;
pub mod sandbox_config;
pub mod service_env;
