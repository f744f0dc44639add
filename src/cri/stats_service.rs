//! CRI ContainerStats, ListContainerStats, PodSandboxStats and ListPodSandboxStats, from
//! cgroup readings and snapshot usage.

use std::collections::{HashMap, HashSet};

use berth_snapshotter::{Snapshotter, Usage};
use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;
use crate::metrics::cgroup_stats::{self, CgroupStats};
use crate::metrics::{CpuSampler, DiskCache, MemoryStats, net_dev};
use crate::runtime::cgroups::Layout;
use crate::runtime::container::{ContainerRecord, ContainerState};
use crate::runtime::container_update;
use crate::runtime::sandbox::{SandboxManager, SandboxRecord, SandboxState};

/// Key prefix of pod samples in the CPU sampler (container keys are bare ids).
const POD_KEY: &str = "pod/";

fn u64v(value: u64) -> Option<cri::UInt64Value> {
    Some(cri::UInt64Value { value })
}

/// Turns cgroup readings into CRI stats and keeps the CPU samples between calls.
#[derive(Debug)]
pub struct StatsCollector {
    layout: Layout,
    cpu: CpuSampler,
    /// Each container's cgroup path, read once from its bundle's OCI spec (it never changes).
    cgroups: std::sync::Mutex<HashMap<String, Option<String>>>,
    /// Writable layers' usage by snapshot: measured at most every 10 s, as containerd does.
    layers: DiskCache<String, Option<Usage>>,
}

impl Default for StatsCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl StatsCollector {
    /// Detects the cgroup layout of this host.
    pub fn new() -> Self {
        let layout = Layout::detect().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading cgroup mounts: stats will be empty");
            Layout::V1(Vec::new())
        });
        Self::with_layout(layout)
    }

    /// A collector for a given layout.
    pub fn with_layout(layout: Layout) -> Self {
        Self {
            layout,
            cpu: CpuSampler::default(),
            cgroups: Default::default(),
            layers: DiskCache::default(),
        }
    }

    /// The host's cgroup layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Forgets CPU samples of containers and pods that are gone. `containers` / `pods` are the
    /// ids that exist; `None` leaves that kind alone.
    pub fn prune(&self, containers: Option<&HashSet<String>>, pods: Option<&HashSet<String>>) {
        self.cpu.retain(|k| match k.strip_prefix(POD_KEY) {
            Some(pod) => pods.is_none_or(|p| p.contains(pod)),
            None => containers.is_none_or(|c| c.contains(k)),
        });
        if let Some(c) = containers {
            self.cgroups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k, _| c.contains(k));
        }
    }

    /// The cgroup path a container runs in (from its bundle's OCI spec, read the first time).
    pub(super) fn container_cgroup(&self, rec: &ContainerRecord) -> Option<String> {
        if let Some(known) = self
            .cgroups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&rec.id)
        {
            return known.clone();
        }
        let path = container_update::read_spec(&rec.bundle)
            .ok()
            .and_then(|s| container_update::cgroups_path(&s));
        // Only a found path is kept: a spec not written yet is read again next time.
        if path.is_some() {
            self.cgroups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(rec.id.clone(), path.clone());
        }
        path
    }

    /// ContainerStats for one container; a missing cgroup reads as zeros.
    pub fn container(&self, rec: &ContainerRecord, snapshots: &Snapshotter) -> cri::ContainerStats {
        let now = crate::util::unix_nanos_now();
        let stats = self
            .container_cgroup(rec)
            .map(|p| cgroup_stats::read_cpu_memory(&self.layout, &p))
            .unwrap_or_default();
        let config = rec.config_ref();
        let since = if rec.state == ContainerState::Running {
            rec.started_at
        } else {
            0
        };
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: rec.id.clone(),
                metadata: config.metadata.clone(),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
            }),
            cpu: Some(self.cpu_usage(&rec.id, now, &stats, since)),
            memory: Some(memory_usage(now, stats.memory.as_ref())),
            swap: stats.swap.as_ref().map(|s| cri::SwapUsage {
                timestamp: now,
                swap_available_bytes: s.available_bytes().and_then(u64v),
                swap_usage_bytes: u64v(s.usage_bytes),
            }),
            writable_layer: self.writable_layer(now, rec, snapshots),
        }
    }

    fn cpu_usage(&self, key: &str, now: i64, stats: &CgroupStats, since: i64) -> cri::CpuUsage {
        let usage = stats.cpu_usage_ns;
        cri::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: u64v(usage.unwrap_or(0)),
            usage_nano_cores: usage
                .and_then(|u| self.cpu.rate(key, now, u, since))
                .and_then(u64v),
        }
    }

    /// PodSandboxStats for `sandbox` whose containers are `containers`.
    pub fn sandbox(
        &self,
        sandbox: &SandboxRecord,
        containers: &[ContainerRecord],
        snapshots: &Snapshotter,
    ) -> cri::PodSandboxStats {
        let now = crate::util::unix_nanos_now();
        let container_stats: Vec<cri::ContainerStats> = containers
            .iter()
            .map(|c| self.container(c, snapshots))
            .collect();
        let cgroups: Vec<Option<String>> = containers
            .iter()
            .map(|c| self.container_cgroup(c))
            .collect();
        let pod = if sandbox.cgroup_parent.is_empty() {
            // No pod cgroup: the pod is the sum of its containers.
            let parts: Vec<CgroupStats> = cgroups
                .iter()
                .flatten()
                .map(|p| cgroup_stats::read(&self.layout, p))
                .collect();
            sum(&parts)
        } else {
            cgroup_stats::read(&self.layout, &sandbox.cgroup_parent)
        };
        let key = format!("{POD_KEY}{}", sandbox.id);
        let config = sandbox.config_ref();
        let network = if sandbox.net_ns.is_some() {
            containers
                .iter()
                .zip(&cgroups)
                .filter(|(c, _)| c.state == ContainerState::Running)
                .filter_map(|(_, p)| p.as_deref())
                .find_map(|p| self.first_pid(p))
                .and_then(|pid| network_usage(now, pid))
        } else {
            None
        };
        cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: sandbox.id.clone(),
                metadata: config.metadata.clone(),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: Some(self.cpu_usage(&key, now, &pod, sandbox.created_at)),
                memory: Some(memory_usage(now, pod.memory.as_ref())),
                network,
                process: Some(cri::ProcessUsage {
                    timestamp: now,
                    process_count: u64v(pod.pids.unwrap_or(0)),
                }),
                containers: container_stats,
            }),
            windows: None,
        }
    }

    /// Bytes and inodes of the container's writable layer (its snapshot's usage, measured at
    /// most every [`DISK_TTL`](crate::metrics::disk_cache::DISK_TTL)).
    pub(super) fn writable_layer_usage(
        &self,
        rec: &ContainerRecord,
        snapshots: &Snapshotter,
    ) -> Option<(u64, u64)> {
        if rec.snapshot.is_empty() {
            return None;
        }
        let usage = self.layers.usage(&rec.snapshot, || {
            snapshots
                .usage(&rec.snapshot)
                .map_err(
                    |e| tracing::debug!(container = %rec.id, error = %e, "writable layer usage"),
                )
                .ok()
        })?;
        Some((usage.bytes, usage.inodes))
    }

    /// The container's writable layer as the stats report it.
    fn writable_layer(
        &self,
        now: i64,
        rec: &ContainerRecord,
        snapshots: &Snapshotter,
    ) -> Option<cri::FilesystemUsage> {
        let (bytes, inodes) = self.writable_layer_usage(rec, snapshots)?;
        Some(cri::FilesystemUsage {
            timestamp: now,
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: snapshots.root().display().to_string(),
            }),
            used_bytes: u64v(bytes),
            inodes_used: u64v(inodes),
        })
    }

    /// A process of the cgroup `cgroup_path` (or below it), if any runs.
    fn first_pid(&self, cgroup_path: &str) -> Option<u32> {
        ["pids", "memory", "cpu"]
            .iter()
            .filter_map(|c| cgroup_stats::controller_dir(&self.layout, c, cgroup_path))
            .find_map(|d| cgroup_stats::procs(&d).into_iter().next())
    }
}

fn memory_usage(now: i64, m: Option<&MemoryStats>) -> cri::MemoryUsage {
    let m = m.cloned().unwrap_or_default();
    cri::MemoryUsage {
        timestamp: now,
        working_set_bytes: u64v(m.working_set_bytes),
        available_bytes: m.available_bytes().and_then(u64v),
        usage_bytes: u64v(m.usage_bytes),
        rss_bytes: u64v(m.rss_bytes),
        page_faults: u64v(m.page_faults),
        major_page_faults: u64v(m.major_page_faults),
    }
}

/// The sum of several cgroups' readings (limits are not summed: a sum has none).
fn sum(parts: &[CgroupStats]) -> CgroupStats {
    let mut out = CgroupStats::default();
    for p in parts {
        if let Some(c) = p.cpu_usage_ns {
            out.cpu_usage_ns = Some(out.cpu_usage_ns.unwrap_or(0) + c);
        }
        if let Some(m) = &p.memory {
            let o = out.memory.get_or_insert_with(MemoryStats::default);
            o.usage_bytes += m.usage_bytes;
            o.working_set_bytes += m.working_set_bytes;
            o.rss_bytes += m.rss_bytes;
            o.page_faults += m.page_faults;
            o.major_page_faults += m.major_page_faults;
        }
        if let Some(n) = p.pids {
            out.pids = Some(out.pids.unwrap_or(0) + n);
        }
    }
    out
}

/// Interface counters of the pod's network namespace (through a process in it); `lo` is left
/// out, and nothing is reported when no other interface exists.
fn network_usage(now: i64, pid: u32) -> Option<cri::NetworkUsage> {
    let interfaces: Vec<cri::NetworkInterfaceUsage> = net_dev::read(pid)?
        .into_iter()
        .map(|i| cri::NetworkInterfaceUsage {
            name: i.name,
            rx_bytes: u64v(i.rx_bytes),
            rx_errors: u64v(i.rx_errors),
            tx_bytes: u64v(i.tx_bytes),
            tx_errors: u64v(i.tx_errors),
        })
        .collect();
    let default_interface = interfaces
        .iter()
        .find(|i| i.name == "eth0")
        .or_else(|| interfaces.first())
        .cloned()?;
    Some(cri::NetworkUsage {
        timestamp: now,
        default_interface: Some(default_interface),
        interfaces,
    })
}

/// `one` applied to every item, the items spread over the machine's cores (cgroup and disk
/// reads of many pods); results in the items' order.
pub fn spread_over_cores<T: Sync, R: Send>(items: &[T], one: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len().div_ceil(8))
        .max(1);
    if threads == 1 {
        return items.iter().map(one).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let one = &one;
    std::thread::scope(|scope| {
        let parts: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Whether `rec` passes a ListContainerStats filter (id and sandbox id may be prefixes).
pub fn container_matches(
    rec: &ContainerRecord,
    filter: Option<&cri::ContainerStatsFilter>,
) -> bool {
    if rec.state == ContainerState::Creating {
        return false;
    }
    let Some(f) = filter else {
        return true;
    };
    if !rec.id.starts_with(&f.id) || !rec.sandbox_id.starts_with(&f.pod_sandbox_id) {
        return false;
    }
    if f.label_selector.is_empty() {
        return true;
    }
    let labels = &rec.config_ref().labels;
    f.label_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// Stats of the containers passing `filter`, read off the async threads (cgroupfs and
/// snapshot walks block).
async fn container_stats_list(
    api: &RuntimeApi,
    filter: Option<cri::ContainerStatsFilter>,
) -> Result<Vec<cri::ContainerStats>, Status> {
    let all = api.containers.stored()?;
    if filter.is_none() {
        let ids: HashSet<String> = all.iter().map(|r| r.id.clone()).collect();
        api.stats.prune(Some(&ids), None);
    }
    let recs: Vec<_> = all
        .into_iter()
        .filter(|r| container_matches(r, filter.as_ref()))
        .collect();
    let stats = api.stats.clone();
    let snapshots = api.images.snapshotter();
    tokio::task::spawn_blocking(move || {
        recs.iter()
            .map(|r| stats.container(r, &snapshots))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| Status::internal(format!("container stats: {e}")))
}

/// Stats of the given sandboxes with their containers.
async fn pod_stats_list(
    api: &RuntimeApi,
    sandboxes: Vec<SandboxRecord>,
    prune: bool,
) -> Result<Vec<cri::PodSandboxStats>, Status> {
    let all = api.containers.stored()?;
    if prune {
        let ids: HashSet<String> = all.iter().map(|c| c.id.clone()).collect();
        api.stats.prune(Some(&ids), None);
    }
    let stats = api.stats.clone();
    let snapshots = api.images.snapshotter();
    tokio::task::spawn_blocking(move || {
        let mut by_sandbox: HashMap<&str, Vec<ContainerRecord>> = HashMap::new();
        for c in all.iter().filter(|c| c.state != ContainerState::Creating) {
            by_sandbox
                .entry(c.sandbox_id.as_str())
                .or_default()
                .push(c.clone());
        }
        let one = |s: &SandboxRecord| {
            let mine = by_sandbox.get(s.id.as_str()).map_or(&[][..], Vec::as_slice);
            stats.sandbox(s, mine, &snapshots)
        };
        spread_over_cores(&sandboxes, one)
    })
    .await
    .map_err(|e| Status::internal(format!("pod sandbox stats: {e}")))
}

pub(super) async fn container_stats(
    api: &RuntimeApi,
    request: Request<cri::ContainerStatsRequest>,
) -> Result<Response<cri::ContainerStatsResponse>, Status> {
    let rec = api.containers.get(&request.get_ref().container_id)?;
    let filter = cri::ContainerStatsFilter {
        id: rec.id.clone(),
        ..Default::default()
    };
    let stats = container_stats_list(api, Some(filter))
        .await?
        .into_iter()
        .next();
    match stats {
        Some(s) => Ok(Response::new(cri::ContainerStatsResponse {
            stats: Some(s),
        })),
        None => Err(Status::not_found(format!("container {} not found", rec.id))),
    }
}

pub(super) async fn list_container_stats(
    api: &RuntimeApi,
    request: Request<cri::ListContainerStatsRequest>,
) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
    let stats = container_stats_list(api, request.into_inner().filter).await?;
    Ok(Response::new(cri::ListContainerStatsResponse { stats }))
}

pub(super) async fn pod_sandbox_stats(
    api: &RuntimeApi,
    request: Request<cri::PodSandboxStatsRequest>,
) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
    let rec = api.sandboxes.get(&request.get_ref().pod_sandbox_id)?;
    let stats = pod_stats_list(api, vec![rec], false)
        .await?
        .into_iter()
        .next();
    Ok(Response::new(cri::PodSandboxStatsResponse { stats }))
}

pub(super) async fn list_pod_sandbox_stats(
    api: &RuntimeApi,
    request: Request<cri::ListPodSandboxStatsRequest>,
) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
    let filter = request.into_inner().filter;
    let all = api.sandboxes.list()?;
    let prune = filter.is_none();
    if prune {
        let ids: HashSet<String> = all.iter().map(|r| r.id.clone()).collect();
        api.stats.prune(None, Some(&ids));
    }
    let pod_filter = filter.map(|f| cri::PodSandboxFilter {
        id: f.id,
        state: None,
        label_selector: f.label_selector,
    });
    let sandboxes: Vec<SandboxRecord> = all
        .into_iter()
        .filter(|s| s.state != SandboxState::Creating)
        .filter(|s| {
            pod_filter
                .as_ref()
                .is_none_or(|f| SandboxManager::matches(s, f))
        })
        .map(|s| SandboxRecord::clone(&s))
        .collect();
    let stats = pod_stats_list(api, sandboxes, prune).await?;
    Ok(Response::new(cri::ListPodSandboxStatsResponse { stats }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_add_up_and_drop_limits() {
        let a = CgroupStats {
            cpu_usage_ns: Some(5),
            memory: Some(MemoryStats {
                usage_bytes: 10,
                working_set_bytes: 8,
                limit_bytes: Some(100),
                ..Default::default()
            }),
            pids: Some(1),
            ..Default::default()
        };
        let s = sum(&[a.clone(), a, CgroupStats::default()]);
        assert_eq!(s.cpu_usage_ns, Some(10));
        assert_eq!(s.pids, Some(2));
        let m = s.memory.expect("memory");
        assert_eq!(
            (m.usage_bytes, m.working_set_bytes, m.limit_bytes),
            (20, 16, None)
        );
    }

    #[test]
    fn memory_without_a_cgroup_is_zero() {
        let m = memory_usage(7, None);
        assert_eq!(m.timestamp, 7);
        assert_eq!(m.working_set_bytes, u64v(0));
        assert_eq!(m.available_bytes, None);
    }
}
