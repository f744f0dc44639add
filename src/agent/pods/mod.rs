//! Pod workers and what they keep: the pod manager (one worker per pod of every source),
//! back-off, lifecycle hooks, published status, terminations.

pub mod admission;
pub mod backoff;
pub mod hooks;
pub mod manager;
pub mod mirror;
pub mod registry;
pub mod status;
pub mod status_manager;
pub mod terminate;
pub mod userns;
pub mod worker;
