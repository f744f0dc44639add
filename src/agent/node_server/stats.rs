//! `/stats/summary`: the kubelet's Summary API (what metrics-server and `kubectl top` read): the
//! node's CPU, memory, network, filesystems, image filesystem and process limit, the pods' and
//! containers' CPU, memory, network, disk and volumes, from CRI stats and the node's cgroups.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::ServeError;
use crate::agent::AgentContext;
use crate::agent::eviction::signals::{FsStats as Filesystem, fs_stats};
use crate::agent::runtime::labels;
use crate::metrics::{CpuSampler, DiskCache};
use crate::runtime::cgroups::Layout;

/// The Summary API's top level.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub system_containers: Vec<ContainerStats>,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    pub image_fs: FsStats,
}

#[derive(Debug, Serialize)]
pub struct RlimitStats {
    pub time: String,
    pub maxpid: u64,
    pub curproc: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    pub time: String,
    #[serde(flatten)]
    pub default: InterfaceStats,
    pub interfaces: Vec<InterfaceStats>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    pub used_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    pub inodes_used: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

#[derive(Debug, Serialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Serialize)]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct ProcessStats {
    pub process_count: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: String,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// One pod's disk use: its index in the summary, its containers' log directories and its
/// volumes, each as (name, (bytes, inodes)).
type PodDisk = (usize, Vec<(String, (u64, u64))>, Vec<(String, (u64, u64))>);

/// Collects summaries; remembers CPU samples so each has a usage rate.
pub struct Collector {
    ctx: Arc<AgentContext>,
    disk: Arc<DiskCache<PathBuf>>,
    layout: Option<Layout>,
    cpu: CpuSampler,
    boot_time: String,
}

fn rfc3339_nanos(nanos: i64) -> String {
    Timestamp::from_nanosecond(i128::from(nanos))
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

fn value(v: &Option<cri::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

fn cpu_from(c: &cri::CpuUsage) -> CpuStats {
    CpuStats {
        time: rfc3339_nanos(c.timestamp),
        usage_nano_cores: value(&c.usage_nano_cores),
        usage_core_nano_seconds: value(&c.usage_core_nano_seconds),
    }
}

fn memory_from(m: &cri::MemoryUsage) -> MemoryStats {
    MemoryStats {
        time: rfc3339_nanos(m.timestamp),
        available_bytes: value(&m.available_bytes),
        usage_bytes: value(&m.usage_bytes).unwrap_or(0),
        working_set_bytes: value(&m.working_set_bytes).unwrap_or(0),
        rss_bytes: value(&m.rss_bytes).unwrap_or(0),
        page_faults: value(&m.page_faults).unwrap_or(0),
        major_page_faults: value(&m.major_page_faults).unwrap_or(0),
    }
}

fn interface_from(i: &cri::NetworkInterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: value(&i.rx_bytes).unwrap_or(0),
        rx_errors: value(&i.rx_errors).unwrap_or(0),
        tx_bytes: value(&i.tx_bytes).unwrap_or(0),
        tx_errors: value(&i.tx_errors).unwrap_or(0),
    }
}

fn network_from(n: &cri::NetworkUsage) -> Option<NetworkStats> {
    let default = n
        .default_interface
        .as_ref()
        .or_else(|| n.interfaces.first())?;
    Some(NetworkStats {
        time: rfc3339_nanos(n.timestamp),
        default: interface_from(default),
        interfaces: n.interfaces.iter().map(interface_from).collect(),
    })
}

/// A filesystem's size and what is free on it, with `used` bytes and inodes of one user of it.
/// `used` on the filesystem whose figures are `st` (measured once per summary: a statfs per
/// pod and container would cost more than all the cgroup reads).
fn fs_on(st: Option<&Filesystem>, used: (u64, u64), time: &str) -> FsStats {
    FsStats {
        time: time.to_string(),
        available_bytes: st.as_ref().map(|s| s.bytes.available),
        capacity_bytes: st.as_ref().map(|s| s.bytes.capacity),
        used_bytes: used.0,
        inodes_free: st.as_ref().map(|s| s.inodes.available),
        inodes: st.as_ref().map(|s| s.inodes.capacity),
        inodes_used: used.1,
    }
}

/// The machine's boot time, from `/proc/stat`'s `btime`.
fn boot_time() -> String {
    let secs = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<i64>().ok())
        })
        .unwrap_or(0);
    rfc3339_nanos(secs.saturating_mul(1_000_000_000))
}

/// Counters of the interface the default route leaves by (from `/proc/net/dev`).
fn node_network(time: &str) -> Option<NetworkStats> {
    let route = std::fs::read_to_string("/proc/net/route").ok()?;
    let default_if = route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"00000000")).then(|| f[0].to_string())
    });
    let dev = std::fs::read_to_string("/proc/net/dev").ok()?;
    let interfaces: Vec<InterfaceStats> = dev
        .lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let n: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            (n.len() >= 11).then(|| InterfaceStats {
                name: name.trim().to_string(),
                rx_bytes: n[0],
                rx_errors: n[2],
                tx_bytes: n[8],
                tx_errors: n[10],
            })
        })
        .filter(|i| i.name != "lo")
        .collect();
    let default = match &default_if {
        Some(d) => interfaces.iter().find(|i| &i.name == d),
        None => interfaces.first(),
    }?
    .clone();
    Some(NetworkStats {
        time: time.to_string(),
        default,
        interfaces,
    })
}

impl Collector {
    pub fn new(ctx: Arc<AgentContext>) -> Self {
        Self {
            ctx,
            disk: Arc::default(),
            layout: Layout::detect().ok(),
            cpu: CpuSampler::default(),
            boot_time: boot_time(),
        }
    }

    /// CPU and memory of the cgroup `path` (the root: the whole node).
    fn cgroup(
        &self,
        key: &str,
        path: &str,
        capacity: Option<u64>,
    ) -> (Option<CpuStats>, Option<MemoryStats>) {
        let Some(layout) = &self.layout else {
            return (None, None);
        };
        let now = crate::util::unix_nanos_now();
        let time = rfc3339_nanos(now);
        let st = crate::metrics::cgroup_stats::read_cpu_memory(layout, path);
        let cpu = st.cpu_usage_ns.map(|usage| CpuStats {
            time: time.clone(),
            usage_nano_cores: self.cpu.rate(key, now, usage, 0),
            usage_core_nano_seconds: Some(usage),
        });
        let memory = st.memory.map(|m| MemoryStats {
            time,
            available_bytes: m
                .available_bytes()
                .or_else(|| capacity.map(|c| c.saturating_sub(m.working_set_bytes))),
            usage_bytes: m.usage_bytes,
            working_set_bytes: m.working_set_bytes,
            rss_bytes: m.rss_bytes,
            page_faults: m.page_faults,
            major_page_faults: m.major_page_faults,
        });
        (cpu, memory)
    }

    /// The summary now; `only_cpu_and_memory` leaves out network, disks and volumes.
    pub async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, ServeError> {
        // The two runtime calls go out together.
        let mut runtime = self.ctx.client.runtime();
        let mut images = self.ctx.client.images();
        let (stats, image_fs) = tokio::join!(
            runtime.list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None }),
            async {
                if only_cpu_and_memory {
                    None
                } else {
                    images
                        .image_fs_info(cri::ImageFsInfoRequest {})
                        .await
                        .ok()
                        .and_then(|r| r.into_inner().image_filesystems.into_iter().next())
                }
            }
        );
        let stats = stats
            .map_err(|e| {
                ServeError::unavailable(format!("runtime: ListPodSandboxStats: {}", e.message()))
            })?
            .into_inner()
            .stats;
        let pods = self.ctx.pods.list();
        let by_uid: HashMap<String, &k8s_openapi::api::core::v1::Pod> = pods
            .iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
            .collect();
        let time = rfc3339_nanos(crate::util::unix_nanos_now());
        let capacity = Some(self.ctx.node.memory_bytes);
        let (cpu, memory) = self.cgroup("node", "/", capacity);
        let pods_root = crate::agent::runtime::sandbox_config::pods_cgroup(&self.ctx.cgroup_root);
        let (pods_cpu, pods_memory) = self.cgroup("pods", &pods_root, capacity);
        let mut out_pods = Vec::new();
        // Disk walks (logs, volumes) are done on the blocking pool, all pods at once.
        let mut disk_jobs = Vec::new();
        for s in &stats {
            let Some(attrs) = &s.attributes else { continue };
            let Some(uid) = attrs.labels.get(labels::POD_UID) else {
                continue;
            };
            let Some(pod) = by_uid.get(uid) else { continue };
            let Some(linux) = &s.linux else { continue };
            let start_time = pod
                .status
                .as_ref()
                .and_then(|st| st.start_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_else(|| time.clone());
            let containers: Vec<ContainerStats> = linux
                .containers
                .iter()
                .map(|c| {
                    let name = c
                        .attributes
                        .as_ref()
                        .and_then(|a| a.metadata.as_ref())
                        .map(|m| m.name.clone())
                        .unwrap_or_default();
                    let rootfs = c.writable_layer.as_ref().map(|l| {
                        (
                            value(&l.used_bytes).unwrap_or(0),
                            value(&l.inodes_used).unwrap_or(0),
                        )
                    });
                    ContainerStats {
                        name,
                        start_time: start_time.clone(),
                        cpu: c.cpu.as_ref().map(cpu_from),
                        memory: c.memory.as_ref().map(memory_from),
                        rootfs: rootfs.map(|(b, i)| FsStats {
                            time: time.clone(),
                            used_bytes: b,
                            inodes_used: i,
                            ..Default::default()
                        }),
                        logs: None,
                    }
                })
                .collect();
            let meta = attrs.metadata.clone().unwrap_or_default();
            if !only_cpu_and_memory {
                disk_jobs.push((
                    out_pods.len(),
                    crate::agent::runtime::sandbox_config::log_directory(
                        &self.ctx.pod_log_dir,
                        pod,
                    ),
                    self.ctx.pods_dir.join(uid).join("volumes"),
                ));
            }
            out_pods.push(PodStats {
                pod_ref: PodReference {
                    name: meta.name,
                    namespace: meta.namespace,
                    uid: uid.clone(),
                },
                start_time,
                containers,
                cpu: linux.cpu.as_ref().map(cpu_from),
                memory: linux.memory.as_ref().map(memory_from),
                network: if only_cpu_and_memory {
                    None
                } else {
                    linux.network.as_ref().and_then(network_from)
                },
                volume: Vec::new(),
                ephemeral_storage: None,
                process_stats: linux
                    .process
                    .as_ref()
                    .and_then(|p| value(&p.process_count))
                    .map(|process_count| ProcessStats { process_count }),
            });
        }
        let mut node = NodeStats {
            node_name: self.ctx.node.name.clone(),
            system_containers: vec![system_container(
                "pods",
                pods_cpu,
                pods_memory,
                &self.boot_time,
            )],
            start_time: self.boot_time.clone(),
            cpu,
            memory,
            network: None,
            fs: None,
            runtime: None,
            rlimit: None,
        };
        if only_cpu_and_memory {
            return Ok(Summary {
                node,
                pods: out_pods,
            });
        }
        let pods_dir = self.ctx.pods_dir.clone();
        let image_mount = image_fs
            .as_ref()
            .and_then(|f| f.fs_id.as_ref())
            .map(|f| PathBuf::from(&f.mountpoint));
        let image_used = image_fs.as_ref().map(|f| {
            (
                value(&f.used_bytes).unwrap_or(0),
                value(&f.inodes_used).unwrap_or(0),
            )
        });
        let t = time.clone();
        let cache = self.disk.clone();
        let log_dir = self.ctx.pod_log_dir.clone();
        let disk = tokio::task::spawn_blocking(move || {
            let per_pod: Vec<PodDisk> = disk_jobs
                .into_iter()
                .map(|(i, logs, volumes)| {
                    (
                        i,
                        dir_usages(&logs, 1, &cache),
                        dir_usages(&volumes, 2, &cache),
                    )
                })
                .collect();
            let pods_fs = fs_stats(&pods_dir);
            let logs_fs = fs_stats(&log_dir);
            let node_fs = pods_fs.as_ref().map(|s| FsStats {
                time: t.clone(),
                available_bytes: Some(s.bytes.available),
                capacity_bytes: Some(s.bytes.capacity),
                used_bytes: s.bytes.capacity.saturating_sub(s.bytes.available),
                inodes_free: Some(s.inodes.available),
                inodes: Some(s.inodes.capacity),
                inodes_used: s.inodes.capacity.saturating_sub(s.inodes.available),
            });
            let image =
                image_mount.map(|m| fs_on(fs_stats(&m).as_ref(), image_used.unwrap_or((0, 0)), &t));
            let rlimit = rlimit(&t);
            let network = node_network(&t);
            (per_pod, node_fs, image, rlimit, network, pods_fs, logs_fs)
        })
        .await
        .map_err(|e| ServeError::internal(format!("disk statistics: {e}")))?;
        let (per_pod, node_fs, image, rlimit, network, pods_fs, logs_fs) = disk;
        for (i, logs, volumes) in per_pod {
            let Some(p) = out_pods.get_mut(i) else {
                continue;
            };
            let mut ephemeral = (0u64, 0u64);
            for c in &mut p.containers {
                let used = logs
                    .iter()
                    .find(|(n, _)| n == &c.name)
                    .map(|(_, u)| *u)
                    .unwrap_or((0, 0));
                c.logs = Some(fs_on(logs_fs.as_ref(), used, &time));
                if let Some(r) = &mut c.rootfs
                    && let Some(m) = image.as_ref()
                {
                    r.available_bytes = m.available_bytes;
                    r.capacity_bytes = m.capacity_bytes;
                    r.inodes_free = m.inodes_free;
                    r.inodes = m.inodes;
                }
                let rootfs = c
                    .rootfs
                    .as_ref()
                    .map_or((0, 0), |r| (r.used_bytes, r.inodes_used));
                ephemeral.0 += used.0 + rootfs.0;
                ephemeral.1 += used.1 + rootfs.1;
            }
            for (name, used) in volumes {
                // emptyDirs count against ephemeral storage; other volumes (configMaps, secrets,
                // projected tokens) are listed but belong to the API.
                ephemeral.0 += used.0;
                ephemeral.1 += used.1;
                p.volume.push(VolumeStats {
                    fs: fs_on(pods_fs.as_ref(), used, &time),
                    name,
                });
            }
            p.ephemeral_storage = Some(fs_on(pods_fs.as_ref(), ephemeral, &time));
        }
        node.network = network;
        node.fs = node_fs;
        node.runtime = image.map(|image_fs| RuntimeStats { image_fs });
        node.rlimit = rlimit;
        Ok(Summary {
            node,
            pods: out_pods,
        })
    }
}

fn system_container(
    name: &str,
    cpu: Option<CpuStats>,
    memory: Option<MemoryStats>,
    start: &str,
) -> ContainerStats {
    ContainerStats {
        name: name.to_string(),
        start_time: start.to_string(),
        cpu,
        memory,
        rootfs: None,
        logs: None,
    }
}

/// The node's process limit and how many tasks exist.
fn rlimit(time: &str) -> Option<RlimitStats> {
    let maxpid = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let curproc = crate::agent::eviction::signals::tasks_from_loadavg(
        &std::fs::read_to_string("/proc/loadavg").ok()?,
    )?;
    Some(RlimitStats {
        time: time.to_string(),
        maxpid,
        curproc,
    })
}

/// Bytes and inodes of each directory `depth` levels below `root` (1: its entries; 2: the
/// entries of its entries, as `volumes/<plugin>/<name>`), by the last name.
fn dir_usages(root: &Path, depth: usize, cache: &DiskCache<PathBuf>) -> Vec<(String, (u64, u64))> {
    let mut level = vec![root.to_path_buf()];
    for _ in 0..depth {
        level = level
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|rd| rd.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
    }
    level
        .into_iter()
        .filter_map(|d| {
            let name = d.file_name()?.to_string_lossy().into_owned();
            let used = cache.usage(&d, || crate::util::disk_usage(&d));
            Some((name, used))
        })
        .collect()
}
