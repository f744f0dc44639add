//! A pod's fsGroup on its volumes, as the kubelet sets volume ownership: every entry's group
//! becomes the fsGroup, files gain group read (and write on writable volumes), directories
//! gain set-group-ID and search, so that what the containers make later inherits the group.
//!
//! It walks through directory descriptors and never follows a symbolic link (links get their
//! own group only), so a link planted in a volume cannot send it outside.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, OFlags};

/// Group read and write on the files of a writable volume (emptyDir).
const RW_MASK: u32 = 0o660;
/// Group read on the files of a read-only volume (configMap, secret, downwardAPI, projected).
const RO_MASK: u32 = 0o440;
/// Search for owner and group, and set-group-ID, on every directory.
const DIR_MASK: u32 = 0o110 | 0o2000;

/// The pod's fsGroup (`spec.securityContext.fsGroup`), if it has a usable one.
pub fn fs_group(pod: &Pod) -> Option<u32> {
    let gid = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(gid).ok().filter(|g| *g != u32::MAX)
}

/// Gives volume directory `dir` and everything in it group `gid` and the group's access
/// (`read_only`: read only).
pub fn apply(dir: &Path, gid: u32, read_only: bool) -> std::io::Result<()> {
    let root = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mask = if read_only { RO_MASK } else { RW_MASK };
    set(root.as_fd(), gid, mask | DIR_MASK)?;
    walk(root, gid, mask)
}

/// Sets the group of the open entry `fd` and adds `mask` to its mode.
fn set(fd: BorrowedFd<'_>, gid: u32, mask: u32) -> std::io::Result<()> {
    let group = Gid::from_raw(gid);
    rustix::fs::fchown(fd, None, Some(group))?;
    let mode = rustix::fs::fstat(fd)?.st_mode & 0o7777;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode | mask))?;
    Ok(())
}

/// Applies the group to every entry under the open directory `dir`.
fn walk(dir: OwnedFd, gid: u32, mask: u32) -> std::io::Result<()> {
    let entries = rustix::fs::Dir::read_from(&dir)?;
    let mut children = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        children.push(name);
    }
    for name in children {
        let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let child = rustix::fs::openat(
                    &dir,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                set(child.as_fd(), gid, mask | DIR_MASK)?;
                walk(child, gid, mask)?;
            }
            FileType::RegularFile => {
                let child = rustix::fs::openat(
                    &dir,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                set(child.as_fd(), gid, mask)?;
            }
            _ => {
                // Links (not followed), sockets, FIFOs and devices: the group only.
                let group = Gid::from_raw(gid);
                rustix::fs::chownat(&dir, &name, None, Some(group), AtFlags::SYMLINK_NOFOLLOW)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn group_and_modes_are_set_without_following_links() {
        let base = std::env::temp_dir().join(format!("berth-fsgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let vol = base.join("vol");
        let outside = base.join("outside");
        std::fs::create_dir_all(vol.join("sub")).expect("dirs");
        std::fs::write(vol.join("sub/file"), "x").expect("file");
        std::fs::set_permissions(vol.join("sub/file"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        std::fs::write(&outside, "host").expect("outside");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::symlink(&outside, vol.join("link")).expect("link");

        apply(&vol, 4321, false).expect("applied");

        let meta = |p: &Path| std::fs::symlink_metadata(p).expect("stat");
        assert_eq!(meta(&vol).gid(), 4321);
        assert_eq!(meta(&vol).mode() & 0o7777 & 0o2110, 0o2110);
        assert_eq!(meta(&vol.join("sub")).mode() & 0o2000, 0o2000);
        assert_eq!(meta(&vol.join("sub/file")).gid(), 4321);
        assert_eq!(meta(&vol.join("sub/file")).mode() & 0o777, 0o660);
        assert_eq!(meta(&vol.join("link")).gid(), 4321);
        // The link's target outside the volume is untouched.
        assert_eq!(meta(&outside).gid(), 0);
        assert_eq!(meta(&outside).mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn read_only_volumes_get_group_read_only() {
        let base = std::env::temp_dir().join(format!("berth-fsgroup-ro-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("dir");
        std::fs::write(base.join("f"), "x").expect("file");
        std::fs::set_permissions(base.join("f"), std::fs::Permissions::from_mode(0o400))
            .expect("chmod");
        apply(&base, 77, true).expect("applied");
        let m = std::fs::metadata(base.join("f")).expect("stat");
        assert_eq!((m.gid(), m.mode() & 0o777), (77, 0o440));
        let _ = std::fs::remove_dir_all(&base);
    }
}
