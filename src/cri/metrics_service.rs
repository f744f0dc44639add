//! CRI ListMetricDescriptors and ListPodSandboxMetrics: cAdvisor's container metrics (names,
//! types and labels as the kubelet's cAdvisor endpoint shows them), read from the same cgroup
//! files as the stats calls and never from a shim.
//!
//! Every series carries the labels `pod, namespace, container, id, image` (the kubelet turns
//! them into Prometheus labels), followed by the metric's own (`interface`, `device`, ...).
//! Pod-level series (network) leave `container` and `image` empty and carry the sandbox id.
//! Values are unsigned integers: seconds are whole seconds, as the other runtimes report them.

use std::collections::HashMap;

use berth_snapshotter::Snapshotter;
use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;
use super::stats_service::{self, StatsCollector};
use crate::metrics::cgroup_metrics::{self, CgroupMetrics, ProcessCounts};
use crate::metrics::net_dev;
use crate::runtime::cgroups::Layout;
use crate::runtime::container::ContainerRecord;
use crate::runtime::sandbox::{SandboxRecord, SandboxState};

/// The labels every series starts with.
const BASE_LABELS: [&str; 5] = ["pod", "namespace", "container", "id", "image"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// Which layouts report a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Any,
    /// Pressure stall information exists per cgroup on cgroup v2 only.
    V2,
}

/// One metric as declared.
struct Def {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Labels after the base ones.
    extra: &'static [&'static str],
    only: Only,
}

const fn def(name: &'static str, help: &'static str, kind: Kind) -> Def {
    Def {
        name,
        help,
        kind,
        extra: &[],
        only: Only::Any,
    }
}

const fn labelled(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    extra: &'static [&'static str],
) -> Def {
    Def {
        name,
        help,
        kind,
        extra,
        only: Only::Any,
    }
}

const fn v2(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        help,
        kind: Kind::Counter,
        extra: &[],
        only: Only::V2,
    }
}

use Kind::{Counter, Gauge};

/// Every metric Berth reports, in the order they are listed.
const DEFS: &[Def] = &[
    def(
        "container_cpu_usage_seconds_total",
        "Cumulative CPU time consumed, in seconds.",
        Counter,
    ),
    def(
        "container_cpu_user_seconds_total",
        "Cumulative user CPU time consumed, in seconds.",
        Counter,
    ),
    def(
        "container_cpu_system_seconds_total",
        "Cumulative system CPU time consumed, in seconds.",
        Counter,
    ),
    def(
        "container_cpu_cfs_periods_total",
        "Number of elapsed CFS enforcement period intervals.",
        Counter,
    ),
    def(
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled CFS period intervals.",
        Counter,
    ),
    def(
        "container_cpu_cfs_throttled_seconds_total",
        "Total time the container was throttled, in seconds.",
        Counter,
    ),
    def(
        "container_memory_usage_bytes",
        "Current memory usage, page cache included, in bytes.",
        Gauge,
    ),
    def(
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded, in bytes.",
        Gauge,
    ),
    def(
        "container_memory_working_set_bytes",
        "Current working set (usage minus inactive file pages), in bytes.",
        Gauge,
    ),
    def(
        "container_memory_rss",
        "Size of anonymous memory (RSS), in bytes.",
        Gauge,
    ),
    def(
        "container_memory_cache",
        "Size of the page cache, in bytes.",
        Gauge,
    ),
    def(
        "container_memory_mapped_file",
        "Size of memory-mapped files, in bytes.",
        Gauge,
    ),
    def("container_memory_swap", "Swap usage, in bytes.", Gauge),
    def(
        "container_memory_kernel_usage",
        "Kernel memory charged to the container, in bytes.",
        Gauge,
    ),
    def(
        "container_memory_failcnt",
        "Number of times memory usage hit the limit (cgroup v1).",
        Counter,
    ),
    labelled(
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures (page faults).",
        Counter,
        &["failure_type", "scope"],
    ),
    def(
        "container_oom_events_total",
        "Count of out-of-memory kills in the container.",
        Counter,
    ),
    labelled(
        "container_fs_usage_bytes",
        "Bytes used by the container's writable layer.",
        Gauge,
        &["device"],
    ),
    labelled(
        "container_fs_limit_bytes",
        "Size of the filesystem holding the container's writable layer, in bytes.",
        Gauge,
        &["device"],
    ),
    labelled(
        "container_fs_inodes_total",
        "Inodes of the filesystem holding the container's writable layer.",
        Gauge,
        &["device"],
    ),
    labelled(
        "container_fs_inodes_free",
        "Free inodes of the filesystem holding the container's writable layer.",
        Gauge,
        &["device"],
    ),
    labelled(
        "container_fs_reads_bytes_total",
        "Cumulative bytes read from a block device.",
        Counter,
        &["device"],
    ),
    labelled(
        "container_fs_writes_bytes_total",
        "Cumulative bytes written to a block device.",
        Counter,
        &["device"],
    ),
    labelled(
        "container_fs_reads_total",
        "Cumulative count of reads completed on a block device.",
        Counter,
        &["device"],
    ),
    labelled(
        "container_fs_writes_total",
        "Cumulative count of writes completed on a block device.",
        Counter,
        &["device"],
    ),
    labelled(
        "container_blkio_device_usage_total",
        "Block I/O bytes by device and operation.",
        Counter,
        &["device", "major", "minor", "operation"],
    ),
    labelled(
        "container_network_receive_bytes_total",
        "Cumulative bytes received.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_receive_packets_total",
        "Cumulative packets received.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_receive_packets_dropped_total",
        "Cumulative packets dropped while receiving.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_receive_errors_total",
        "Cumulative errors while receiving.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_transmit_bytes_total",
        "Cumulative bytes transmitted.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_transmit_packets_total",
        "Cumulative packets transmitted.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_transmit_packets_dropped_total",
        "Cumulative packets dropped while transmitting.",
        Counter,
        &["interface"],
    ),
    labelled(
        "container_network_transmit_errors_total",
        "Cumulative errors while transmitting.",
        Counter,
        &["interface"],
    ),
    def(
        "container_processes",
        "Number of processes running in the container.",
        Gauge,
    ),
    def(
        "container_threads",
        "Number of threads (tasks) running in the container.",
        Gauge,
    ),
    def(
        "container_threads_max",
        "Maximum number of tasks allowed (0: no limit).",
        Gauge,
    ),
    def(
        "container_file_descriptors",
        "Number of open file descriptors of the container's processes.",
        Gauge,
    ),
    def(
        "container_sockets",
        "Number of open sockets of the container's processes.",
        Gauge,
    ),
    labelled(
        "container_ulimits_soft",
        "Soft ulimit of the container's first process (max_open_files).",
        Gauge,
        &["ulimit"],
    ),
    def(
        "container_last_seen",
        "Last time the container was seen by the runtime, in Unix seconds.",
        Gauge,
    ),
    def(
        "container_start_time_seconds",
        "Start time of the container, in Unix seconds.",
        Gauge,
    ),
    def(
        "container_spec_cpu_period",
        "CPU CFS period of the container, in microseconds.",
        Gauge,
    ),
    def(
        "container_spec_cpu_quota",
        "CPU CFS quota of the container, in microseconds (0: no quota).",
        Gauge,
    ),
    def(
        "container_spec_cpu_shares",
        "CPU shares of the container.",
        Gauge,
    ),
    def(
        "container_spec_memory_limit_bytes",
        "Memory limit of the container, in bytes (0: no limit).",
        Gauge,
    ),
    def(
        "container_spec_memory_reservation_limit_bytes",
        "Memory reservation (soft limit) of the container, in bytes (0: none).",
        Gauge,
    ),
    def(
        "container_spec_memory_swap_limit_bytes",
        "Memory and swap limit of the container, in bytes (0: no limit).",
        Gauge,
    ),
    v2(
        "container_pressure_cpu_waiting_seconds_total",
        "Total time tasks waited for the CPU, in seconds.",
    ),
    v2(
        "container_pressure_cpu_stalled_seconds_total",
        "Total time all tasks stalled on the CPU, in seconds.",
    ),
    v2(
        "container_pressure_memory_waiting_seconds_total",
        "Total time tasks waited for memory, in seconds.",
    ),
    v2(
        "container_pressure_memory_stalled_seconds_total",
        "Total time all tasks stalled on memory, in seconds.",
    ),
    v2(
        "container_pressure_io_waiting_seconds_total",
        "Total time tasks waited for I/O, in seconds.",
    ),
    v2(
        "container_pressure_io_stalled_seconds_total",
        "Total time all tasks stalled on I/O, in seconds.",
    ),
];

fn reported(def: &Def, layout: &Layout) -> bool {
    def.only == Only::Any || layout.is_v2()
}

/// ListMetricDescriptors: every metric this host's layout reports.
pub fn descriptors(layout: &Layout) -> Vec<cri::MetricDescriptor> {
    DEFS.iter()
        .filter(|d| reported(d, layout))
        .map(|d| cri::MetricDescriptor {
            name: d.name.to_string(),
            help: d.help.to_string(),
            label_keys: BASE_LABELS
                .iter()
                .chain(d.extra)
                .map(|k| k.to_string())
                .collect(),
        })
        .collect()
}

/// The filesystem holding writable layers, measured once per call.
#[derive(Debug, Clone, Default)]
pub struct LayerFs {
    /// `major:minor` of its device.
    pub device: String,
    pub size_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

impl LayerFs {
    /// statvfs and stat of the snapshotter's root.
    pub fn measure(snapshots: &Snapshotter) -> Option<Self> {
        let root = snapshots.root();
        let st = rustix::fs::statvfs(root).ok()?;
        let dev = rustix::fs::stat(root).ok()?.st_dev;
        Some(Self {
            device: format!(
                "{}:{}",
                rustix::fs::major(dev as _),
                rustix::fs::minor(dev as _)
            ),
            size_bytes: st.f_blocks.saturating_mul(st.f_frsize),
            inodes: st.f_files,
            inodes_free: st.f_ffree,
        })
    }
}

/// Collects the metrics of one series set at a time.
struct Series<'a> {
    out: Vec<cri::Metric>,
    base: [&'a str; 5],
    now: i64,
}

/// The declared kind of each metric, by name.
fn kind_of(name: &str) -> Kind {
    static KINDS: std::sync::OnceLock<std::collections::HashMap<&'static str, Kind>> =
        std::sync::OnceLock::new();
    KINDS
        .get_or_init(|| DEFS.iter().map(|d| (d.name, d.kind)).collect())
        .get(name)
        .copied()
        .unwrap_or(Gauge)
}

impl Series<'_> {
    /// One series of `name` with the metric's own labels `extra`; its type is the declared one.
    fn push(&mut self, name: &str, extra: &[&str], value: u64) {
        self.out.push(cri::Metric {
            name: name.to_string(),
            timestamp: self.now,
            metric_type: match kind_of(name) {
                Counter => cri::MetricType::Counter,
                Gauge => cri::MetricType::Gauge,
            } as i32,
            label_values: self
                .base
                .iter()
                .chain(extra)
                .map(|v| v.to_string())
                .collect(),
            value: Some(cri::UInt64Value { value }),
        });
    }

    /// One series of `name` with the base labels only.
    fn put(&mut self, name: &str, value: u64) {
        self.push(name, &[], value);
    }
}

const NS_PER_S: u64 = 1_000_000_000;

/// The metrics of one pod: its network at pod level, each live container's cgroup; containers
/// whose cgroup is gone are skipped.
pub fn pod_metrics(
    stats: &StatsCollector,
    sandbox: &SandboxRecord,
    containers: &[ContainerRecord],
    snapshots: &Snapshotter,
    layer_fs: Option<&LayerFs>,
) -> cri::PodSandboxMetrics {
    let now = crate::util::unix_nanos_now();
    let meta = sandbox.config_ref().metadata.clone().unwrap_or_default();
    let mut container_metrics = Vec::new();
    let mut pod_pid = None;
    for c in containers.iter().filter(|c| c.is_active()) {
        let Some(cgroup) = stats.container_cgroup(c) else {
            continue;
        };
        let Some(metrics) = cgroup_metrics::read(stats.layout(), &cgroup) else {
            continue;
        };
        let pids = cgroup_metrics::pids(stats.layout(), &cgroup);
        if pod_pid.is_none() {
            pod_pid = pids.first().copied();
        }
        let counts = cgroup_metrics::process_counts(&pids);
        let layer = stats.writable_layer_usage(c, snapshots);
        let config = c.config_ref();
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or(&c.name);
        let image = config
            .image
            .as_ref()
            .map(|i| i.user_specified_image.as_str())
            .filter(|i| !i.is_empty())
            .unwrap_or(&c.image_ref);
        let mut series = Series {
            out: Vec::new(),
            base: [&meta.name, &meta.namespace, name, &c.id, image],
            now,
        };
        container_series(
            &mut series,
            &metrics,
            &ContainerFacts {
                processes: pids.len() as u64,
                counts: &counts,
                layer,
                layer_fs,
                started_at: c.started_at,
                now,
            },
            stats.layout(),
        );
        container_metrics.push(cri::ContainerMetrics {
            container_id: c.id.clone(),
            metrics: series.out,
        });
    }
    let mut pod = Series {
        out: Vec::new(),
        base: [&meta.name, &meta.namespace, "", &sandbox.id, ""],
        now,
    };
    if sandbox.net_ns.is_some()
        && let Some(interfaces) = pod_pid.and_then(net_dev::read)
    {
        network_series(&mut pod, &interfaces);
    }
    cri::PodSandboxMetrics {
        pod_sandbox_id: sandbox.id.clone(),
        metrics: pod.out,
        container_metrics,
    }
}

/// What a container's series need besides its cgroup.
struct ContainerFacts<'a> {
    processes: u64,
    counts: &'a ProcessCounts,
    /// Bytes and inodes of the writable layer.
    layer: Option<(u64, u64)>,
    layer_fs: Option<&'a LayerFs>,
    started_at: i64,
    now: i64,
}

fn container_series(s: &mut Series<'_>, m: &CgroupMetrics, f: &ContainerFacts<'_>, l: &Layout) {
    let cpu = m.cpu.clone().unwrap_or_default();
    s.put("container_cpu_usage_seconds_total", cpu.usage_ns / NS_PER_S);
    s.put("container_cpu_user_seconds_total", cpu.user_ns / NS_PER_S);
    s.put(
        "container_cpu_system_seconds_total",
        cpu.system_ns / NS_PER_S,
    );
    s.put("container_cpu_cfs_periods_total", cpu.periods);
    s.put(
        "container_cpu_cfs_throttled_periods_total",
        cpu.throttled_periods,
    );
    s.put(
        "container_cpu_cfs_throttled_seconds_total",
        cpu.throttled_ns / NS_PER_S,
    );
    let mem = m.memory.clone().unwrap_or_default();
    s.put("container_memory_usage_bytes", mem.usage);
    s.put("container_memory_max_usage_bytes", mem.max_usage);
    s.put("container_memory_working_set_bytes", mem.working_set);
    s.put("container_memory_rss", mem.rss);
    s.put("container_memory_cache", mem.cache);
    s.put("container_memory_mapped_file", mem.mapped_file);
    s.put("container_memory_swap", mem.swap);
    s.put("container_memory_kernel_usage", mem.kernel);
    s.put("container_memory_failcnt", mem.failcnt);
    for scope in ["container", "hierarchy"] {
        for (kind, value) in [("pgfault", mem.pgfault), ("pgmajfault", mem.pgmajfault)] {
            s.push("container_memory_failures_total", &[kind, scope], value);
        }
    }
    s.put("container_oom_events_total", mem.oom_kills);
    if let Some(fs) = f.layer_fs {
        let dev = [fs.device.as_str()];
        if let Some((bytes, _)) = f.layer {
            s.push("container_fs_usage_bytes", &dev, bytes);
        }
        s.push("container_fs_limit_bytes", &dev, fs.size_bytes);
        s.push("container_fs_inodes_total", &dev, fs.inodes);
        s.push("container_fs_inodes_free", &dev, fs.inodes_free);
    }
    for io in &m.io {
        let (major, minor) = (io.major.to_string(), io.minor.to_string());
        let device = format!("{major}:{minor}");
        let dev = [device.as_str()];
        s.push("container_fs_reads_bytes_total", &dev, io.read_bytes);
        s.push("container_fs_writes_bytes_total", &dev, io.write_bytes);
        s.push("container_fs_reads_total", &dev, io.reads);
        s.push("container_fs_writes_total", &dev, io.writes);
        for (op, value) in [("Read", io.read_bytes), ("Write", io.write_bytes)] {
            s.push(
                "container_blkio_device_usage_total",
                &[&device, &major, &minor, op],
                value,
            );
        }
    }
    s.put("container_processes", f.processes);
    s.put("container_threads", m.tasks.unwrap_or(f.processes));
    s.put("container_threads_max", m.limits.tasks);
    s.put("container_file_descriptors", f.counts.fds);
    s.put("container_sockets", f.counts.sockets);
    if let Some(n) = f.counts.max_open_files {
        s.push("container_ulimits_soft", &["max_open_files"], n);
    }
    s.put(
        "container_last_seen",
        u64::try_from(f.now).unwrap_or(0) / NS_PER_S,
    );
    if f.started_at > 0 {
        s.put(
            "container_start_time_seconds",
            u64::try_from(f.started_at).unwrap_or(0) / NS_PER_S,
        );
    }
    s.put("container_spec_cpu_period", m.limits.cpu_period_us);
    s.put("container_spec_cpu_quota", m.limits.cpu_quota_us);
    s.put("container_spec_cpu_shares", m.limits.cpu_shares);
    s.put("container_spec_memory_limit_bytes", m.limits.memory_bytes);
    s.put(
        "container_spec_memory_reservation_limit_bytes",
        m.limits.memory_reservation_bytes,
    );
    s.put(
        "container_spec_memory_swap_limit_bytes",
        m.limits.memory_swap_bytes,
    );
    if l.is_v2()
        && let Some([cpu, memory, io]) = &m.pressure
    {
        const US_PER_S: u64 = 1_000_000;
        for (what, p) in [("cpu", cpu), ("memory", memory), ("io", io)] {
            s.put(
                &format!("container_pressure_{what}_waiting_seconds_total"),
                p.some_us / US_PER_S,
            );
            s.put(
                &format!("container_pressure_{what}_stalled_seconds_total"),
                p.full_us / US_PER_S,
            );
        }
    }
}

fn network_series(s: &mut Series<'_>, interfaces: &[net_dev::InterfaceCounters]) {
    for i in interfaces {
        let name = [i.name.as_str()];
        for (metric, value) in [
            ("container_network_receive_bytes_total", i.rx_bytes),
            ("container_network_receive_packets_total", i.rx_packets),
            (
                "container_network_receive_packets_dropped_total",
                i.rx_dropped,
            ),
            ("container_network_receive_errors_total", i.rx_errors),
            ("container_network_transmit_bytes_total", i.tx_bytes),
            ("container_network_transmit_packets_total", i.tx_packets),
            (
                "container_network_transmit_packets_dropped_total",
                i.tx_dropped,
            ),
            ("container_network_transmit_errors_total", i.tx_errors),
        ] {
            s.push(metric, &name, value);
        }
    }
}

pub(super) async fn list_metric_descriptors(
    api: &RuntimeApi,
    _request: Request<cri::ListMetricDescriptorsRequest>,
) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
    Ok(Response::new(cri::ListMetricDescriptorsResponse {
        descriptors: descriptors(api.stats.layout()),
    }))
}

pub(super) async fn list_pod_sandbox_metrics(
    api: &RuntimeApi,
    _request: Request<cri::ListPodSandboxMetricsRequest>,
) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
    let sandboxes: Vec<SandboxRecord> = api
        .sandboxes
        .list()?
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .map(|s| SandboxRecord::clone(s))
        .collect();
    let containers = api.containers.stored()?;
    let stats = api.stats.clone();
    let snapshots = api.images.snapshotter();
    let pod_metrics = tokio::task::spawn_blocking(move || {
        let mut by_sandbox: HashMap<&str, Vec<ContainerRecord>> = HashMap::new();
        for c in containers.iter().filter(|c| c.is_active()) {
            by_sandbox
                .entry(c.sandbox_id.as_str())
                .or_default()
                .push(ContainerRecord::clone(c));
        }
        let layer_fs = LayerFs::measure(&snapshots);
        stats_service::spread_over_cores(&sandboxes, |s| {
            let mine = by_sandbox.get(s.id.as_str()).map_or(&[][..], Vec::as_slice);
            pod_metrics(&stats, s, mine, &snapshots, layer_fs.as_ref())
        })
    })
    .await
    .map_err(|e| Status::internal(format!("ListPodSandboxMetrics: {e}")))?;
    Ok(Response::new(cri::ListPodSandboxMetricsResponse {
        pod_metrics,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::cgroup_metrics::{CgroupLimits, CpuTimes, DeviceIo, MemoryDetail};

    #[test]
    fn descriptors_have_help_and_base_labels_and_follow_the_layout() {
        let v1 = descriptors(&Layout::V1(Vec::new()));
        let v2 = descriptors(&Layout::V2("/sys/fs/cgroup".into()));
        assert_eq!(v2.len(), v1.len() + 6);
        for d in &v2 {
            assert!(!d.help.is_empty(), "{}", d.name);
            assert_eq!(&d.label_keys[..5], &BASE_LABELS.map(String::from)[..]);
        }
        let failures = v1
            .iter()
            .find(|d| d.name == "container_memory_failures_total")
            .expect("declared");
        assert_eq!(&failures.label_keys[5..], ["failure_type", "scope"]);
    }

    /// Every series of a container matches its descriptor's label count and is declared.
    #[test]
    fn series_match_their_descriptors() {
        let layout = Layout::V2("/sys/fs/cgroup".into());
        let descs = descriptors(&layout);
        let metrics = CgroupMetrics {
            cpu: Some(CpuTimes {
                usage_ns: 2_500_000_000,
                ..Default::default()
            }),
            memory: Some(MemoryDetail {
                usage: 4096,
                ..Default::default()
            }),
            tasks: Some(3),
            io: vec![DeviceIo {
                major: 8,
                minor: 0,
                read_bytes: 1,
                ..Default::default()
            }],
            pressure: Some(Default::default()),
            limits: CgroupLimits {
                cpu_period_us: 100_000,
                ..Default::default()
            },
        };
        let counts = ProcessCounts {
            fds: 4,
            sockets: 1,
            max_open_files: Some(1024),
        };
        let fs = LayerFs {
            device: "254:0".into(),
            ..Default::default()
        };
        let mut s = Series {
            out: Vec::new(),
            base: ["p", "ns", "c", "id", "img"],
            now: 5 * NS_PER_S as i64,
        };
        container_series(
            &mut s,
            &metrics,
            &ContainerFacts {
                processes: 2,
                counts: &counts,
                layer: Some((10, 1)),
                layer_fs: Some(&fs),
                started_at: 3 * NS_PER_S as i64,
                now: 5 * NS_PER_S as i64,
            },
            &layout,
        );
        network_series(
            &mut s,
            &[net_dev::InterfaceCounters {
                name: "eth0".into(),
                ..Default::default()
            }],
        );
        for m in &s.out {
            let d = descs
                .iter()
                .find(|d| d.name == m.name)
                .unwrap_or_else(|| panic!("{} is not declared", m.name));
            assert_eq!(m.label_values.len(), d.label_keys.len(), "{}", m.name);
        }
        for d in &descs {
            assert!(
                s.out.iter().any(|m| m.name == d.name),
                "{} has no series",
                d.name
            );
        }
        let value = |name: &str| {
            s.out
                .iter()
                .find(|m| m.name == name)
                .and_then(|m| m.value.as_ref())
                .map(|v| v.value)
        };
        assert_eq!(value("container_cpu_usage_seconds_total"), Some(2));
        assert_eq!(value("container_threads"), Some(3));
        assert_eq!(value("container_processes"), Some(2));
        assert_eq!(value("container_start_time_seconds"), Some(3));
        assert_eq!(value("container_last_seen"), Some(5));
        assert_eq!(value("container_spec_cpu_period"), Some(100_000));
    }
}
