//! Host-side preparation of a container's volumes: image volumes, host-path propagation, and the termination message file.
//!
//! - Image volumes (CRI `Mount.image`): a read-only `view` snapshot of the image's layer chain,
//!   mounted at `<bundle>/imagevols/<mount index>` and bound into the container from there (or
//!   from a sub path of it). The snapshot key is `container-<id>-imgvol-<index>`, so removal
//!   needs only the container id and its bundle ([`undo_image_volumes`]).
//! - Host paths mounted with BIDIRECTIONAL or HOST_TO_CONTAINER propagation need a shared mount
//!   on the host to receive (and, for BIDIRECTIONAL, to send) events: a private one is made
//!   shared, as the kubelet's documentation asks of the node.
//! - The termination message: when the kubelet's annotation names a path and no CRI mount
//!   covers it, Berth creates `<bundle>/termination-log` and binds it there.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;

use super::CreateError;
use crate::image::ImageManager;

/// The kubelet's annotation naming the termination message path.
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Host file that receives the termination message, in the bundle.
pub const TERMINATION_LOG: &str = "termination-log";
/// At most this much of the termination message is reported.
pub const MAX_TERMINATION_MESSAGE: u64 = 4096;
/// Directory of the image volume mounts, in the bundle.
const IMAGE_VOLUMES_DIR: &str = "imagevols";

/// Snapshot key of image volume `index` of container `id`.
fn image_volume_key(id: &str, index: usize) -> String {
    format!("container-{id}-imgvol-{index}")
}

/// Mounts every image volume of `config` read-only under the bundle and returns the host
/// directory to bind for each (by mount index). On error, what was done so far is left for
/// [`undo_image_volumes`] (the caller's `Prepared::undo`).
pub fn prepare_image_volumes(
    images: &ImageManager,
    id: &str,
    bundle: &Path,
    config: &cri::ContainerConfig,
    sub_paths: &[String],
) -> Result<HashMap<usize, PathBuf>, CreateError> {
    let mut out = HashMap::new();
    for (i, m) in config.mounts.iter().enumerate() {
        let Some(spec) = m.image.as_ref().filter(|s| !s.image.is_empty()) else {
            continue;
        };
        let field = |f: &str| format!("mounts[{i}].{f}");
        crate::runtime::spec::check_image_volume(m, &field)
            .map_err(|e| CreateError::InvalidArgument(format!("CreateContainer: {e}")))?;
        let image = images
            .status(&spec.image)
            .map_err(|e| {
                CreateError::InvalidArgument(format!("CreateContainer: {}: {e}", field("image")))
            })?
            .ok_or_else(|| {
                CreateError::NotFound(format!(
                    "CreateContainer: {}: image {} not found (pull it first)",
                    field("image"),
                    spec.image
                ))
            })?;
        let target = bundle.join(IMAGE_VOLUMES_DIR).join(i.to_string());
        std::fs::create_dir_all(&target).map_err(|e| {
            CreateError::Internal(format!(
                "CreateContainer {id}: creating {}: {e}",
                target.display()
            ))
        })?;
        let key = image_volume_key(id, i);
        let parent = image.record.chain_ids.last().map(String::as_str);
        let mounts = images
            .snapshotter()
            .view(&key, parent, Default::default())
            .map_err(|e| {
                CreateError::Internal(format!(
                    "CreateContainer {id}: image volume snapshot of {}: {e}",
                    spec.image
                ))
            })?;
        for mnt in &mounts {
            mnt.mount(&target).map_err(|e| {
                CreateError::Internal(format!(
                    "CreateContainer {id}: mounting image volume {}: {e}",
                    spec.image
                ))
            })?;
        }
        let sub_path = sub_paths.get(i).map_or("", String::as_str);
        let source = image_volume_source(&target, sub_path, &field("image_sub_path"))?;
        tracing::debug!(container = %id, image = %spec.image, source = %source.display(), "image volume mounted");
        out.insert(i, source);
    }
    Ok(out)
}

/// The directory to bind for an image volume with `sub_path` ("" for the whole image):
/// resolved inside the image's root so that no symlink leads out of it; it must exist.
pub fn image_volume_source(
    root: &Path,
    sub_path: &str,
    field: &str,
) -> Result<PathBuf, CreateError> {
    if sub_path.is_empty() {
        return Ok(root.to_path_buf());
    }
    let rel = Path::new(sub_path);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(CreateError::InvalidArgument(format!(
            "CreateContainer: invalid {field}: {sub_path:?} must be relative, without \"..\""
        )));
    }
    match crate::runtime::spec_user::resolve_in_root(root, rel) {
        Ok(Some(p)) if p.exists() => Ok(p),
        Ok(_) => Err(CreateError::InvalidArgument(format!(
            "CreateContainer: invalid {field}: {sub_path:?} does not exist in the image"
        ))),
        Err(e) => Err(CreateError::Internal(format!(
            "CreateContainer: resolving {field} {sub_path:?}: {e}"
        ))),
    }
}

/// Unmounts the image volumes of container `id` and removes their snapshots. Idempotent.
pub fn undo_image_volumes(images: &ImageManager, id: &str, bundle: &Path) {
    let dir = bundle.join(IMAGE_VOLUMES_DIR);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let target = entry.path();
            if is_mount_point(&target)
                && let Err(e) = berth_snapshotter::unmount(&target)
            {
                tracing::warn!(target = %target.display(), error = %e, "unmounting image volume");
            }
        }
    }
    let prefix = format!("container-{id}-imgvol-");
    let snapshots = images.snapshotter();
    match snapshots.list() {
        Ok(list) => {
            for info in list.iter().filter(|i| i.name.starts_with(&prefix)) {
                if let Err(e) = snapshots.remove(&info.name) {
                    tracing::warn!(snapshot = %info.name, error = %e, "removing image volume snapshot");
                }
            }
        }
        Err(e) => tracing::warn!(container = %id, error = %e, "listing snapshots"),
    }
}

/// True if `path` is the root of a mount (its device differs from its parent's, or
/// /proc/self/mountinfo lists it).
fn is_mount_point(path: &Path) -> bool {
    mount_of(path).is_some_and(|m| m.mount_point == path)
}

/// One line of /proc/self/mountinfo, the fields Berth uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    /// `shared:N` present: the mount is a member of a peer group.
    pub shared: bool,
    /// `master:N` present: the mount receives events from a peer group.
    pub slave: bool,
}

/// Decodes the octal escapes (`\040`) of a mountinfo path.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/self/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = fields.get(4)?;
            let sep = fields.iter().position(|f| *f == "-")?;
            let optional = fields.get(6..sep).unwrap_or_default();
            Some(MountInfo {
                mount_point: PathBuf::from(unescape(mount_point)),
                shared: optional.iter().any(|f| f.starts_with("shared:")),
                slave: optional.iter().any(|f| f.starts_with("master:")),
            })
        })
        .collect()
}

/// The mount `path` lives on (the last, i.e. topmost, of the longest matching mount points).
fn mount_of(path: &Path) -> Option<MountInfo> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<MountInfo> = None;
    for m in parse_mountinfo(&text) {
        if path.starts_with(&m.mount_point)
            && best.as_ref().is_none_or(|b| {
                m.mount_point.components().count() >= b.mount_point.components().count()
            })
        {
            best = Some(m);
        }
    }
    best
}

/// Creates (as directories, like containerd) the absolute host paths of CRI bind mounts that do
/// not exist; returns every directory it made, parents first.
pub fn create_missing_host_paths(
    config: &cri::ContainerConfig,
) -> Result<Vec<PathBuf>, CreateError> {
    let mut made = Vec::new();
    for (i, m) in config.mounts.iter().enumerate() {
        let host = Path::new(&m.host_path);
        if m.host_path.is_empty() || !host.is_absolute() || host.symlink_metadata().is_ok() {
            continue;
        }
        let mut missing: Vec<PathBuf> = host
            .ancestors()
            .take_while(|a| a.symlink_metadata().is_err())
            .map(Path::to_path_buf)
            .collect();
        missing.reverse();
        std::fs::create_dir_all(host).map_err(|e| {
            CreateError::Internal(format!(
                "CreateContainer: mounts[{i}]: creating host path {}: {e}",
                host.display()
            ))
        })?;
        tracing::debug!(host_path = %host.display(), "created missing host path");
        made.extend(missing);
    }
    Ok(made)
}

/// Makes the host mounts that BIDIRECTIONAL / HOST_TO_CONTAINER CRI mounts bind from shared,
/// unless they already are (or, for HOST_TO_CONTAINER, are slaves: they get events too).
pub fn ensure_host_propagation(config: &cri::ContainerConfig) -> Result<(), CreateError> {
    use cri::MountPropagation as P;
    for (i, m) in config.mounts.iter().enumerate() {
        let bidirectional = m.propagation == P::PropagationBidirectional as i32;
        let to_container = m.propagation == P::PropagationHostToContainer as i32;
        if !(bidirectional || to_container) || m.host_path.is_empty() {
            continue;
        }
        let Ok(source) = std::fs::canonicalize(&m.host_path) else {
            continue; // a missing host path is created later, on the (shared or not) parent
        };
        let Some(mount) = mount_of(&source) else {
            continue;
        };
        if mount.shared || (to_container && mount.slave) {
            continue;
        }
        tracing::info!(
            mount = %mount.mount_point.display(),
            host_path = %m.host_path,
            "making the host mount shared for mounts[{i}] propagation"
        );
        rustix::mount::mount_change(
            &mount.mount_point,
            rustix::mount::MountPropagationFlags::SHARED,
        )
        .map_err(|e| {
            CreateError::Internal(format!(
                "CreateContainer: mounts[{i}]: making {} shared for {} propagation: {e}",
                mount.mount_point.display(),
                if bidirectional {
                    "bidirectional"
                } else {
                    "host-to-container"
                }
            ))
        })?;
    }
    Ok(())
}

/// Creates the termination message file in the bundle when the kubelet's annotation names a
/// path that no CRI mount covers; returns (host file, container path).
pub fn prepare_termination_log(
    bundle: &Path,
    config: &cri::ContainerConfig,
) -> Result<Option<(PathBuf, PathBuf)>, CreateError> {
    let Some(path) = config
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
        .filter(|p| !p.is_empty())
    else {
        return Ok(None);
    };
    if !path.starts_with('/') {
        return Err(CreateError::InvalidArgument(format!(
            "CreateContainer: invalid annotation {ANNOTATION_TERMINATION_MESSAGE_PATH}: {path:?} is not an absolute path"
        )));
    }
    if config.mounts.iter().any(|m| m.container_path == *path) {
        return Ok(None);
    }
    let host = bundle.join(TERMINATION_LOG);
    let made = std::fs::File::create(&host).and_then(|_| {
        use std::os::unix::fs::PermissionsExt;
        // Any container user may write its message.
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o666))
    });
    made.map_err(|e| {
        CreateError::Internal(format!("CreateContainer: creating {}: {e}", host.display()))
    })?;
    Ok(Some((host, PathBuf::from(path))))
}

/// The termination message of a container whose termination message file Berth made itself
/// (no CRI mount at the annotated path), at most 4 KiB of it. A file the client mounted there
/// is the client's to read: the kubelet reads its own file and appends the text to
/// `ContainerStatus.message` itself, so reporting it here too would show it twice.
pub fn read_termination_message(bundle: &Path, config: &cri::ContainerConfig) -> String {
    let Some(path) = config
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
        .filter(|p| !p.is_empty())
    else {
        return String::new();
    };
    if config.mounts.iter().any(|m| m.container_path == *path) {
        return String::new();
    }
    let host = bundle.join(TERMINATION_LOG);
    let Ok(file) = std::fs::File::open(&host) else {
        return String::new();
    };
    let mut buf = Vec::new();
    if let Err(e) = file.take(MAX_TERMINATION_MESSAGE).read_to_end(&mut buf) {
        tracing::debug!(path = %host.display(), error = %e, "reading termination message");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_parsing() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    30 22 0:5 / /mnt/a\\040b rw master:3 - tmpfs tmpfs rw\n\
                    31 22 0:6 / /priv rw - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert!(m[0].shared && !m[0].slave);
        assert_eq!(m[1].mount_point, Path::new("/mnt/a b"));
        assert!(m[1].slave && !m[1].shared);
        assert!(!m[2].shared && !m[2].slave);
    }

    #[test]
    fn image_volume_sub_paths() {
        let root = std::env::temp_dir().join(format!("berth-imgvol-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        assert_eq!(image_volume_source(&root, "", "f").unwrap(), root);
        assert_eq!(
            image_volume_source(&root, "etc", "f").unwrap(),
            root.join("etc")
        );
        // An absolute symlink resolves inside the image root.
        assert_eq!(
            image_volume_source(&root, "link", "f").unwrap(),
            root.join("etc")
        );
        for bad in ["missing", "../etc", "/etc"] {
            let e = image_volume_source(&root, bad, "f").unwrap_err();
            assert!(matches!(e, CreateError::InvalidArgument(_)), "{bad}: {e}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn termination_log_created_only_when_uncovered() {
        let bundle = std::env::temp_dir().join(format!("berth-termlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&bundle);
        std::fs::create_dir_all(&bundle).unwrap();
        let mut config = cri::ContainerConfig::default();
        assert!(prepare_termination_log(&bundle, &config).unwrap().is_none());
        config.annotations.insert(
            ANNOTATION_TERMINATION_MESSAGE_PATH.into(),
            "/dev/termination-log".into(),
        );
        let (host, dest) = prepare_termination_log(&bundle, &config).unwrap().unwrap();
        assert_eq!(dest, Path::new("/dev/termination-log"));
        std::fs::write(&host, "x".repeat(5000)).unwrap();
        assert_eq!(read_termination_message(&bundle, &config).len(), 4096);
        let hostfile = bundle.join("kubelet-file");
        std::fs::write(&hostfile, "from kubelet").unwrap();
        config.mounts.push(cri::Mount {
            container_path: "/dev/termination-log".into(),
            host_path: hostfile.to_string_lossy().into_owned(),
            ..Default::default()
        });
        assert!(prepare_termination_log(&bundle, &config).unwrap().is_none());
        // The mounted file is the client's to read (the kubelet appends it to the message).
        assert_eq!(read_termination_message(&bundle, &config), "");
        let _ = std::fs::remove_dir_all(&bundle);
    }
}
