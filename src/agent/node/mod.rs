//! The node: its status (conditions, capacity, allocatable, info), its registration and Lease
//! with the API server, its Node as the API server has it, and its swap.

pub mod lease;
pub mod register;
pub mod status;
pub mod swap;
pub mod watch;
