//! Pod volumes the agent provides on the node: emptyDir (a directory under the pod's directory,
//! or a tmpfs for the Memory medium, sized by sizeLimit) and hostPath (with its type checks), and
//! the CRI mounts of each container's volumeMounts.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use super::resources::parse_quantity;

/// Volume kinds the agent supports (others are refused when the manifest is read).
pub fn check_supported(v: &Volume) -> Result<(), String> {
    if v.empty_dir.is_some() || v.host_path.is_some() {
        Ok(())
    } else {
        Err(format!(
            "volume {:?}: only emptyDir and hostPath volumes are supported",
            v.name
        ))
    }
}

/// Directory of emptyDir volume `name` of the pod whose directory is `pod_dir`.
fn empty_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("volumes/empty-dir").join(name)
}

/// Makes the pod's volumes ready; returns each volume's host path by name.
pub fn prepare(pod: &Pod, pod_dir: &Path) -> Result<HashMap<String, PathBuf>, String> {
    let mut paths = HashMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in volumes {
        let path = if let Some(ed) = &v.empty_dir {
            let dir = empty_dir_path(pod_dir, &v.name);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("volume {:?}: creating {}: {e}", v.name, dir.display()))?;
            if ed.medium.as_deref() == Some("Memory") && !is_mount_point(&dir) {
                let size = ed
                    .size_limit
                    .as_ref()
                    .and_then(|q| parse_quantity(&q.0))
                    .map(|b| format!(",size={}", b as u64))
                    .unwrap_or_default();
                let data = std::ffi::CString::new(format!("mode=0777{size}"))
                    .map_err(|e| format!("volume {:?}: {e}", v.name))?;
                rustix::mount::mount(
                    "tmpfs",
                    &dir,
                    "tmpfs",
                    rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
                    data.as_c_str(),
                )
                .map_err(|e| format!("volume {:?}: mounting tmpfs: {e}", v.name))?;
            }
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777));
            dir
        } else if let Some(hp) = &v.host_path {
            let path = PathBuf::from(&hp.path);
            check_host_path(&path, hp.type_.as_deref().unwrap_or(""))
                .map_err(|e| format!("volume {:?}: hostPath {}: {e}", v.name, hp.path))?;
            path
        } else {
            return Err(check_supported(&v).err().unwrap_or_default());
        };
        paths.insert(v.name.clone(), path);
    }
    Ok(paths)
}

/// The hostPath type checks (and creations) of the kubelet.
fn check_host_path(path: &Path, kind: &str) -> Result<(), String> {
    let meta = std::fs::metadata(path);
    let is = |want: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(format!("is not a {want}"))
        }
    };
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => match meta {
            Ok(m) => is("directory", m.is_dir()),
            Err(_) => {
                std::fs::create_dir_all(path).map_err(|e| format!("creating: {e}"))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("chmod: {e}"))
            }
        },
        "FileOrCreate" => match meta {
            Ok(m) => is("file", m.is_file()),
            Err(_) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map(|_| ())
                .map_err(|e| format!("creating: {e}")),
        },
        other => {
            let m = meta.map_err(|e| format!("{e}"))?;
            let t = m.file_type();
            match other {
                "Directory" => is("directory", t.is_dir()),
                "File" => is("file", t.is_file()),
                "Socket" => is("socket", t.is_socket()),
                "CharDevice" => is("character device", t.is_char_device()),
                "BlockDevice" => is("block device", t.is_block_device()),
                _ => Err(format!("unknown hostPath type {other:?}")),
            }
        }
    }
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    let (Ok(m), Some(parent)) = (std::fs::metadata(dir), dir.parent()) else {
        return false;
    };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != m.dev())
}

/// The CRI mounts of `c`'s volumeMounts.
pub fn mounts(c: &Container, paths: &HashMap<String, PathBuf>) -> Result<Vec<cri::Mount>, String> {
    let mut out = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        let Some(base) = paths.get(&vm.name) else {
            return Err(format!("volumeMount {:?}: no such volume", vm.name));
        };
        let mut host = base.clone();
        if let Some(sub) = vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            let rel = Path::new(sub);
            if rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(format!(
                    "volumeMount {:?}: subPath {sub:?} must be relative and stay inside the volume",
                    vm.name
                ));
            }
            host = base.join(rel);
            if !host.exists() {
                std::fs::create_dir_all(&host)
                    .map_err(|e| format!("volumeMount {:?}: creating subPath: {e}", vm.name))?;
            }
        }
        let propagation = match vm.mount_propagation.as_deref() {
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            _ => cri::MountPropagation::PropagationPrivate,
        };
        out.push(cri::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: vm.read_only.unwrap_or(false),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

/// Unmounts the pod's memory-backed volumes and removes its directory.
pub fn cleanup(pod_dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(pod_dir.join("volumes/empty-dir")) {
        for e in rd.flatten() {
            if is_mount_point(&e.path())
                && let Err(err) =
                    rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH)
            {
                tracing::warn!(dir = %e.path().display(), error = %err, "unmounting an emptyDir");
            }
        }
    }
    if let Err(e) = std::fs::remove_dir_all(pod_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %pod_dir.display(), error = %e, "removing the pod's directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "../x"}]
        }))
        .expect("container");
        let paths = [("v".to_string(), PathBuf::from("/tmp"))].into();
        assert!(mounts(&c, &paths).is_err());
    }
}
