//! Resource metrics: cgroup statistics readers (v1 and v2) and the CPU-rate sampler.

pub mod cgroup_stats;

pub use cgroup_stats::{CgroupStats, CpuSampler, MemoryStats, SwapStats};
