//! Node status: the v1 Node (conditions, capacity, allocatable, nodeInfo, images, addresses),
//! recomputed periodically and "reported" (a status file plus a counter) when it changes
//! meaningfully or the report period passed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec, NodeStatus as V1NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::agent::AgentContext;
use crate::agent::cluster::Cluster;
use crate::agent::cluster::events::EventType;
use crate::agent::config::{AgentConfig, parse_taint};
use crate::agent::eviction;
use crate::agent::eviction::policy as eviction_policy;
use crate::agent::eviction::signals as eviction_signals;
use crate::agent::pods::status;
use crate::agent::runtime::resources::is_extended_resource;

/// Who this node is.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    /// Node name (lower-case host name unless configured).
    pub name: String,
    /// Host name.
    pub hostname: String,
    /// The address other machines reach this node at (the source address of the default route).
    pub internal_ip: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
}

/// The machine's host name.
fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// The node's name: `configured`, else the host name, lower-cased.
pub fn node_name(configured: Option<&str>) -> String {
    configured
        .map(str::to_string)
        .unwrap_or_else(|| hostname().to_lowercase())
}

impl NodeIdentity {
    /// Looks the node up on this machine (`ip` overrides the default route's address).
    pub fn detect(name: Option<&str>, ip: Option<&str>) -> Self {
        Self {
            name: node_name(name),
            hostname: hostname(),
            internal_ip: ip
                .map(str::to_string)
                .or_else(internal_ip)
                .unwrap_or_default(),
            memory_bytes: crate::agent::runtime::resources::proc_meminfo_bytes("MemTotal")
                .unwrap_or(0),
        }
    }
}

/// The source address the kernel would use for the default route (no packet is sent).
fn internal_ip() -> Option<String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then(|| ip.to_string())
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_else(|| "Linux".into())
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[derive(Default)]
struct Inner {
    node: Option<Node>,
    last_key: String,
    last_report: Option<Instant>,
    reports: u64,
    computed: u64,
    transitions: HashMap<String, (String, Time)>,
    /// The Ready status last sent to the API server (for NodeReady / NodeNotReady events).
    sent_ready: Option<String>,
    /// The Node as the API server has it (from the node watch).
    api_node: Option<Node>,
}

/// Counters of the node status loop.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportCounters {
    /// Times the status was computed.
    pub computed: u64,
    /// Times it was reported (changed, or the report period passed).
    pub reports: u64,
    /// Where the reported status is written.
    pub status_file: PathBuf,
    /// Lease renewals (every leaseDuration/4).
    pub heartbeats: u64,
    /// Where the lease is written.
    pub lease_file: PathBuf,
    /// The eviction manager's latest signals, thresholds, conditions and evictions.
    pub eviction: eviction::EvictionReport,
}

/// The node status loop and its latest result.
pub struct NodeStatus {
    ctx: Arc<AgentContext>,
    update: Duration,
    report: Duration,
    max_images: i64,
    disk: PathBuf,
    status_file: PathBuf,
    lease_file: PathBuf,
    lease: Duration,
    heartbeats: Arc<std::sync::atomic::AtomicU64>,
    /// The API server the status goes to (none: the status file).
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    port: AtomicU16,
    inner: Mutex<Inner>,
}

impl NodeStatus {
    /// A status loop (not started).
    pub fn new(
        ctx: Arc<AgentContext>,
        cfg: &AgentConfig,
        state_dir: &Path,
        root: &Path,
    ) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            update: Duration::from_secs_f64(cfg.node_status_update_secs),
            report: Duration::from_secs_f64(cfg.node_status_report_secs),
            max_images: cfg.node_status_max_images,
            disk: root.to_path_buf(),
            status_file: state_dir.join("agent/node-status.json"),
            lease_file: state_dir.join("agent/node-lease.json"),
            lease: Duration::from_secs_f64(cfg.node_lease_duration_secs),
            heartbeats: Default::default(),
            cluster: std::sync::OnceLock::new(),
            port: AtomicU16::new(0),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Sends the status to the API server from now on (the Node is registered).
    pub fn attach(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
        // What was computed before went to the status file only: the next computation is sent
        // whether or not it changed since (a node restarted with nothing new to report would
        // otherwise stay as the API server last had it, NodeStatusUnknown after a reboot, until
        // the report period passed).
        if let Ok(mut i) = self.inner.lock() {
            i.last_key.clear();
        }
        if let Some(ev) = &self.ctx.events {
            ev.node(EventType::Normal, "Starting", "Starting kubelet.".into());
        }
    }

    /// The lease renewal counter (renewals to the API server count there too).
    pub fn heartbeat_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.heartbeats.clone()
    }

    /// The status endpoint's port (the node's daemonEndpoints).
    pub fn set_port(&self, port: u16) {
        self.port.store(port, Ordering::Relaxed);
    }

    /// The latest Node.
    pub fn current(&self) -> Option<Node> {
        self.inner.lock().ok().and_then(|i| i.node.clone())
    }

    /// Records the Node as the API server has it now (None: it has none).
    pub fn set_api_node(&self, node: Option<Node>) {
        if let Ok(mut i) = self.inner.lock() {
            i.api_node = node;
        }
    }

    /// The Node as the API server has it, when the node watch has read it.
    pub fn api_node(&self) -> Option<Node> {
        self.inner.lock().ok().and_then(|i| i.api_node.clone())
    }

    /// The loop's counters.
    pub fn counters(&self) -> ReportCounters {
        let (computed, reports) = self
            .inner
            .lock()
            .map(|i| (i.computed, i.reports))
            .unwrap_or_default();
        ReportCounters {
            computed,
            reports,
            status_file: self.status_file.clone(),
            heartbeats: self.heartbeats.load(Ordering::Relaxed),
            lease_file: self.lease_file.clone(),
            eviction: eviction::report(&self.ctx),
        }
    }

    /// Computes the status every update period, forever, and at once when pods are asked to
    /// end (a node shutdown turns the node NotReady before its pods end) or a device plugin's
    /// devices change.
    pub async fn run(self: Arc<Self>) {
        let mut devices = self.ctx.devices.subscribe();
        loop {
            let node = self.compute().await;
            self.record(node).await;
            tokio::select! {
                _ = tokio::time::sleep(self.update) => {}
                _ = self.ctx.terminations.changed() => {}
                _ = devices.changed() => {}
            }
        }
    }

    /// Renews the node's lease every quarter of its duration, forever (a coordination.k8s.io
    /// Lease written under the state dir: there is no API server to send it to).
    pub async fn heartbeat(self: Arc<Self>) {
        let period = self.lease / 4;
        let mut failures = 0u32;
        loop {
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.ctx.node.name, "namespace": "kube-node-lease"},
                "spec": {
                    "holderIdentity": self.ctx.node.name,
                    "leaseDurationSeconds": self.lease.as_secs(),
                    "renewTime": status::now(),
                }
            });
            let file = self.lease_file.clone();
            let bytes = serde_json::to_vec_pretty(&lease).unwrap_or_default();
            let written = match tokio::task::spawn_blocking(move || {
                crate::util::write_atomic(&file, &bytes, 0o644)
            })
            .await
            {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match written {
                Ok(()) => {
                    self.heartbeats.fetch_add(1, Ordering::Relaxed);
                    failures = 0;
                    tokio::time::sleep(period).await;
                }
                Err(e) => {
                    failures += 1;
                    let retry = crate::agent::cluster::retry_delay(failures);
                    tracing::warn!(error = %e, retry_ms = retry.as_millis() as u64, "renewing the node lease failed");
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }

    async fn record(&self, mut node: Node) {
        let stale = match self.api_node() {
            Some(api) => adopt_extended_resources(&mut node, &api),
            None => Vec::new(),
        };
        let key = format!("{}{stale:?}", meaningful(&node));
        let due = {
            let Ok(mut i) = self.inner.lock() else { return };
            i.computed += 1;
            i.node = Some(node.clone());
            let due = i.last_key != key || i.last_report.is_none_or(|t| t.elapsed() >= self.report);
            if due {
                i.last_key = key;
                i.last_report = Some(Instant::now());
                i.reports += 1;
            }
            due
        };
        if due && let Some(cluster) = self.cluster.get() {
            if let Err(e) = send_status(cluster, &node, &stale).await {
                cluster.log_failure("patch the node status", &e);
                // Reported on the next computation instead.
                if let Ok(mut i) = self.inner.lock() {
                    i.last_key.clear();
                }
            } else {
                tracing::debug!("node status sent to the API server");
                self.ready_event(&node);
            }
        } else if due {
            let file = self.status_file.clone();
            let bytes = serde_json::to_vec_pretty(&node).unwrap_or_default();
            let res = tokio::task::spawn_blocking(move || {
                crate::util::write_atomic(&file, &bytes, 0o644)
            })
            .await;
            if let Ok(Err(e)) = res {
                tracing::warn!(error = %e, "writing node status file");
            }
            tracing::debug!("node status reported");
        }
    }

    fn condition(&self, kind: &str, status: bool, reason: &str, message: &str) -> NodeCondition {
        let now = status::now();
        let s = if status { "True" } else { "False" }.to_string();
        let transition = match self.inner.lock() {
            Ok(mut i) => {
                let e = i
                    .transitions
                    .entry(kind.to_string())
                    .or_insert((s.clone(), now.clone()));
                if e.0 != s {
                    *e = (s.clone(), now.clone());
                }
                e.1.clone()
            }
            Err(_) => now.clone(),
        };
        NodeCondition {
            type_: kind.to_string(),
            status: s,
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_heartbeat_time: Some(now),
            last_transition_time: Some(transition),
        }
    }

    /// Builds the Node now.
    pub async fn compute(&self) -> Node {
        let id = &self.ctx.node;
        let mut rt = self.ctx.client.runtime();
        let version = rt
            .version(cri::VersionRequest::default())
            .await
            .map(|v| v.into_inner())
            .unwrap_or_default();
        let runtime_status = rt
            .status(cri::StatusRequest { verbose: false })
            .await
            .ok()
            .and_then(|s| s.into_inner().status);
        let cond = |name: &str| {
            runtime_status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.r#type == name))
                .cloned()
        };
        let not_ready: Vec<String> = ["RuntimeReady", "NetworkReady"]
            .into_iter()
            .filter_map(|n| match cond(n) {
                Some(c) if c.status => None,
                Some(c) => Some(format!(
                    "{n}=false reason:{} message:{}",
                    c.reason, c.message
                )),
                None => Some(format!("{n} unknown (CRI Status failed)")),
            })
            .collect();
        let pressure = &self.ctx.pressure;
        let memory_pressure = pressure.memory.load(Ordering::Relaxed);
        let disk_pressure = pressure.disk.load(Ordering::Relaxed);
        let pid_pressure = pressure.pid.load(Ordering::Relaxed);
        let conditions = vec![
            if memory_pressure {
                self.condition(
                    "MemoryPressure",
                    true,
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                )
            } else {
                self.condition(
                    "MemoryPressure",
                    false,
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                )
            },
            if disk_pressure {
                self.condition(
                    "DiskPressure",
                    true,
                    "KubeletHasDiskPressure",
                    "kubelet has disk pressure",
                )
            } else {
                self.condition(
                    "DiskPressure",
                    false,
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                )
            },
            if pid_pressure {
                self.condition(
                    "PIDPressure",
                    true,
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                )
            } else {
                self.condition(
                    "PIDPressure",
                    false,
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                )
            },
            if self.ctx.terminations.is_shutting_down() {
                self.condition("Ready", false, "KubeletNotReady", "node is shutting down")
            } else if not_ready.is_empty() {
                self.condition(
                    "Ready",
                    true,
                    "KubeletReady",
                    "kubelet is posting ready status",
                )
            } else {
                self.condition(
                    "Ready",
                    false,
                    "KubeletNotReady",
                    &format!("container runtime not ready: {}", not_ready.join(", ")),
                )
            },
        ];
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let disk_total = self.nodefs_capacity();
        let (mut capacity, mut allocatable) = capacity_and_allocatable(
            &Capacity {
                cpus: cpus as u64,
                memory: id.memory_bytes,
                ephemeral_storage: disk_total,
            },
            &self.ctx.config,
        );
        // Device plugins' resources: every device as capacity, the healthy ones allocatable.
        for (resource, (devices, healthy)) in self.ctx.devices.resources() {
            capacity.insert(resource.clone(), Quantity(devices.to_string()));
            allocatable.insert(resource, Quantity(healthy.to_string()));
        }
        let images = self.images().await;
        let mut addresses = Vec::new();
        if !id.internal_ip.is_empty() {
            addresses.push(NodeAddress {
                type_: "InternalIP".into(),
                address: id.internal_ip.clone(),
            });
        }
        addresses.push(NodeAddress {
            type_: "Hostname".into(),
            address: id.hostname.clone(),
        });
        let uname = rustix::system::uname();
        let mut labels = self.ctx.config.node_labels.clone();
        labels.insert("kubernetes.io/hostname".to_string(), id.name.clone());
        labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
        labels.insert("kubernetes.io/arch".to_string(), arch().to_string());
        labels.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
        labels.insert("beta.kubernetes.io/arch".to_string(), arch().to_string());
        let taints: Vec<Taint> = self
            .ctx
            .config
            .register_with_taints
            .iter()
            .filter_map(|t| parse_taint(t).ok())
            .collect();
        Node {
            metadata: ObjectMeta {
                name: Some(id.name.clone()),
                labels: Some(labels),
                annotations: Some(
                    [(
                        "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: (!taints.is_empty()).then(|| NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: Some(V1NodeStatus {
                conditions: Some(conditions),
                capacity: Some(capacity),
                allocatable: Some(allocatable),
                addresses: Some(addresses),
                daemon_endpoints: Some(NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint {
                        port: i32::from(self.port.load(Ordering::Relaxed)),
                    }),
                }),
                images: Some(images),
                node_info: Some(NodeSystemInfo {
                    architecture: arch().to_string(),
                    boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
                    machine_id: read_trimmed("/etc/machine-id"),
                    system_uuid: system_uuid(),
                    kernel_version: uname.release().to_string_lossy().into_owned(),
                    os_image: os_image(),
                    operating_system: "linux".into(),
                    container_runtime_version: format!(
                        "{}://{}",
                        version.runtime_name, version.runtime_version
                    ),
                    kubelet_version: crate::agent::kubelet_version(),
                    kube_proxy_version: String::new(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    /// Size of nodefs (the filesystem of the pods' directories and logs, as the eviction
    /// manager reads it), or of the root dir when neither can be read.
    fn nodefs_capacity(&self) -> u64 {
        let paths = [self.ctx.pods_dir.clone(), self.ctx.pod_log_dir.clone()];
        eviction_signals::nodefs(&paths)
            .or_else(|| eviction_signals::fs_stats(&self.disk))
            .map_or(0, |f| f.bytes.capacity)
    }

    /// The largest images first, at most `max_images` (-1: all).
    async fn images(&self) -> Vec<ContainerImage> {
        if self.max_images == 0 {
            return Vec::new();
        }
        let mut list = self
            .ctx
            .client
            .images()
            .list_images(cri::ListImagesRequest { filter: None })
            .await
            .map(|r| r.into_inner().images)
            .unwrap_or_default();
        list.sort_by_key(|i| std::cmp::Reverse(i.size));
        if self.max_images > 0 {
            list.truncate(self.max_images as usize);
        }
        list.into_iter()
            .map(|i| ContainerImage {
                names: Some(i.repo_digests.into_iter().chain(i.repo_tags).collect()),
                size_bytes: Some(i.size as i64),
            })
            .collect()
    }
}

/// What the node has, before reservations.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// CPUs.
    pub cpus: u64,
    /// Memory in bytes.
    pub memory: u64,
    /// nodefs size in bytes.
    pub ephemeral_storage: u64,
}

/// A reservation of `resource` in base units (cores for cpu), system plus kube.
fn reserved(cfg: &AgentConfig, resource: &str) -> f64 {
    [&cfg.system_reserved, &cfg.kube_reserved]
        .iter()
        .filter_map(|m| m.get(resource))
        .filter_map(|q| crate::agent::runtime::resources::parse_quantity(q))
        .sum()
}

/// The hard eviction threshold of `signal` as an amount of `capacity` (0 when none).
fn hard_threshold(cfg: &AgentConfig, signal: &str, capacity: u64) -> u64 {
    cfg.eviction_hard
        .get(signal)
        .and_then(|v| crate::agent::config::threshold_value(v).ok())
        .map_or(0, |v| v.amount(capacity))
}

/// The node's capacity and allocatable, as the kubelet: allocatable = capacity −
/// system-reserved − kube-reserved − the hard eviction threshold (memory.available for memory,
/// nodefs.available for ephemeral-storage), never below zero; pods and hugepages as capacity.
pub fn capacity_and_allocatable(
    c: &Capacity,
    cfg: &AgentConfig,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let q = |s: String| Quantity(s);
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), q(c.cpus.to_string()));
    capacity.insert("memory".to_string(), q(format!("{}Ki", c.memory / 1024)));
    capacity.insert(
        "ephemeral-storage".to_string(),
        q(format!("{}Ki", c.ephemeral_storage / 1024)),
    );
    capacity.insert("pods".to_string(), q("110".into()));
    capacity.insert("hugepages-2Mi".to_string(), q("0".into()));
    capacity.insert("hugepages-1Gi".to_string(), q("0".into()));
    let mut allocatable = capacity.clone();
    let millicpu =
        (c.cpus as f64 * 1000.0 - (reserved(cfg, "cpu") * 1000.0).round()).max(0.0) as u64;
    let cpu = if millicpu.is_multiple_of(1000) {
        (millicpu / 1000).to_string()
    } else {
        format!("{millicpu}m")
    };
    allocatable.insert("cpu".to_string(), q(cpu));
    let left = |total: u64, resource: &str, signal: &str| {
        let minus = reserved(cfg, resource).max(0.0) as u64 + hard_threshold(cfg, signal, total);
        eviction_policy::format_bytes(total.saturating_sub(minus))
    };
    allocatable.insert(
        "memory".to_string(),
        q(left(c.memory, "memory", "memory.available")),
    );
    allocatable.insert(
        "ephemeral-storage".to_string(),
        q(left(
            c.ephemeral_storage,
            "ephemeral-storage",
            "nodefs.available",
        )),
    );
    (capacity, allocatable)
}

/// The node without heartbeat times: what must change for a report.
fn meaningful(node: &Node) -> String {
    let mut n = node.clone();
    if let Some(conds) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        for c in conds {
            c.last_heartbeat_time = None;
        }
    }
    serde_json::to_string(&n).unwrap_or_default()
}

impl NodeStatus {
    /// NodeReady or NodeNotReady when the Ready status sent changed.
    fn ready_event(&self, node: &Node) {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
            .unwrap_or_default();
        let changed = match self.inner.lock() {
            Ok(mut i) => {
                let changed = i.sent_ready.as_deref() != Some(ready.as_str());
                i.sent_ready = Some(ready.clone());
                changed
            }
            Err(_) => false,
        };
        if let (true, Some(ev)) = (changed, &self.ctx.events) {
            let (kind, reason) = if ready == "True" {
                (EventType::Normal, "NodeReady")
            } else {
                (EventType::Normal, "NodeNotReady")
            };
            ev.node(
                kind,
                reason,
                format!("Node {} status is now: {reason}", self.ctx.node.name),
            );
        }
    }
}

/// Tries sent of one node status update (the kubelet's nodeStatusUpdateRetry).
const STATUS_TRIES: u32 = 5;

/// Keeps the extended resources others put in the API's Node capacity (a device plugin's, an
/// admin's): in the status sent, as capacity and as allocatable (the kubelet makes all of a
/// node's capacity allocatable, less its reservations, which extended resources have none
/// of). Returns the extended resources allocatable on the API's Node that its capacity no
/// longer has: the status sent removes them.
fn adopt_extended_resources(node: &mut Node, api: &Node) -> Vec<String> {
    let api_status = api.status.as_ref();
    let api_capacity = api_status.and_then(|s| s.capacity.as_ref());
    let api_allocatable = api_status.and_then(|s| s.allocatable.as_ref());
    let status = node.status.get_or_insert_with(Default::default);
    let capacity = status.capacity.get_or_insert_with(Default::default);
    let allocatable = status.allocatable.get_or_insert_with(Default::default);
    for (name, q) in api_capacity.into_iter().flatten() {
        if is_extended_resource(name) && !capacity.contains_key(name) {
            capacity.insert(name.clone(), q.clone());
            allocatable.insert(name.clone(), q.clone());
        }
    }
    api_allocatable
        .into_iter()
        .flatten()
        .map(|(name, _)| name)
        .filter(|name| is_extended_resource(name) && !capacity.contains_key(*name))
        .cloned()
        .collect()
}

/// Sends the node's status as a strategic-merge PATCH of `nodes/<name>/status`, removing the
/// allocatable resources named in `stale`.
async fn send_status(cluster: &Cluster, node: &Node, stale: &[String]) -> Result<(), kube::Error> {
    let api: kube::Api<Node> = kube::Api::all(cluster.client());
    let mut patch = serde_json::json!({ "status": node.status });
    if let Some(allocatable) = patch
        .pointer_mut("/status/allocatable")
        .and_then(|a| a.as_object_mut())
    {
        for name in stale {
            allocatable.insert(name.clone(), serde_json::Value::Null);
        }
    }
    let params = kube::api::PatchParams::default();
    let mut last = None;
    for _ in 0..STATUS_TRIES {
        match api
            .patch_status(
                &cluster.node_name,
                &params,
                &kube::api::Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The machine's UUID as the kubelet (cAdvisor) reads it: the DMI product UUID, else the
/// device tree's system id or VM UUID, else the machine id.
fn system_uuid() -> String {
    [
        "/sys/class/dmi/id/product_uuid",
        "/proc/device-tree/system-id",
        "/proc/device-tree/vm,uuid",
        "/etc/machine-id",
    ]
    .iter()
    .map(|p| read_trimmed(p).trim_end_matches('\0').to_string())
    .find(|s| !s.is_empty())
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    fn with_resources(capacity: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        Node {
            status: Some(V1NodeStatus {
                capacity: Some(quantities(capacity)),
                allocatable: Some(quantities(allocatable)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn others_extended_resources_become_allocatable_and_removed_ones_go() {
        let mut ours = with_resources(&[("cpu", "2")], &[("cpu", "1500m")]);
        let api = with_resources(
            &[
                ("cpu", "4"),
                ("example.com/dongle", "5"),
                ("kubernetes.io/own", "1"),
            ],
            &[
                ("cpu", "4"),
                ("example.com/dongle", "5"),
                ("gone.io/x", "1"),
            ],
        );
        let stale = adopt_extended_resources(&mut ours, &api);
        let status = ours.status.expect("status");
        // Ours stand; the extended one is kept and allocatable; a kubernetes.io one is not.
        assert_eq!(
            status.capacity,
            Some(quantities(&[("cpu", "2"), ("example.com/dongle", "5")]))
        );
        assert_eq!(
            status.allocatable,
            Some(quantities(&[("cpu", "1500m"), ("example.com/dongle", "5")]))
        );
        assert_eq!(stale, ["gone.io/x"]);
        assert!(!is_extended_resource("requests.example.com/x"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("node.kubernetes.io/x"));
    }

    #[test]
    fn allocatable_is_capacity_minus_reserves_and_hard_eviction() {
        let c = Capacity {
            cpus: 4,
            memory: 8 << 30,
            ephemeral_storage: 100 << 30,
        };
        let (cap, alloc) = capacity_and_allocatable(&c, &AgentConfig::default());
        assert_eq!(cap["memory"].0, "8388608Ki");
        assert_eq!(alloc["cpu"].0, "4");
        // Default hard thresholds: memory.available 100Mi, nodefs.available 10%.
        assert_eq!(alloc["memory"].0, format!("{}Mi", 8 * 1024 - 100));
        assert_eq!(
            alloc["ephemeral-storage"].0,
            eviction_policy::format_bytes(90 << 30)
        );
        let mut cfg = AgentConfig::default();
        cfg.system_reserved.insert("memory".into(), "1Gi".into());
        cfg.system_reserved.insert("cpu".into(), "250m".into());
        cfg.kube_reserved.insert("cpu".into(), "500m".into());
        cfg.kube_reserved
            .insert("ephemeral-storage".into(), "10Gi".into());
        cfg.eviction_hard
            .insert("memory.available".into(), "1Gi".into());
        let (_, alloc) = capacity_and_allocatable(&c, &cfg);
        assert_eq!(alloc["cpu"].0, "3250m");
        assert_eq!(alloc["memory"].0, "6Gi");
        assert_eq!(alloc["ephemeral-storage"].0, "80Gi");
        assert_eq!(alloc["pods"].0, "110");
        cfg.eviction_hard
            .insert("memory.available".into(), "1000Gi".into());
        let (_, alloc) = capacity_and_allocatable(&c, &cfg);
        assert_eq!(alloc["memory"].0, "0");
    }
}
