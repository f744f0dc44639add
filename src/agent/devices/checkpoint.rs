//! The devices each pod's containers hold and what the plugins answered for them, kept on disk
//! so that a restarted agent gives a running pod's containers the same devices.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::assign::DeviceIds;

/// What the device plugins gave one container: its share of their Allocate answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Granted {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Host paths mounted into the container.
    pub mounts: Vec<GrantedMount>,
    /// Device nodes made in the container.
    pub devices: Vec<GrantedDevice>,
    /// Annotations of the container's CRI config.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names, resolved by the runtime.
    pub cdi_devices: Vec<String>,
}

/// A host path mounted into a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrantedMount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// A device node of the host made in a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrantedDevice {
    pub container_path: String,
    pub host_path: String,
    /// cgroup permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}

/// One container's devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerDevices {
    /// Device IDs by resource.
    pub ids: DeviceIds,
    /// The plugins' answers, once asked.
    pub granted: Option<Granted>,
}

/// Every pod's containers' devices: pod UID → container name → devices.
pub type Allocations = BTreeMap<String, BTreeMap<String, ContainerDevices>>;

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    pods: Allocations,
}

/// Reads the allocations kept at `path` (none when it does not exist; an unreadable file is
/// logged and read as none: its pods' containers get devices again when they next start).
pub fn load(path: &Path) -> Allocations {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(c) => c.pods,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "device allocations unreadable: starting without them");
                Allocations::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Allocations::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "device allocations unreadable: starting without them");
            Allocations::new()
        }
    }
}

/// Writes `pods` to `path`, replacing it whole.
pub fn save(path: &Path, pods: &Allocations) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(&Checkpoint { pods: pods.clone() })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::util::write_atomic(path, &bytes, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_survive_a_save_and_a_load() {
        let dir = std::env::temp_dir().join(format!("berth-devckpt-{}", std::process::id()));
        let path = dir.join("agent/devices.json");
        assert!(load(&path).is_empty());
        let mut pods = Allocations::new();
        pods.entry("uid-1".into()).or_default().insert(
            "c".into(),
            ContainerDevices {
                ids: [("example.com/gpu".to_string(), vec!["g0".to_string()])].into(),
                granted: Some(Granted {
                    envs: [("GPU".to_string(), "g0".to_string())].into(),
                    cdi_devices: vec!["example.com/gpu=g0".into()],
                    ..Default::default()
                }),
            },
        );
        save(&path, &pods).expect("save");
        assert_eq!(load(&path), pods);
        std::fs::write(&path, b"{not json").expect("write");
        assert!(load(&path).is_empty(), "a torn file reads as none");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
