//! The `[agent]` section of berthd's configuration (the kubelet's defaults).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Settings of the embedded node agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Whether berthd runs the agent (`--no-agent` turns it off).
    pub enabled: bool,
    /// Directory of Pod manifests (YAML or JSON, several per file).
    pub manifest_dir: PathBuf,
    /// `HOST:PORT` of the read-only status endpoint (`/pods`, `/node`, `/healthz`), plain HTTP
    /// without authentication, as the kubelet's read-only port (10255). Empty (the default, as
    /// the kubelet's `readOnlyPort: 0` in kubeadm clusters): off; the same routes stay on the
    /// control socket.
    pub address: String,
    /// Root of the pods' log directories (`<root>/<namespace>_<name>_<uid>`).
    pub pod_log_dir: PathBuf,
    /// `HOST:PORT` of the node server (HTTPS: logs, exec, attach, port-forward, stats for the
    /// API server); its port goes into the Node's `daemonEndpoints`. Empty: off. It runs when
    /// clients can be authenticated: in a cluster, or with `client_ca_file`.
    pub server_address: String,
    /// `HOST:PORT` of the plain-HTTP `/healthz` endpoint that runs beside the node server
    /// (empty: off).
    pub healthz_address: String,
    /// The node server's certificate (PEM; with `tls_private_key_file`). None: a self-signed
    /// one for the node's names and addresses, kept in `cert_dir`.
    pub tls_cert_file: Option<PathBuf>,
    /// The node server's private key (PEM).
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that signs the client certificates the node server accepts (the API server's
    /// kubelet client certificate). None: clients authenticate with bearer tokens only.
    pub client_ca_file: Option<PathBuf>,
    /// Get the node server's certificate from the cluster (a `kubernetes.io/kubelet-serving`
    /// CSR, approved by the cluster's operator or approver) and renew it before it expires;
    /// the self-made one is served until the first is issued. Ignored with `tls_cert_file`.
    pub rotate_server_certificates: bool,
    /// Directory of the node's own certificates (default: `<root dir>/agent/pki`).
    pub cert_dir: Option<PathBuf>,
    /// Kubeconfig with a bootstrap token, used when `kubeconfig` does not exist yet: the node
    /// asks for its client certificate, writes `kubeconfig`, and renews the certificate later.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Milliseconds between rescans of the manifest directory.
    pub manifest_rescan_ms: u64,
    /// Milliseconds between two syncs of one pod with the runtime.
    pub sync_period_ms: u64,
    /// First container restart (and image pull) back-off, in seconds.
    pub backoff_base_secs: f64,
    /// Largest back-off, in seconds.
    pub backoff_max_secs: f64,
    /// Seconds of clean running after which a container's back-off starts over.
    pub backoff_reset_secs: f64,
    /// Seconds between two computations of the node status.
    pub node_status_update_secs: f64,
    /// Seconds after which an unchanged node status is reported anyway.
    pub node_status_report_secs: f64,
    /// Images listed in the node status, largest first (-1: all, 0: none).
    pub node_status_max_images: i64,
    /// cgroup under which pods' cgroups go, by QoS class (`<root>/burstable/pod<uid>`, ...).
    pub cgroup_root: String,
    /// Seconds a node lease lasts; the heartbeat renews it every quarter of that.
    pub node_lease_duration_secs: f64,
    /// Node name (default: the host name, lower-cased).
    pub node_name: Option<String>,
    /// Kubeconfig of the API server to join as a node (none: pods from files only).
    pub kubeconfig: Option<PathBuf>,
    /// Labels the agent puts on its Node besides the kubelet's own.
    pub node_labels: BTreeMap<String, String>,
    /// Taints the Node is registered with, as `key=value:Effect` or `key:Effect`.
    pub register_with_taints: Vec<String>,
    /// The node's address (default: the source address of the default route).
    pub node_ip: Option<String>,
    /// Whether the agent creates its Node (false: an admin made it; the agent adopts it).
    pub register_node: bool,
    /// Addresses of the cluster's DNS service given to ClusterFirst pods (none: they use the
    /// host's resolv.conf, with a MissingClusterDNS event, as the kubelet does).
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (the pods' search path ends in it).
    pub cluster_domain: String,
    /// Seconds between two reads of the configMaps, secrets and tokens behind a pod's volumes
    /// (a change reaches the files within this time, without a container restart).
    pub volume_refresh_secs: f64,
    /// Resources kept for the system (`cpu`, `memory`, `ephemeral-storage`, `pid`), as quantities.
    pub system_reserved: BTreeMap<String, String>,
    /// Resources kept for the node's Kubernetes daemons (same keys).
    pub kube_reserved: BTreeMap<String, String>,
    /// Hard eviction thresholds by signal (`memory.available`, `nodefs.available`,
    /// `nodefs.inodesFree`, `imagefs.available`, `imagefs.inodesFree`, `pid.available`):
    /// a quantity (`100Mi`) or a percentage of capacity (`10%`). Acted on at once.
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds (same form); acted on once crossed for their grace period.
    pub eviction_soft: BTreeMap<String, String>,
    /// Seconds a soft threshold must stay crossed before pods are evicted, by signal.
    pub eviction_soft_grace_period_secs: BTreeMap<String, f64>,
    /// Largest grace period (seconds) given to a pod evicted for a soft threshold.
    pub eviction_max_pod_grace_period_secs: i64,
    /// Seconds a pressure condition stays on after its signal recovered.
    pub eviction_pressure_transition_period_secs: f64,
    /// Seconds between two eviction checks (the kubelet's housekeeping interval).
    pub eviction_monitoring_period_secs: f64,
    /// Disk usage (percent) of the image filesystem above which image GC runs.
    pub image_gc_high_threshold_percent: u8,
    /// Disk usage (percent) image GC frees down to.
    pub image_gc_low_threshold_percent: u8,
    /// Seconds an image must have been unused before GC may remove it.
    pub image_minimum_gc_age_secs: f64,
    /// Seconds between two image GC passes.
    pub image_gc_period_secs: f64,
    /// Seconds between two container GC passes.
    pub container_gc_period_secs: f64,
    /// Dead containers kept per container of a pod (older ones are removed; -1: no limit).
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node in all (-1: no limit).
    pub max_containers: i32,
    /// Seconds a dead container is kept at least.
    pub minimum_container_ttl_secs: f64,
    /// Seconds the node's shutdown is delayed for pods (0: graceful node shutdown off).
    pub shutdown_grace_period_secs: f64,
    /// Of `shutdown_grace_period_secs`, the seconds kept for critical pods (terminated last).
    pub shutdown_grace_period_critical_pods_secs: f64,
    /// Shutdown grace periods by pod priority (replaces the two settings above when set).
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGraceByPriority>,
    /// Where the agent writes the logind drop-in raising `InhibitDelayMaxSec` to the shutdown
    /// grace period when logind's is shorter.
    pub logind_config_dir: PathBuf,
    /// Refuse to start when the machine has swap on.
    pub fail_swap_on: bool,
    /// With swap allowed: `NoSwap` (pods get none) or `LimitedSwap` (Burstable pods may swap
    /// in proportion to their memory request).
    pub memory_swap_behavior: String,
    /// On cgroup v2, an OOM kill takes only the process the kernel picks (the kubelet's
    /// singleProcessOOMKill); by default the whole container goes (`memory.oom.group`).
    pub single_process_oom_kill: bool,
    /// A running container's log is rotated once it is larger than this (a quantity, as the
    /// kubelet's containerLogMaxSize).
    pub container_log_max_size: String,
    /// Log files kept per container, the live one included (at least 2); the older rotated
    /// ones are gzip-compressed.
    pub container_log_max_files: u32,
    /// Seconds between two checks of the containers' log sizes.
    pub container_log_monitor_interval_secs: f64,
    /// Unsafe sysctls pods may set besides the kubelet's safe ones, as the kubelet's
    /// `--allowed-unsafe-sysctls`: names (`net.core.somaxconn`) or prefixes ending in `*`
    /// (`kernel.msg*`), each of a namespaced sysctl (`net.*`, `kernel.shm*`, `kernel.msg*`,
    /// `kernel.sem`, `fs.mqueue.*`). A pod setting any other sysctl is refused
    /// (SysctlForbidden), as is one setting a sysctl of a namespace it shares with the host.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Where device plugins register (`kubelet.sock`, served by the agent) and serve their own
    /// sockets: the kubelet's directory, so the device plugins a node runs find the agent as
    /// they find the kubelet. Empty: no device plugins.
    pub device_plugin_dir: PathBuf,
    /// The plugin registry the agent watches, as the kubelet does: a plugin (a device plugin
    /// here) that puts its socket in it is asked what it is and registered. Empty: not watched.
    pub plugin_registry_dir: PathBuf,
    /// Where the pod resources API is served (`kubelet.sock`), as the kubelet serves it for
    /// node-local monitoring agents. Empty: not served.
    pub pod_resources_dir: PathBuf,
}

/// A shutdown grace period for pods of a priority and above (up to the next entry).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShutdownGraceByPriority {
    /// Lowest pod priority of the range.
    pub priority: i32,
    /// Seconds those pods get.
    pub shutdown_grace_period_seconds: i64,
}

/// The kubelet's default hard eviction thresholds on Linux.
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Eviction signals the agent knows.
pub const EVICTION_SIGNALS: [&str; 6] = [
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// Longest duration a `*_secs` setting may hold: 10 years. Larger values (and infinities)
/// would panic later in `Duration::from_secs_f64` or overflow `Instant + period`.
pub const MAX_DURATION_SECS: f64 = 315_360_000.0;

/// Checks that the duration `name` holds is finite and at most [`MAX_DURATION_SECS`].
fn bounded_secs(name: &str, secs: f64) -> Result<(), String> {
    if secs.is_finite() && secs <= MAX_DURATION_SECS {
        Ok(())
    } else {
        Err(format!(
            "{name} = {secs} must be a finite number of seconds, at most {MAX_DURATION_SECS} (10 years)"
        ))
    }
}

/// A taint as `--register-with-taints` gives it: `key=value:Effect` or `key:Effect`, with the
/// effect one of NoSchedule, PreferNoSchedule, NoExecute.
pub fn parse_taint(text: &str) -> Result<k8s_openapi::api::core::v1::Taint, String> {
    let (kv, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {text:?} has no effect (key=value:Effect)"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(format!(
            "taint {text:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("taint {text:?} has an empty key"));
    }
    Ok(k8s_openapi::api::core::v1::Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}

/// Resources that may be reserved.
const RESERVABLE: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pid"];

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            manifest_dir: PathBuf::from("/etc/berth/manifests"),
            address: String::new(),
            pod_log_dir: PathBuf::from("/var/log/pods"),
            server_address: "0.0.0.0:10250".to_string(),
            healthz_address: "127.0.0.1:10248".to_string(),
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            rotate_server_certificates: false,
            cert_dir: None,
            bootstrap_kubeconfig: None,
            manifest_rescan_ms: 1000,
            sync_period_ms: 1000,
            backoff_base_secs: 10.0,
            backoff_max_secs: 300.0,
            backoff_reset_secs: 600.0,
            node_status_update_secs: 10.0,
            node_status_report_secs: 300.0,
            node_status_max_images: 50,
            node_lease_duration_secs: 40.0,
            cgroup_root: "/kubepods".to_string(),
            node_name: None,
            kubeconfig: None,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            node_ip: None,
            register_node: true,
            volume_refresh_secs: 60.0,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".to_string(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            eviction_hard: default_eviction_hard(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period_secs: BTreeMap::new(),
            eviction_max_pod_grace_period_secs: 0,
            eviction_pressure_transition_period_secs: 300.0,
            eviction_monitoring_period_secs: 10.0,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age_secs: 120.0,
            image_gc_period_secs: 300.0,
            container_gc_period_secs: 60.0,
            max_per_pod_container: 1,
            max_containers: -1,
            minimum_container_ttl_secs: 0.0,
            shutdown_grace_period_secs: 0.0,
            shutdown_grace_period_critical_pods_secs: 0.0,
            shutdown_grace_period_by_pod_priority: Vec::new(),
            logind_config_dir: PathBuf::from("/etc/systemd/logind.conf.d"),
            fail_swap_on: true,
            memory_swap_behavior: "NoSwap".to_string(),
            single_process_oom_kill: false,
            container_log_max_size: "10Mi".to_string(),
            container_log_max_files: 5,
            container_log_monitor_interval_secs: 10.0,
            allowed_unsafe_sysctls: Vec::new(),
            device_plugin_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            plugin_registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            pod_resources_dir: PathBuf::from("/var/lib/kubelet/pod-resources"),
        }
    }
}

impl AgentConfig {
    /// The directory of the node's certificates: `cert_dir`, or `<root>/agent/pki` (under the
    /// root dir, which a reboot keeps, as the kubelet keeps `/var/lib/kubelet/pki`: a node
    /// whose bootstrap token has expired rejoins with its stored certificate).
    pub fn cert_dir_in(&self, root: &std::path::Path) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| root.join("agent/pki"))
    }

    /// `container_log_max_size` in bytes (None unless a positive quantity).
    pub fn container_log_max_bytes(&self) -> Option<u64> {
        crate::agent::runtime::resources::parse_quantity(&self.container_log_max_size)
            .filter(|b| *b >= 1.0 && b.is_finite())
            .map(|b| b as u64)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), String> {
        if self.container_log_max_bytes().is_none() {
            return Err(format!(
                "agent.container_log_max_size {:?} is not a positive quantity (such as 10Mi)",
                self.container_log_max_size
            ));
        }
        if self.container_log_max_files < 2 {
            return Err("agent.container_log_max_files must be at least 2".into());
        }
        if self.container_log_monitor_interval_secs.is_nan()
            || self.container_log_monitor_interval_secs < 1.0
        {
            return Err("agent.container_log_monitor_interval_secs must be at least 1".into());
        }
        for (name, v) in [
            ("agent.address", &self.address),
            ("agent.server_address", &self.server_address),
            ("agent.healthz_address", &self.healthz_address),
        ] {
            if !v.is_empty() && v.parse::<std::net::SocketAddr>().is_err() {
                return Err(format!(
                    "{name} {v:?} is not HOST:PORT (an IP address and a port) or empty (off)"
                ));
            }
        }
        if self.bootstrap_kubeconfig.is_some() && self.kubeconfig.is_none() {
            return Err(
                "agent.bootstrap_kubeconfig needs agent.kubeconfig: the path the bootstrap writes the node's kubeconfig to"
                    .into(),
            );
        }
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            return Err(
                "agent.tls_cert_file and agent.tls_private_key_file go together: give both or neither"
                    .into(),
            );
        }
        let positive = [
            ("agent.backoff_base_secs", self.backoff_base_secs),
            ("agent.backoff_max_secs", self.backoff_max_secs),
            ("agent.backoff_reset_secs", self.backoff_reset_secs),
            (
                "agent.node_status_update_secs",
                self.node_status_update_secs,
            ),
            (
                "agent.node_status_report_secs",
                self.node_status_report_secs,
            ),
            (
                "agent.node_lease_duration_secs",
                self.node_lease_duration_secs,
            ),
            ("agent.volume_refresh_secs", self.volume_refresh_secs),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} must be a positive number of seconds"));
            }
            bounded_secs(name, v)?;
        }
        for t in &self.register_with_taints {
            parse_taint(t).map_err(|e| format!("agent.register_with_taints: {e}"))?;
        }
        if let Some(ip) = &self.node_ip
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            return Err(format!("agent.node_ip {ip:?} is not an IP address"));
        }
        for ip in &self.cluster_dns {
            if ip.parse::<std::net::IpAddr>().is_err() {
                return Err(format!("agent.cluster_dns: {ip:?} is not an IP address"));
            }
        }
        for k in self.node_labels.keys() {
            if k.is_empty() || k.len() > 316 || k.contains(char::is_whitespace) {
                return Err(format!("agent.node_labels: {k:?} is not a label key"));
            }
        }
        if !self.cgroup_root.starts_with('/') || self.cgroup_root.contains("..") {
            return Err(format!(
                "agent.cgroup_root {:?} must be an absolute cgroup path",
                self.cgroup_root
            ));
        }
        let non_negative = [
            (
                "agent.eviction_pressure_transition_period_secs",
                self.eviction_pressure_transition_period_secs,
            ),
            (
                "agent.image_minimum_gc_age_secs",
                self.image_minimum_gc_age_secs,
            ),
            (
                "agent.minimum_container_ttl_secs",
                self.minimum_container_ttl_secs,
            ),
            (
                "agent.shutdown_grace_period_secs",
                self.shutdown_grace_period_secs,
            ),
            (
                "agent.shutdown_grace_period_critical_pods_secs",
                self.shutdown_grace_period_critical_pods_secs,
            ),
        ];
        for (name, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "{name} must be zero or a positive number of seconds"
                ));
            }
            bounded_secs(name, v)?;
        }
        for (name, v) in [
            (
                "agent.eviction_monitoring_period_secs",
                self.eviction_monitoring_period_secs,
            ),
            ("agent.image_gc_period_secs", self.image_gc_period_secs),
            (
                "agent.container_gc_period_secs",
                self.container_gc_period_secs,
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} must be a positive number of seconds"));
            }
            bounded_secs(name, v)?;
        }
        bounded_secs(
            "agent.eviction_max_pod_grace_period_secs",
            self.eviction_max_pod_grace_period_secs as f64,
        )?;
        for (i, p) in self
            .shutdown_grace_period_by_pod_priority
            .iter()
            .enumerate()
        {
            bounded_secs(
                &format!(
                    "agent.shutdown_grace_period_by_pod_priority[{i}].shutdown_grace_period_seconds"
                ),
                p.shutdown_grace_period_seconds as f64,
            )?;
        }
        if self.shutdown_grace_period_critical_pods_secs > self.shutdown_grace_period_secs {
            return Err(
                "agent.shutdown_grace_period_critical_pods_secs must not exceed agent.shutdown_grace_period_secs"
                    .into(),
            );
        }
        if self.image_gc_high_threshold_percent > 100
            || self.image_gc_low_threshold_percent > self.image_gc_high_threshold_percent
        {
            return Err(format!(
                "agent.image_gc_low_threshold_percent ({}) must not exceed agent.image_gc_high_threshold_percent ({}), which is at most 100",
                self.image_gc_low_threshold_percent, self.image_gc_high_threshold_percent
            ));
        }
        if !["NoSwap", "LimitedSwap"].contains(&self.memory_swap_behavior.as_str()) {
            return Err(format!(
                "agent.memory_swap_behavior {:?} must be NoSwap or LimitedSwap",
                self.memory_swap_behavior
            ));
        }
        for (section, map) in [
            ("agent.eviction_hard", &self.eviction_hard),
            ("agent.eviction_soft", &self.eviction_soft),
        ] {
            for (signal, value) in map {
                if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                    return Err(format!(
                        "{section}: unknown eviction signal {signal:?} (known: {})",
                        EVICTION_SIGNALS.join(", ")
                    ));
                }
                threshold_value(value)
                    .map_err(|e| format!("{section}.{signal:?} = {value:?}: {e}"))?;
            }
        }
        for signal in self.eviction_soft.keys() {
            if !self.eviction_soft_grace_period_secs.contains_key(signal) {
                return Err(format!(
                    "agent.eviction_soft.{signal:?} needs a grace period in agent.eviction_soft_grace_period_secs"
                ));
            }
        }
        for (signal, &secs) in &self.eviction_soft_grace_period_secs {
            bounded_secs(
                &format!("agent.eviction_soft_grace_period_secs.{signal:?}"),
                secs,
            )?;
        }
        for (section, map) in [
            ("agent.system_reserved", &self.system_reserved),
            ("agent.kube_reserved", &self.kube_reserved),
        ] {
            for (resource, value) in map {
                if !RESERVABLE.contains(&resource.as_str()) {
                    return Err(format!(
                        "{section}: unknown resource {resource:?} (known: {})",
                        RESERVABLE.join(", ")
                    ));
                }
                crate::agent::runtime::resources::parse_quantity(value).ok_or_else(|| {
                    format!("{section}.{resource:?} = {value:?} is not a quantity")
                })?;
            }
        }
        crate::agent::pods::admission::SysctlAllowlist::new(&self.allowed_unsafe_sysctls, None)
            .map_err(|e| format!("agent.allowed_unsafe_sysctls: {e}"))?;
        if self.manifest_rescan_ms == 0 || self.sync_period_ms == 0 {
            return Err(
                "agent.manifest_rescan_ms and agent.sync_period_ms must be positive".into(),
            );
        }
        Ok(())
    }
}

/// A threshold's value: an absolute amount or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An amount (bytes, inodes or process IDs).
    Quantity(u64),
    /// A percentage of the signal's capacity (0–100).
    Percent(f64),
}

impl ThresholdValue {
    /// The amount this value stands for, given the signal's capacity.
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// Parses `100Mi`, `1G`, `5%`.
pub fn threshold_value(text: &str) -> Result<ThresholdValue, String> {
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not a percentage"))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("{text:?} is not between 0% and 100%"));
        }
        return Ok(ThresholdValue::Percent(v));
    }
    let q = crate::agent::runtime::resources::parse_quantity(t)
        .ok_or_else(|| format!("{text:?} is not a quantity or a percentage"))?;
    Ok(ThresholdValue::Quantity(q.max(0.0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_the_kubelets() {
        let c = AgentConfig::default();
        assert_eq!(c.validate(), Ok(()));
        // The unauthenticated read-only endpoint is off unless asked for.
        assert_eq!(c.address, "");
        assert_eq!(c.eviction_hard["memory.available"], "100Mi");
        assert_eq!(
            threshold_value("100Mi"),
            Ok(ThresholdValue::Quantity(100 << 20))
        );
        assert_eq!(threshold_value("10%"), Ok(ThresholdValue::Percent(10.0)));
        assert_eq!(ThresholdValue::Percent(10.0).amount(1000), 100);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let mut c = AgentConfig::default();
        c.eviction_hard.insert("memory.avail".into(), "1Gi".into());
        assert!(c.validate().is_err_and(|e| e.contains("memory.avail")));
        let mut c = AgentConfig::default();
        c.eviction_soft
            .insert("memory.available".into(), "1Gi".into());
        assert!(c.validate().is_err_and(|e| e.contains("grace period")));
        let mut c = AgentConfig::default();
        c.eviction_hard
            .insert("nodefs.available".into(), "120%".into());
        assert!(c.validate().is_err());
        let c = AgentConfig {
            image_gc_low_threshold_percent: 90,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let mut c = AgentConfig::default();
        c.system_reserved.insert("memory".into(), "lots".into());
        assert!(c.validate().is_err_and(|e| e.contains("memory")));
        for bad in [
            "vm.swappiness",
            "kernel.*",
            "Net.core.somaxconn",
            "net..x",
            "",
        ] {
            let c = AgentConfig {
                allowed_unsafe_sysctls: vec![bad.to_string()],
                ..Default::default()
            };
            assert!(
                c.validate()
                    .is_err_and(|e| e.contains("agent.allowed_unsafe_sysctls")),
                "{bad:?}"
            );
        }
        let c = AgentConfig {
            allowed_unsafe_sysctls: vec![
                "kernel.msg*".into(),
                "net.core.somaxconn".into(),
                "net/ipv4/tcp_mem".into(),
                "net.*".into(),
            ],
            ..Default::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn infinite_and_huge_durations_are_refused_by_name() {
        for v in [1e30, f64::INFINITY] {
            let c = AgentConfig {
                eviction_monitoring_period_secs: v,
                ..Default::default()
            };
            assert!(
                c.validate()
                    .is_err_and(|e| e.contains("agent.eviction_monitoring_period_secs")),
                "period {v}"
            );
            let c = AgentConfig {
                minimum_container_ttl_secs: v,
                ..Default::default()
            };
            assert!(
                c.validate()
                    .is_err_and(|e| e.contains("agent.minimum_container_ttl_secs")),
                "ttl {v}"
            );
            let mut c = AgentConfig::default();
            c.eviction_soft
                .insert("memory.available".into(), "1Gi".into());
            c.eviction_soft_grace_period_secs
                .insert("memory.available".into(), v);
            assert!(
                c.validate().is_err_and(|e| {
                    e.contains("agent.eviction_soft_grace_period_secs")
                        && e.contains("memory.available")
                }),
                "soft grace {v}"
            );
        }
        let mut c = AgentConfig::default();
        c.shutdown_grace_period_by_pod_priority
            .push(ShutdownGraceByPriority {
                priority: 0,
                shutdown_grace_period_seconds: i64::MAX,
            });
        assert!(
            c.validate()
                .is_err_and(|e| e.contains("shutdown_grace_period_by_pod_priority[0]"))
        );
        let c = AgentConfig {
            eviction_max_pod_grace_period_secs: 400_000_000,
            ..Default::default()
        };
        assert!(
            c.validate()
                .is_err_and(|e| e.contains("agent.eviction_max_pod_grace_period_secs"))
        );
        // Ten years exactly is still accepted.
        let mut c = AgentConfig::default();
        c.eviction_soft
            .insert("memory.available".into(), "1Gi".into());
        c.eviction_soft_grace_period_secs
            .insert("memory.available".into(), MAX_DURATION_SECS);
        assert_eq!(c.validate(), Ok(()));
    }
}
