//! Resource metrics: cgroup statistics readers (v1 and v2), the CPU-rate sampler, interface
//! counters, the disk-usage cache, and berthd's Prometheus endpoint.

pub mod cgroup_metrics;
pub mod cgroup_stats;
pub mod disk_cache;
pub mod endpoint;
pub mod net_dev;
pub mod process;
pub mod prometheus;
pub mod psi;
pub mod state_collector;

pub use cgroup_stats::{CgroupStats, CpuSampler, MemoryStats, SwapStats};
pub use disk_cache::DiskCache;
