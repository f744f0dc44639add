//! User namespaces of pods with `spec.hostUsers: false`, allocated as the kubelet does: each pod
//! gets its own 65536 host ids (container ids 0-65535), the lowest free range from host id
//! 65536 up, never shared with another pod. The range is kept in the pod's directory (file
//! `userns`, in the kubelet's format), so it survives restarts and is freed with the directory.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// Ids per pod.
pub const IDS_PER_POD: u32 = 65536;
/// The first host id given to pods (host ids below it, the host's own users, never are).
const FIRST_HOST_ID: u32 = 65536;
/// The file in a pod's directory.
const FILE: &str = "userns";

/// Serialises allocations (pod workers run concurrently).
static ALLOCATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

/// The `userns` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    uid_mappings: Vec<Mapping>,
    gid_mappings: Vec<Mapping>,
}

impl Stored {
    /// The one range of a valid file: uid and gid ranges equal, container id 0, a whole slot.
    fn slot(&self) -> Option<u32> {
        let ([u], [g]) = (self.uid_mappings.as_slice(), self.gid_mappings.as_slice()) else {
            return None;
        };
        (u == g
            && u.container_id == 0
            && u.length == IDS_PER_POD
            && u.host_id >= FIRST_HOST_ID
            && u.host_id % IDS_PER_POD == 0)
            .then_some(u.host_id / IDS_PER_POD)
    }

    fn of_slot(slot: u32) -> Self {
        let m = Mapping {
            host_id: slot * IDS_PER_POD,
            container_id: 0,
            length: IDS_PER_POD,
        };
        Self {
            uid_mappings: vec![m],
            gid_mappings: vec![m],
        }
    }

    fn to_cri(&self) -> cri::UserNamespace {
        let m = |v: &[Mapping]| {
            v.iter()
                .map(|m| cri::IdMapping {
                    host_id: m.host_id,
                    container_id: m.container_id,
                    length: m.length,
                })
                .collect()
        };
        cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: m(&self.uid_mappings),
            gids: m(&self.gid_mappings),
        }
    }
}

/// Whether the pod runs in the host's user namespace (`hostUsers` unset or true).
pub fn host_users(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_users).unwrap_or(true)
}

/// The user namespace of pod `uid` (directories under `pods_dir`): the range it was given
/// before, or the lowest free one, recorded in its directory first.
pub fn pod_user_namespace(pods_dir: &Path, uid: &str) -> Result<cri::UserNamespace, String> {
    let _serial = ALLOCATING.lock().unwrap_or_else(|e| e.into_inner());
    let file = pods_dir.join(uid).join(FILE);
    if let Some(stored) = read(&file)? {
        return Ok(stored.to_cri());
    }
    let mut used = std::collections::HashSet::new();
    for entry in std::fs::read_dir(pods_dir).into_iter().flatten().flatten() {
        if let Ok(Some(s)) = read(&entry.path().join(FILE))
            && let Some(slot) = s.slot()
        {
            used.insert(slot);
        }
    }
    let last = u32::MAX / IDS_PER_POD;
    let slot = (FIRST_HOST_ID / IDS_PER_POD..last)
        .find(|s| !used.contains(s))
        .ok_or("no free range of host ids is left for a user namespace")?;
    let stored = Stored::of_slot(slot);
    write(&file, &stored)?;
    Ok(stored.to_cri())
}

fn read(file: &Path) -> Result<Option<Stored>, String> {
    match std::fs::read(file) {
        Ok(bytes) => {
            let stored: Stored = serde_json::from_slice(&bytes)
                .map_err(|e| format!("reading {}: {e}", file.display()))?;
            stored
                .slot()
                .map(|_| Some(stored))
                .ok_or_else(|| format!("{}: not one whole range of host ids", file.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", file.display())),
    }
}

/// Writes `file` durably: a temporary file, synced, renamed, the directory synced.
fn write(file: &Path, stored: &Stored) -> Result<(), String> {
    use std::io::Write;
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let err = |what: &str, e: std::io::Error| format!("{what} {}: {e}", file.display());
    std::fs::create_dir_all(&dir).map_err(|e| err("creating the directory of", e))?;
    let tmp: PathBuf = file.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| err("writing", e))?;
    let json = serde_json::to_vec(stored).map_err(|e| err("encoding", e.into()))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(|e| err("writing", e))?;
    std::fs::rename(&tmp, file).map_err(|e| err("renaming", e))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err("syncing the directory of", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_the_lowest_free_range_and_keep_it() {
        let dir = std::env::temp_dir().join(format!("berth-userns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let host =
            |u: &cri::UserNamespace| (u.uids[0].host_id, u.gids[0].host_id, u.uids[0].length);
        let a = pod_user_namespace(&dir, "a").expect("a");
        let b = pod_user_namespace(&dir, "b").expect("b");
        assert_eq!(host(&a), (65536, 65536, 65536));
        assert_eq!(host(&b), (131072, 131072, 65536));
        assert_eq!(a.mode, cri::NamespaceMode::Pod as i32);
        // Asked again (a restart), a pod gets its range back.
        assert_eq!(pod_user_namespace(&dir, "a").expect("a again"), a);
        // A pod gone (its directory removed) frees its range for the next one.
        std::fs::remove_dir_all(dir.join("a")).expect("remove a");
        let c = pod_user_namespace(&dir, "c").expect("c");
        assert_eq!(host(&c), (65536, 65536, 65536));
        // The kubelet's file format.
        let text = std::fs::read_to_string(dir.join("c").join(FILE)).expect("file");
        assert_eq!(
            text,
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":0,"length":65536}]}"#
        );
        // A damaged file is an error, not a new range.
        std::fs::write(dir.join("c").join(FILE), "{}").expect("damage");
        assert!(pod_user_namespace(&dir, "c").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
