//! Pod networking through CNI plugins: config loading, plugin invocation, results, the
//! attachment cache, the conf dir watcher and the manager the runtime calls.

pub mod cache;
pub mod capabilities;
pub mod config;
pub mod invoke;
pub mod manager;
pub mod result;
pub mod watch;

pub use manager::{NetError, NetManager, NetOptions, NetworkStatus};
