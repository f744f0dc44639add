//! Pod volumes the agent provides on the node: emptyDir (a directory under the pod's directory,
//! or a tmpfs for the Memory medium, sized by sizeLimit), hostPath (with its type checks),
//! downwardAPI (and projected volumes of downwardAPI sources: files written under the pod's
//! directory, mounted read-only), volumes of API objects (configMap, secret, projected: read by
//! `objects`, written by `atomic`, secrets and tokens on a tmpfs), and the CRI mounts of each
//! container's volumeMounts (subPaths through `subpath`'s binds).

pub mod atomic;
pub mod downward;
pub mod objects;
pub mod ownership;
pub mod subpath;

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, EmptyDirVolumeSource, Pod, ProjectedVolumeSource, Volume,
    VolumeProjection,
};

use crate::agent::runtime::resources::parse_quantity;
use downward::NodeAllocatable;

/// Volume kinds the agent supports (others are refused when the manifest is read).
pub fn check_supported(v: &Volume) -> Result<(), String> {
    if v.empty_dir.is_some() || v.host_path.is_some() || v.downward_api.is_some() {
        return Ok(());
    }
    if let Some(p) = &v.projected {
        return projected_downward_items(p)
            .map(|_| ())
            .map_err(|e| format!("volume {:?}: {e}", v.name));
    }
    Err(format!(
        "volume {:?}: only emptyDir, hostPath, downwardAPI and projected downwardAPI volumes are supported",
        v.name
    ))
}

/// The downwardAPI items of a projected volume; other sources are refused.
fn projected_downward_items(
    p: &ProjectedVolumeSource,
) -> Result<Vec<DownwardAPIVolumeFile>, String> {
    let mut items = Vec::new();
    for source in p.sources.iter().flatten() {
        // Only a source that is nothing but downwardAPI (whatever fields later APIs add).
        let only_downward = source.downward_api.as_ref().filter(|d| {
            *source
                == VolumeProjection {
                    downward_api: Some((*d).clone()),
                    ..Default::default()
                }
        });
        let Some(d) = only_downward else {
            return Err("only downwardAPI sources of projected volumes are supported (not configMap, secret, serviceAccountToken, ...)".into());
        };
        items.extend(d.items.iter().flatten().cloned());
    }
    Ok(items)
}

/// Directory of emptyDir volume `name` of the pod whose directory is `pod_dir`.
pub fn empty_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("volumes/empty-dir").join(name)
}

/// Directory of downwardAPI or projected volume `name` of the pod whose directory is `pod_dir`.
fn downward_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("volumes/downward-api").join(name)
}

/// A volume made ready on the node.
#[derive(Debug, Clone)]
struct PreparedVolume {
    /// Where it is on the host.
    path: PathBuf,
    /// Mounted read-only whatever the volumeMount says (downward API files).
    read_only: bool,
}

/// The pod's volumes made ready on the node, by name.
#[derive(Debug, Clone, Default)]
pub struct PreparedVolumes {
    by_name: HashMap<String, PreparedVolume>,
    /// The pod's directory (where the binds of subPaths go).
    pod_dir: PathBuf,
}

impl PreparedVolumes {
    /// The host path of volume `name`.
    pub fn path(&self, name: &str) -> Option<&Path> {
        self.by_name.get(name).map(|v| v.path.as_path())
    }
}

/// The files of the pod's volumes of API objects, by volume name, with whether each belongs on
/// a tmpfs.
pub type ApiVolumeFiles = HashMap<String, (Vec<atomic::VolumeFile>, bool)>;

/// Directory of volume `name` of API objects of kind `kind` (`secret`, `configmap`,
/// `projected`) of the pod whose directory is `pod_dir`.
fn object_dir_path(pod_dir: &Path, kind: &str, name: &str) -> PathBuf {
    pod_dir
        .join(format!("volumes/kubernetes.io~{kind}"))
        .join(name)
}

/// The kind directory of volume `v` of API objects.
fn object_kind(v: &Volume) -> &'static str {
    if v.secret.is_some() {
        "secret"
    } else if v.config_map.is_some() {
        "configmap"
    } else {
        "projected"
    }
}

/// Writes (or refreshes) volume `v` of API objects with `files`: a tmpfs first when `tmpfs`
/// (secrets never reach the disk), then the atomic writer; returns its directory.
pub fn write_object_volume(
    pod_dir: &Path,
    v: &Volume,
    files: &[atomic::VolumeFile],
    tmpfs: bool,
) -> Result<PathBuf, String> {
    let dir = object_dir_path(pod_dir, object_kind(v), &v.name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("volume {:?}: creating {}: {e}", v.name, dir.display()))?;
    if tmpfs && !is_mount_point(&dir) {
        rustix::mount::mount(
            "tmpfs",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            c"mode=0755",
        )
        .map_err(|e| format!("volume {:?}: mounting tmpfs: {e}", v.name))?;
    }
    atomic::write(&dir, files).map_err(|e| format!("volume {:?}: {e}", v.name))?;
    Ok(dir)
}

/// Makes the pod's volumes ready (downward API files written afresh, volumes of API objects
/// from `api`); returns where each is.
pub fn prepare(pod: &Pod, pod_dir: &Path, api: &ApiVolumeFiles) -> Result<PreparedVolumes, String> {
    let mut prepared = PreparedVolumes {
        pod_dir: pod_dir.to_path_buf(),
        ..Default::default()
    };
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut node: Option<NodeAllocatable> = None;
    let fs_group = ownership::fs_group(pod);
    for v in volumes {
        // Whether the pod's fsGroup goes onto the volume now: the kubelet's volumes of API
        // objects and downward API at every write, an emptyDir once, when made (empty).
        let mut owned = true;
        let (path, read_only) = if let Some((files, tmpfs)) = api.get(&v.name) {
            (write_object_volume(pod_dir, &v, files, *tmpfs)?, true)
        } else if let Some(ed) = &v.empty_dir {
            let (dir, made) = prepare_empty_dir(pod_dir, &v.name, ed)?;
            owned = made;
            (dir, false)
        } else if let Some(hp) = &v.host_path {
            let path = PathBuf::from(&hp.path);
            check_host_path(&path, hp.type_.as_deref().unwrap_or(""))
                .map_err(|e| format!("volume {:?}: hostPath {}: {e}", v.name, hp.path))?;
            owned = false;
            (path, false)
        } else if let Some(d) = &v.downward_api {
            let items: Vec<_> = d.items.iter().flatten().cloned().collect();
            let node = node.get_or_insert_with(|| NodeAllocatable::detect(pod_dir));
            let dir = prepare_downward(pod, pod_dir, &v.name, &items, d.default_mode, node)?;
            (dir, true)
        } else if let Some(p) = &v.projected {
            let items =
                projected_downward_items(p).map_err(|e| format!("volume {:?}: {e}", v.name))?;
            let node = node.get_or_insert_with(|| NodeAllocatable::detect(pod_dir));
            let dir = prepare_downward(pod, pod_dir, &v.name, &items, p.default_mode, node)?;
            (dir, true)
        } else {
            // API objects reach here only on a node without an API server.
            return Err(if v.config_map.is_some() || v.secret.is_some() {
                format!(
                    "volume {:?}: configMap and secret volumes need an API server; this node has none",
                    v.name
                )
            } else {
                format!(
                    "{} (with an API server also configMap, secret and projected volumes)",
                    check_supported(&v).err().unwrap_or_default()
                )
            });
        };
        if let (Some(gid), true) = (fs_group, owned) {
            ownership::apply(&path, gid, read_only)
                .map_err(|e| format!("volume {:?}: setting fsGroup {gid}: {e}", v.name))?;
        }
        prepared
            .by_name
            .insert(v.name.clone(), PreparedVolume { path, read_only });
    }
    Ok(prepared)
}

/// Writes the pod's downward API volumes (and projected volumes of downward items only) again
/// from `pod`, as its labels or annotations change.
pub fn refresh_downward(pod: &Pod, pod_dir: &Path) -> Result<(), String> {
    let mut node: Option<NodeAllocatable> = None;
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let (items, mode) = if let Some(d) = &v.downward_api {
            (d.items.iter().flatten().cloned().collect(), d.default_mode)
        } else if let Some(p) = &v.projected
            && let Ok(items) = projected_downward_items(p)
        {
            (items, p.default_mode)
        } else {
            continue;
        };
        let node = node.get_or_insert_with(|| NodeAllocatable::detect(pod_dir));
        let dir = prepare_downward(pod, pod_dir, &v.name, &items, mode, node)?;
        own(pod, &v.name, &dir)?;
    }
    Ok(())
}

/// Writes volume `v` of API objects again with `files` (a refresh of a running pod's volume),
/// with the pod's fsGroup on it.
pub fn refresh_object_volume(
    pod: &Pod,
    pod_dir: &Path,
    v: &Volume,
    files: &[atomic::VolumeFile],
    tmpfs: bool,
) -> Result<(), String> {
    let dir = write_object_volume(pod_dir, v, files, tmpfs)?;
    own(pod, &v.name, &dir)
}

/// Puts the pod's fsGroup, if any, on read-only volume `name` at `dir`.
fn own(pod: &Pod, name: &str, dir: &Path) -> Result<(), String> {
    match ownership::fs_group(pod) {
        Some(gid) => ownership::apply(dir, gid, true)
            .map_err(|e| format!("volume {name:?}: setting fsGroup {gid}: {e}")),
        None => Ok(()),
    }
}

/// Creates emptyDir volume `name` (a tmpfs for the Memory medium); returns its directory and
/// whether it was made now (a new directory or a new tmpfs, so empty).
fn prepare_empty_dir(
    pod_dir: &Path,
    name: &str,
    ed: &EmptyDirVolumeSource,
) -> Result<(PathBuf, bool), String> {
    let dir = empty_dir_path(pod_dir, name);
    let mut made = !dir.exists();
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("volume {name:?}: creating {}: {e}", dir.display()))?;
    if ed.medium.as_deref() == Some("Memory") && !is_mount_point(&dir) {
        let size = ed
            .size_limit
            .as_ref()
            .and_then(|q| parse_quantity(&q.0))
            .map(|b| format!(",size={}", b as u64))
            .unwrap_or_default();
        // A tmpfs root's own mode (1777, sticky as /tmp), as the kubelet leaves it.
        let data = std::ffi::CString::new(format!("mode=1777{size}"))
            .map_err(|e| format!("volume {name:?}: {e}"))?;
        rustix::mount::mount(
            "tmpfs",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            data.as_c_str(),
        )
        .map_err(|e| format!("volume {name:?}: mounting tmpfs: {e}"))?;
        made = true;
    }
    // rwx for all, keeping the special bits (a tmpfs's sticky bit, an fsGroup's set-group-ID).
    if let Ok(m) = std::fs::metadata(&dir)
        && m.mode() & 0o777 != 0o777
    {
        let mode = (m.mode() & 0o7000) | 0o777;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode));
    }
    Ok((dir, made))
}

/// Writes the files of downward API volume `name`; returns its directory. A bad item (a path
/// leaving the volume, an unknown field) fails the whole volume before anything is written.
fn prepare_downward(
    pod: &Pod,
    pod_dir: &Path,
    name: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    node: &NodeAllocatable,
) -> Result<PathBuf, String> {
    let files = downward::files(pod, items, default_mode, node)
        .map_err(|e| format!("volume {name:?}: downwardAPI {e}"))?;
    let dir = downward_dir_path(pod_dir, name);
    downward::write_files(&dir, &files).map_err(|e| format!("volume {name:?}: {e}"))?;
    Ok(dir)
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
        // As the kubelet: the file is created (0644), its parent directory is not.
        "FileOrCreate" => match meta {
            Ok(m) => is("file", m.is_file()),
            Err(_) => {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(path)
                    .map_err(|e| format!("creating: {e}"))?;
                // Whatever berthd's umask is.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
                    .map_err(|e| format!("chmod: {e}"))
            }
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

/// Why a container's mounts could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountError {
    /// A subPath (or subPathExpr) refused or not made ready: the kubelet's
    /// CreateContainerConfigError.
    SubPath(String),
    /// A volumeMount naming no volume of the pod.
    Volume(String),
}

/// The CRI mounts of `c`'s volumeMounts; `env` is the container's environment (for
/// subPathExpr). A subPath is made ready by [`subpath::prepare`] and the runtime gets the path
/// of its bind, never a path inside the volume.
pub fn mounts(
    c: &Container,
    volumes: &PreparedVolumes,
    env: &[cri::KeyValue],
) -> Result<Vec<cri::Mount>, MountError> {
    let mut out = Vec::new();
    for (index, vm) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(volume) = volumes.by_name.get(&vm.name) else {
            return Err(MountError::Volume(format!(
                "volumeMount {:?}: no such volume",
                vm.name
            )));
        };
        // subPathExpr, when given, is the subPath (as the kubelet reads it).
        let sub = match vm.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => subpath::expand(expr, |name| {
                env.iter()
                    .rev()
                    .find(|kv| kv.key == name)
                    .map(|kv| kv.value.clone())
            })
            .map_err(MountError::SubPath)?,
            None => vm.sub_path.clone().unwrap_or_default(),
        };
        let host = if sub.is_empty() {
            volume.path.clone()
        } else {
            subpath::prepare(&subpath::SubPath {
                volume_root: &volume.path,
                volume: &vm.name,
                sub_path: &sub,
                mount_name: &vm.name,
                container: &c.name,
                index,
                pod_dir: &volumes.pod_dir,
            })
            .map_err(MountError::SubPath)?
        };
        let propagation = match vm.mount_propagation.as_deref() {
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            _ => cri::MountPropagation::PropagationPrivate,
        };
        out.push(cri::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: volume.read_only || vm.read_only.unwrap_or(false),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

/// Unmounts the binds of the pod's subPaths (which hold their volumes), then its memory-backed
/// (tmpfs) volumes (emptyDirs of the Memory medium, secrets, projected volumes), freeing their
/// pages; the volumes' directories stay. A later [`prepare`] mounts a fresh, empty tmpfs again.
pub fn unmount_memory_volumes(pod_dir: &Path) {
    subpath::unmount_all(pod_dir);
    for kind in [
        "empty-dir",
        "kubernetes.io~secret",
        "kubernetes.io~projected",
    ] {
        let Ok(rd) = std::fs::read_dir(pod_dir.join("volumes").join(kind)) else {
            continue;
        };
        for e in rd.flatten() {
            if is_mount_point(&e.path())
                && let Err(err) =
                    rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH)
            {
                tracing::warn!(dir = %e.path().display(), error = %err, "unmounting a volume");
            }
        }
    }
}

/// Unmounts the pod's subPath binds and memory-backed volumes and removes its directory, unless
/// something is still mounted under it: the removal would go down into the mount (a subPath
/// bind of a hostPath is a host directory) and delete what it holds.
pub fn cleanup(pod_dir: &Path) {
    unmount_memory_volumes(pod_dir);
    let left = subpath::mounts_under(pod_dir);
    if !left.is_empty() {
        tracing::warn!(dir = %pod_dir.display(), mounts = ?left, "the pod's directory still holds mounts: not removed");
        return;
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
    fn host_path_types_are_checked_and_created_as_the_kubelet_does() {
        let dir = std::env::temp_dir().join(format!("berth-hostpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.mode() & 0o777).ok();

        let made = dir.join("a/b");
        assert_eq!(check_host_path(&made, "DirectoryOrCreate"), Ok(()));
        assert_eq!(mode(&made), Some(0o755));
        assert_eq!(check_host_path(&made, "Directory"), Ok(()));
        assert_eq!(
            check_host_path(&made, "File"),
            Err("is not a file".to_string())
        );

        let file = dir.join("f");
        assert_eq!(check_host_path(&file, "FileOrCreate"), Ok(()));
        assert_eq!(mode(&file), Some(0o644));
        assert_eq!(check_host_path(&file, "File"), Ok(()));
        assert_eq!(
            check_host_path(&file, "DirectoryOrCreate"),
            Err("is not a directory".to_string())
        );
        // FileOrCreate makes no parent directories.
        assert!(check_host_path(&dir.join("missing/f"), "FileOrCreate").is_err());

        let socket = dir.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        assert_eq!(check_host_path(&socket, "Socket"), Ok(()));
        assert_eq!(
            check_host_path(&file, "Socket"),
            Err("is not a socket".to_string())
        );
        assert_eq!(
            check_host_path(Path::new("/dev/null"), "CharDevice"),
            Ok(())
        );
        assert_eq!(
            check_host_path(Path::new("/dev/null"), "BlockDevice"),
            Err("is not a block device".to_string())
        );
        // Existence types on a missing path, and an unknown type.
        assert!(check_host_path(&dir.join("none"), "Directory").is_err());
        assert!(check_host_path(&dir.join("none"), "").is_ok());
        assert_eq!(
            check_host_path(&made, "Fifo"),
            Err("unknown hostPath type \"Fifo\"".to_string())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sub_paths_stay_inside() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "volumeMounts": [{"name": "v", "mountPath": "/m", "subPath": "../x"}]
        }))
        .expect("container");
        let volumes = PreparedVolumes {
            by_name: [(
                "v".to_string(),
                PreparedVolume {
                    path: PathBuf::from("/tmp"),
                    read_only: false,
                },
            )]
            .into(),
            pod_dir: PathBuf::from("/nonexistent"),
        };
        assert_eq!(
            mounts(&c, &volumes, &[]),
            Err(MountError::SubPath(
                "unable to provision SubPath `../x`: must not contain '..'".into()
            ))
        );
    }

    #[test]
    fn downward_volumes_are_written_and_mounted_read_only() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"b": "2", "a": "1"}},
            "spec": {
                "volumes": [
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "sub/labels", "fieldRef": {"fieldPath": "metadata.labels"}}
                    ]}},
                    {"name": "proj", "projected": {"sources": [{"downwardAPI": {"items": [
                        {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}
                    ]}}]}}
                ],
                "containers": [{
                    "name": "c",
                    "resources": {"limits": {"memory": "16Mi"}},
                    "volumeMounts": [{"name": "info", "mountPath": "/info"}, {"name": "proj", "mountPath": "/proj"}]
                }]
            }
        }))
        .expect("pod");
        let pod_dir = std::env::temp_dir().join(format!("berth-volumes-{}", std::process::id()));
        let volumes = prepare(&pod, &pod_dir, &ApiVolumeFiles::new()).expect("prepare");
        let info = volumes.path("info").expect("info").to_path_buf();
        let read = |p: PathBuf| std::fs::read_to_string(p).expect("read");
        assert_eq!(read(info.join("name")), "p");
        assert_eq!(read(info.join("sub/labels")), "a=\"1\"\nb=\"2\"");
        assert_eq!(read(volumes.path("proj").expect("proj").join("mem")), "16");
        let c = &pod.spec.as_ref().expect("spec").containers[0];
        let m = mounts(c, &volumes, &[]).expect("mounts");
        assert!(m.iter().all(|m| m.readonly), "{m:?}");
        let _ = std::fs::remove_dir_all(&pod_dir);
    }

    #[test]
    fn only_downward_sources_of_projected_volumes() {
        let v: Volume = serde_json::from_value(serde_json::json!({
            "name": "p", "projected": {"sources": [{"secret": {"name": "s"}}]}
        }))
        .expect("volume");
        assert!(check_supported(&v).is_err());
    }
}
