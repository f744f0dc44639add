//! The `[agent]` section of berthd's configuration (the kubelet's defaults).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Settings of the embedded node agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Whether berthd runs the agent (`--no-agent` turns it off).
    pub enabled: bool,
    /// Directory of Pod manifests (YAML or JSON, several per file).
    pub manifest_dir: PathBuf,
    /// `HOST:PORT` of the read-only status endpoint (`/pods`, `/node`, `/healthz`).
    pub address: String,
    /// Root of the pods' log directories (`<root>/<namespace>_<name>_<uid>`).
    pub pod_log_dir: PathBuf,
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
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            manifest_dir: PathBuf::from("/etc/berth/manifests"),
            address: "127.0.0.1:10255".to_string(),
            pod_log_dir: PathBuf::from("/var/log/pods"),
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
        }
    }
}

impl AgentConfig {
    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), String> {
        if self.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "agent.address {:?} is not HOST:PORT (an IP address and a port)",
                self.address
            ));
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
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} must be a positive number of seconds"));
            }
        }
        if !self.cgroup_root.starts_with('/') || self.cgroup_root.contains("..") {
            return Err(format!(
                "agent.cgroup_root {:?} must be an absolute cgroup path",
                self.cgroup_root
            ));
        }
        if self.manifest_rescan_ms == 0 || self.sync_period_ms == 0 {
            return Err(
                "agent.manifest_rescan_ms and agent.sync_period_ms must be positive".into(),
            );
        }
        Ok(())
    }
}
