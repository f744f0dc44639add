//! Pod workers and what they keep: back-off, lifecycle hooks, published status, terminations.

pub mod backoff;
pub mod hooks;
pub mod registry;
pub mod status;
pub mod terminate;
pub mod worker;
