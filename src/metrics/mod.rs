//! Resource metrics: cgroup statistics readers (v1 and v2), the CPU-rate sampler and the
//! disk-usage cache.

pub mod cgroup_stats;
pub mod disk_cache;

pub use cgroup_stats::{CgroupStats, CpuSampler, MemoryStats, SwapStats};
pub use disk_cache::DiskCache;
