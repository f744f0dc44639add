//! The node: its status (conditions, capacity, allocatable, info) and its swap.

pub mod status;
pub mod swap;
