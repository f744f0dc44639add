//! Modes of the directories Berth keeps state in: closed to other users of the machine, and
//! searchable only where a user-namespaced pod's root must pass.
//!
//! Containers' root filesystems (with their setuid files), pods' secrets and emptyDirs, the
//! metadata database and the OCI specs (environment values) all live below these directories,
//! so no host user but root may reach them by path. A directory a user-namespaced pod's
//! process walks through (its bundle, its sandbox directory) belongs to that pod's root and
//! is 0700; their parents are 0711 (searchable, not listable).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Only root.
pub const PRIVATE: u32 = 0o700;
/// Searchable by everyone, listable by root only.
pub const SEARCHABLE: u32 = 0o711;
/// Files only root may read.
pub const PRIVATE_FILE: u32 = 0o600;

/// Makes `dir` (parents as needed, with the default mode) and sets its mode, also when it
/// was already there with another.
pub fn ensure(dir: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Sets `file`'s mode if it exists.
pub fn restrict_file(file: &Path, mode: u32) -> std::io::Result<()> {
    match std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A container's bundle or a pod's sandbox directory: root's only, or its pod root's when
/// the pod has its own user namespace (`owner` = that root's host uid and gid).
pub fn ensure_owned(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    ensure(dir, PRIVATE)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Gives the directories under `root` and `state_dir` their modes (made when missing; nodes
/// that ran an older Berth get theirs corrected) and the databases theirs.
pub fn secure_layout(root: &Path, state_dir: &Path) -> std::io::Result<()> {
    for dir in [root, state_dir] {
        ensure(dir, SEARCHABLE)?;
    }
    for (dir, mode) in [
        (root.join("containers"), SEARCHABLE),
        (root.join("agent"), PRIVATE),
        (root.join("content"), PRIVATE),
        (root.join("net"), PRIVATE),
        (root.join("snapshotter"), PRIVATE),
        (state_dir.join("sandboxes"), SEARCHABLE),
        (state_dir.join("containers"), PRIVATE),
        (state_dir.join("shims"), PRIVATE),
    ] {
        ensure(&dir, mode)?;
    }
    for file in [
        root.join("berth.redb"),
        root.join("snapshotter/metadata.redb"),
    ] {
        restrict_file(&file, PRIVATE_FILE)?;
    }
    Ok(())
}

/// Whether a user that is neither root nor an owner could read `path` if `top` (one of its
/// ancestors) were open to them: every directory from `top` down searchable by others and
/// `path` itself readable by them.
pub fn others_can_read(top: &Path, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let reachable = path
        .ancestors()
        .skip(1)
        .take_while(|d| d.starts_with(top))
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 != 0));
    reachable && std::fs::metadata(path).is_ok_and(|m| m.mode() & 0o004 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_layout_is_closed_and_existing_dirs_are_corrected() {
        let t = crate::util::ScratchDir::new("dir-modes");
        let (root, state) = (t.join("root"), t.join("state"));
        std::fs::create_dir_all(root.join("agent/pods")).expect("old layout");
        std::fs::set_permissions(root.join("agent"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::write(root.join("berth.redb"), b"db").expect("db");
        std::fs::set_permissions(
            root.join("berth.redb"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        std::fs::write(root.join("agent/pods/token"), b"secret").expect("token");
        secure_layout(&root, &state).expect("secure");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").mode() & 0o7777;
        assert_eq!(mode(&root), 0o711);
        assert_eq!(mode(&root.join("agent")), 0o700);
        assert_eq!(mode(&root.join("containers")), 0o711);
        assert_eq!(mode(&state.join("shims")), 0o700);
        assert_eq!(mode(&root.join("berth.redb")), 0o600);
        assert!(!others_can_read(&root, &root.join("agent/pods/token")));
        assert!(!others_can_read(&root, &root.join("berth.redb")));
        std::fs::write(root.join("containers/open"), b"x").expect("file");
        std::fs::set_permissions(
            root.join("containers/open"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        assert!(others_can_read(&root, &root.join("containers/open")));
    }

    #[test]
    fn an_owned_dir_belongs_to_the_pod_root() {
        let t = crate::util::ScratchDir::new("dir-modes-owned");
        let dir = t.join("bundle");
        ensure_owned(&dir, Some((65536, 65536))).expect("owned");
        let meta = std::fs::metadata(&dir).expect("meta");
        assert_eq!((meta.uid(), meta.gid()), (65536, 65536));
        assert_eq!(meta.mode() & 0o7777, PRIVATE);
    }
}
