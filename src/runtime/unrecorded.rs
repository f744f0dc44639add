//! Start-up sweep of what no record names: container bundles (with their rootfs and image
//! volume mounts), container snapshots and pod sandbox directories (with their namespace pins
//! and /dev/shm) that a berthd killed between making them and saving their record left.
//!
//! Records are saved before a pod's side effects and after a container's bundle is prepared;
//! the sweep closes that window: whatever is on disk and unnamed belongs to nobody.

use std::collections::HashSet;
use std::path::Path;

use crate::image::ImageManager;

/// Prefix of every container snapshot key (`container-<id>`, `container-<id>-imgvol-<n>`).
const CONTAINER_SNAPSHOT_PREFIX: &str = "container-";

/// What the sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Directories (bundles or sandbox directories).
    pub dirs: usize,
    /// Mounts detached below them.
    pub mounts: usize,
    /// Snapshots.
    pub snapshots: usize,
}

/// Detaches every mount at or below `dir`, deepest first; how many there were.
pub fn unmount_below(dir: &Path) -> usize {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let mut points: Vec<_> = super::container_create::volumes::parse_mountinfo(&text)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    let mut n = 0;
    for point in points {
        // Stacked mounts on one point: detach until none is left there.
        while rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH).is_ok() {
            n += 1;
        }
    }
    n
}

/// Removes the entries of `parent` whose names are not in `known` (nor start with one of
/// `skip`), with every mount below them.
pub fn sweep_dirs(parent: &Path, known: &HashSet<String>, skip: &[&str], what: &str) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return swept;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if known.contains(&name) || skip.iter().any(|s| name.starts_with(s)) {
            continue;
        }
        let path = entry.path();
        swept.mounts += unmount_below(&path);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                swept.dirs += 1;
                tracing::info!(path = %path.display(), "removed the {what} of no record");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "removing the {what} of no record")
            }
        }
    }
    swept
}

/// Removes container snapshots whose container is not in `known`.
pub fn sweep_snapshots(images: &ImageManager, known: &HashSet<String>) -> usize {
    let snapshots = images.snapshotter();
    let Ok(list) = snapshots.list() else {
        return 0;
    };
    let mut n = 0;
    for info in list {
        let Some(rest) = info.name.strip_prefix(CONTAINER_SNAPSHOT_PREFIX) else {
            continue;
        };
        let id = rest.split('-').next().unwrap_or(rest);
        if known.contains(id) {
            continue;
        }
        match snapshots.detach(&info.name) {
            Ok(dir) => {
                n += 1;
                tracing::info!(snapshot = %info.name, "removed a container snapshot of no record");
                if let Some(dir) = dir {
                    super::container_create::delete_dirs(vec![dir]);
                }
            }
            Err(e) => {
                tracing::warn!(snapshot = %info.name, error = %e, "removing a container snapshot of no record")
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_dirs_go_with_their_mounts_and_known_ones_stay() {
        let t = crate::util::ScratchDir::new("unrecorded");
        for name in ["known", "unknown", "rm-aside"] {
            std::fs::create_dir_all(t.join(name).join("sub")).expect("dir");
        }
        let target = t.join("unknown/sub");
        rustix::mount::mount(
            "tmpfs",
            &target,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .expect("tmpfs");
        std::fs::write(target.join("f"), b"x").expect("file");
        let known: HashSet<String> = ["known".to_string()].into();
        let swept = sweep_dirs(&t, &known, &["rm-"], "test dir");
        assert_eq!(
            swept,
            Swept {
                dirs: 1,
                mounts: 1,
                snapshots: 0
            }
        );
        assert!(t.join("known/sub").is_dir());
        assert!(t.join("rm-aside").is_dir());
        assert!(!t.join("unknown").exists());
    }
}
