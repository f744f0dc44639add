//! The runtime core: pod sandboxes and containers (being built for the runtime issue).

pub mod names;
pub mod pin;
