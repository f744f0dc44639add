//! The eviction signals of the node (memory, nodefs, imagefs, pids) and the pods' usage of them.
//!
//! Where each signal is read:
//! - `memory.available`: the node's memory capacity minus the working set of the root memory
//!   cgroup (usage − inactive file pages), as the kubelet computes it; cgroup v1 at
//!   `/sys/fs/cgroup/memory`, v2 at `/sys/fs/cgroup`; `MemAvailable` only when neither is readable.
//! - `nodefs.*`: the filesystem holding the agent's pod directories (`pods_dir`, the kubelet's
//!   root dir) and the pods' logs (`pod_log_dir`, the kubelet's `/var/log/pods`). The kubelet
//!   assumes both share one filesystem; when they do not, the one with less left counts (per
//!   signal), so neither can fill up unseen.
//! - `imagefs.*`: the filesystem of the mountpoint the runtime reports in CRI `ImageFsInfo`.
//! - `pid.available`: min(`kernel.pid_max`, `kernel.threads-max`) minus the tasks that exist.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use crate::agent::AgentContext;
use crate::agent::runtime::labels;

/// An eviction signal, in the order the kubelet reclaims them (memory first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`
    MemoryAvailable,
    /// `nodefs.available`
    NodeFsAvailable,
    /// `nodefs.inodesFree`
    NodeFsInodesFree,
    /// `imagefs.available`
    ImageFsAvailable,
    /// `imagefs.inodesFree`
    ImageFsInodesFree,
    /// `pid.available`
    PidAvailable,
}

/// A node condition the eviction manager drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Condition {
    /// MemoryPressure
    Memory,
    /// DiskPressure
    Disk,
    /// PIDPressure
    Pid,
}

impl Condition {
    /// The node condition type.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "MemoryPressure",
            Self::Disk => "DiskPressure",
            Self::Pid => "PIDPressure",
        }
    }
}

impl Signal {
    /// Every signal, memory first.
    pub const ALL: [Signal; 6] = [
        Self::MemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::PidAvailable,
    ];

    /// The configuration name (`memory.available`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The signal of a configuration name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The resource reclaimed (the kubelet's names, as in eviction messages).
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree | Self::ImageFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }

    /// Whether the signal counts bytes (else things: inodes, pids).
    pub fn is_bytes(self) -> bool {
        matches!(self.resource(), "memory" | "ephemeral-storage")
    }

    /// The node condition this signal sets.
    pub fn condition(self) -> Condition {
        match self {
            Self::MemoryAvailable => Condition::Memory,
            Self::PidAvailable => Condition::Pid,
            _ => Condition::Disk,
        }
    }
}

/// What is left of a resource, and how much there is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observation {
    /// Available now.
    pub available: u64,
    /// Capacity (what percentage thresholds are of).
    pub capacity: u64,
}

/// One reading of every signal that could be read.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// By signal.
    pub signals: BTreeMap<Signal, Observation>,
    /// The nodefs path whose filesystem `nodefs.available` comes from.
    pub nodefs: Option<PathBuf>,
    /// The imagefs mountpoint.
    pub imagefs: Option<PathBuf>,
    /// Whether imagefs is another filesystem than nodefs.
    pub dedicated_imagefs: bool,
}

/// Where the node's signals are read.
#[derive(Debug, Clone)]
pub struct Sources {
    /// Paths on nodefs (pods dir, pod log dir).
    pub nodefs: Vec<PathBuf>,
    /// The image filesystem's mountpoint (CRI ImageFsInfo), if known.
    pub imagefs: Option<PathBuf>,
    /// The node's memory capacity in bytes.
    pub memory_capacity: u64,
}

/// Reads every signal now (blocking: file reads and statvfs).
pub fn observe(src: &Sources) -> Observed {
    let mut out = Observed::default();
    if let Some(m) = memory(src.memory_capacity) {
        out.signals.insert(Signal::MemoryAvailable, m);
    }
    let nodefs: Vec<FsStats> = src.nodefs.iter().filter_map(|p| fs_stats(p)).collect();
    let least_bytes = nodefs.iter().min_by_key(|f| f.bytes.available);
    if let Some(f) = least_bytes {
        out.signals.insert(Signal::NodeFsAvailable, f.bytes);
        out.nodefs = Some(f.path.clone());
    }
    if let Some(f) = nodefs.iter().min_by_key(|f| f.inodes.available) {
        out.signals.insert(Signal::NodeFsInodesFree, f.inodes);
    }
    if let Some(f) = src.imagefs.as_deref().and_then(fs_stats) {
        out.signals.insert(Signal::ImageFsAvailable, f.bytes);
        out.signals.insert(Signal::ImageFsInodesFree, f.inodes);
        out.dedicated_imagefs = least_bytes.is_some_and(|n| n.dev != f.dev);
        out.imagefs = Some(f.path);
    }
    if let Some(p) = pids() {
        out.signals.insert(Signal::PidAvailable, p);
    }
    out
}

/// A filesystem's space and inodes.
#[derive(Debug, Clone)]
pub struct FsStats {
    /// The path asked about (or its nearest existing ancestor).
    pub path: PathBuf,
    /// Device of the filesystem.
    pub dev: u64,
    /// Bytes available to unprivileged users, and the size.
    pub bytes: Observation,
    /// Free inodes, and the total.
    pub inodes: Observation,
}

/// statvfs of the filesystem holding `path` (its nearest existing ancestor when it does not exist yet).
pub fn fs_stats(path: &Path) -> Option<FsStats> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let st = rustix::fs::statvfs(existing).ok()?;
    let dev = std::fs::metadata(existing).ok()?.dev();
    Some(FsStats {
        path: path.to_path_buf(),
        dev,
        bytes: Observation {
            available: st.f_bavail.saturating_mul(st.f_frsize),
            capacity: st.f_blocks.saturating_mul(st.f_frsize),
        },
        inodes: Observation {
            available: st.f_ffree,
            capacity: st.f_files,
        },
    })
}

/// The nodefs of `paths` with the least space left (what `nodefs.available` reads).
pub fn nodefs(paths: &[PathBuf]) -> Option<FsStats> {
    paths
        .iter()
        .filter_map(|p| fs_stats(p))
        .min_by_key(|f| f.bytes.available)
}

/// A field of a `memory.stat` file.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The working set of a memory cgroup: usage minus inactive file pages (never below zero).
pub fn working_set(usage: u64, stat: &str, inactive_key: &str) -> u64 {
    usage.saturating_sub(stat_field(stat, inactive_key).unwrap_or(0))
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The root memory cgroup's working set (v1, then v2).
fn root_working_set() -> Option<u64> {
    let v1 = "/sys/fs/cgroup/memory";
    if let Some(usage) = read_u64(&format!("{v1}/memory.usage_in_bytes")) {
        let stat = std::fs::read_to_string(format!("{v1}/memory.stat")).ok()?;
        return Some(working_set(usage, &stat, "total_inactive_file"));
    }
    let usage = read_u64("/sys/fs/cgroup/memory.current")?;
    let stat = std::fs::read_to_string("/sys/fs/cgroup/memory.stat").ok()?;
    Some(working_set(usage, &stat, "inactive_file"))
}

/// `memory.available`: capacity minus the root cgroup's working set, or `MemAvailable`.
fn memory(capacity: u64) -> Option<Observation> {
    if let Some(ws) = root_working_set() {
        return Some(Observation {
            available: capacity.saturating_sub(ws),
            capacity,
        });
    }
    Some(Observation {
        available: crate::agent::runtime::resources::proc_meminfo_bytes("MemAvailable")?,
        capacity,
    })
}

/// The number of tasks (threads) that exist, from `/proc/loadavg`'s `running/total` field.
pub fn tasks_from_loadavg(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// `pid.available`: min(pid_max, threads-max) minus the tasks that exist.
fn pids() -> Option<Observation> {
    let pid_max = read_u64("/proc/sys/kernel/pid_max")?;
    let max = read_u64("/proc/sys/kernel/threads-max").map_or(pid_max, |t| t.min(pid_max));
    let tasks = tasks_from_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)?;
    Some(Observation {
        available: max.saturating_sub(tasks),
        capacity: max,
    })
}

/// One container's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    /// Memory working set in bytes.
    pub memory: Option<u64>,
    /// Writable layer bytes.
    pub rootfs: u64,
    /// Log bytes.
    pub logs: u64,
}

/// One pod's usage of the evictable resources.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodUsage {
    /// Memory working set of the pod in bytes (None: the runtime gave none).
    pub memory: Option<u64>,
    /// Bytes and inodes of the containers' writable layers (on imagefs).
    pub rootfs: (u64, u64),
    /// Bytes and inodes of the pod's logs (on nodefs).
    pub logs: (u64, u64),
    /// Bytes and inodes of the pod's own directory: emptyDirs on disk (on nodefs).
    pub volumes: (u64, u64),
    /// Processes of the pod.
    pub processes: u64,
    /// By container name.
    pub containers: BTreeMap<String, ContainerUsage>,
}

/// The usage of `pods` by UID: CRI `ListPodSandboxStats` (memory, processes, writable layers)
/// plus the bytes of each pod's log and pod directories. Pods the runtime has no stats for are
/// missing from the map.
pub async fn pod_usage(ctx: &AgentContext, pods: &[Pod]) -> HashMap<String, PodUsage> {
    let stats = match ctx
        .client
        .runtime()
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
    {
        Ok(r) => r.into_inner().stats,
        Err(e) => {
            tracing::warn!(error = %e.message(), "eviction: CRI ListPodSandboxStats failed; ranking pods without usage");
            Vec::new()
        }
    };
    let mut out: HashMap<String, PodUsage> = HashMap::new();
    for s in &stats {
        let Some(uid) = s
            .attributes
            .as_ref()
            .and_then(|a| a.labels.get(labels::POD_UID))
        else {
            continue;
        };
        add_sandbox_stats(out.entry(uid.clone()).or_default(), s);
    }
    let dirs: Vec<(String, PathBuf, PathBuf)> = pods
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            let logs = crate::agent::runtime::sandbox_config::log_directory(&ctx.pod_log_dir, p);
            Some((uid.clone(), logs, ctx.pods_dir.join(&uid)))
        })
        .filter(|(uid, _, _)| out.contains_key(uid))
        .collect();
    let sizes = tokio::task::spawn_blocking(move || {
        dirs.into_iter()
            .map(|(uid, logs, dir)| {
                let per_container = container_logs(&logs);
                (
                    uid,
                    crate::util::disk_usage(&logs),
                    crate::util::disk_usage(&dir),
                    per_container,
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    for (uid, logs, volumes, per_container) in sizes {
        if let Some(u) = out.get_mut(&uid) {
            u.logs = logs;
            u.volumes = volumes;
            for (name, bytes) in per_container {
                u.containers.entry(name).or_default().logs = bytes;
            }
        }
    }
    out
}

/// Adds one sandbox's CRI stats to a pod's usage (a pod may have several sandboxes).
fn add_sandbox_stats(u: &mut PodUsage, s: &cri::PodSandboxStats) {
    let Some(linux) = &s.linux else { return };
    if let Some(ws) = linux
        .memory
        .as_ref()
        .and_then(|m| m.working_set_bytes.as_ref())
    {
        u.memory = Some(u.memory.unwrap_or(0) + ws.value);
    }
    if let Some(n) = linux
        .process
        .as_ref()
        .and_then(|p| p.process_count.as_ref())
    {
        u.processes += n.value;
    }
    for c in &linux.containers {
        let name = c
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let layer = c.writable_layer.as_ref();
        let bytes = layer
            .and_then(|l| l.used_bytes.as_ref())
            .map_or(0, |v| v.value);
        let inodes = layer
            .and_then(|l| l.inodes_used.as_ref())
            .map_or(0, |v| v.value);
        u.rootfs.0 += bytes;
        u.rootfs.1 += inodes;
        let cu = u.containers.entry(name).or_default();
        cu.rootfs += bytes;
        if let Some(ws) = c.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref()) {
            cu.memory = Some(cu.memory.unwrap_or(0) + ws.value);
        }
    }
}

/// Log bytes of each container directory of a pod's log directory.
fn container_logs(pod_logs: &Path) -> Vec<(String, u64)> {
    let Ok(rd) = std::fs::read_dir(pod_logs) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                crate::util::disk_usage(&e.path()).0,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_round_trip_and_match_the_config() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.name()), Some(s));
            assert!(crate::agent::config::EVICTION_SIGNALS.contains(&s.name()));
        }
        assert_eq!(Signal::NodeFsInodesFree.resource(), "inodes");
        assert_eq!(Signal::ImageFsAvailable.condition(), Condition::Disk);
    }

    #[test]
    fn working_set_is_usage_minus_inactive_file() {
        let stat = "cache 10\ninactive_file 300\ntotal_inactive_file 400\n";
        assert_eq!(working_set(1000, stat, "total_inactive_file"), 600);
        assert_eq!(working_set(1000, stat, "inactive_file"), 700);
        assert_eq!(working_set(100, stat, "total_inactive_file"), 0);
        assert_eq!(working_set(100, "", "inactive_file"), 100);
    }

    #[test]
    fn tasks_are_read_from_loadavg() {
        assert_eq!(tasks_from_loadavg("0.10 0.20 0.30 2/345 6789\n"), Some(345));
        assert_eq!(tasks_from_loadavg("garbage"), None);
    }

    #[test]
    fn this_node_has_every_signal_but_imagefs_without_a_mountpoint() {
        let src = Sources {
            nodefs: vec![std::env::temp_dir().join("does/not/exist/yet")],
            imagefs: None,
            memory_capacity: 1 << 40,
        };
        let o = observe(&src);
        assert!(o.signals.contains_key(&Signal::MemoryAvailable));
        assert!(o.signals[&Signal::NodeFsAvailable].capacity > 0);
        assert!(o.signals[&Signal::PidAvailable].available > 0);
        assert!(!o.signals.contains_key(&Signal::ImageFsAvailable));
    }
}
