//! subPath mounts that cannot leave their volume: the path is resolved beneath the volume's root
//! through file descriptors (a symlink may point only inside the volume), and the file found is
//! bind-mounted onto a path of the pod's directory that the runtime gets instead.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

/// Symlinks followed in one resolution before giving up (the kernel's own limit).
const MAX_SYMLINKS: usize = 40;

/// Where the binds of the pod's subPaths go, under the pod's directory.
const SUBPATHS_DIR: &str = "volume-subpaths";

/// One subPath of one volumeMount.
pub struct SubPath<'a> {
    /// The volume's directory on the host.
    pub volume_root: &'a Path,
    /// The volume's name.
    pub volume: &'a str,
    /// The subPath (already expanded from subPathExpr).
    pub sub_path: &'a str,
    /// The volumeMount's name (for messages).
    pub mount_name: &'a str,
    /// The container's name.
    pub container: &'a str,
    /// The volumeMount's index in the container's list.
    pub index: usize,
    /// The pod's directory.
    pub pod_dir: &'a Path,
}

/// The kubelet's checks of the subPath's text: relative, and no `..` element.
pub fn check_text(sub_path: &str) -> Result<(), String> {
    if Path::new(sub_path).is_absolute() {
        return Err(format!(
            "error SubPath `{sub_path}` must not be an absolute path"
        ));
    }
    if sub_path.split('/').any(|part| part == "..") {
        return Err(format!(
            "unable to provision SubPath `{sub_path}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// `$(VAR)` in a subPathExpr replaced by the container's env values (`$$` is a `$`); a name
/// without a value is an error, as the kubelet's.
pub fn expand(expr: &str, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let (out, mut missing) =
        crate::agent::runtime::container_config::expand_references(expr, |name| {
            env(name).filter(|v| !v.is_empty())
        });
    if !missing.is_empty() {
        missing.sort();
        return Err(format!("missing value for {}", missing.join(", ")));
    }
    Ok(out)
}

/// Makes subPath `s` ready: creates it (directories only) when missing, opens it beneath the
/// volume's root, binds what it opened onto `<pod dir>/volume-subpaths/<volume>/<container>/
/// <index>` (a bind left by an earlier instance of the container is replaced) and returns that
/// path. The error is the kubelet's message, which names the volumeMount and the container but
/// nothing of the host; the reason goes to the log.
pub fn prepare(s: &SubPath<'_>) -> Result<PathBuf, String> {
    check_text(s.sub_path)?;
    let refused = |step: &str, why: String| {
        tracing::warn!(
            volume_mount = %s.mount_name,
            container = %s.container,
            sub_path = %s.sub_path,
            error = %why,
            "{step}"
        );
    };
    let root = rustix::fs::open(
        s.volume_root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("opening the volume {}: {e}", s.volume_root.display()))?;
    // Which of the kubelet's steps fails decides the message; whether the path exists (seen
    // through symlinks) only picks the step.
    if std::fs::metadata(s.volume_root.join(s.sub_path)).is_err() {
        let mode = rustix::fs::fstat(&root)
            .map(|st| Mode::from_raw_mode(st.st_mode) & Mode::from_raw_mode(0o7777))
            .unwrap_or_else(|_| Mode::from_raw_mode(0o755));
        if let Err(e) = resolve_walk(root.as_fd(), Path::new(s.sub_path), Some(mode)) {
            refused("creating a subPath", e.to_string());
            return Err(format!(
                "failed to create subPath directory for volumeMount {:?} of container {:?}",
                s.mount_name, s.container
            ));
        }
    }
    bind(s, root.as_fd()).map_err(|why| {
        refused("preparing a subPath", why);
        format!(
            "failed to prepare subPath for volumeMount {:?} of container {:?}",
            s.mount_name, s.container
        )
    })
}

/// Opens the subPath beneath `root` and binds it onto its target; returns the target.
fn bind(s: &SubPath<'_>, root: BorrowedFd<'_>) -> Result<PathBuf, String> {
    let source = open_beneath(root, Path::new(s.sub_path)).map_err(|e| e.to_string())?;
    let st = rustix::fs::fstat(&source).map_err(|e| format!("fstat: {e}"))?;
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
    for name in [s.volume, s.container] {
        if !is_one_component(name) {
            return Err(format!("{name:?} cannot name a directory"));
        }
    }
    let parent = s
        .pod_dir
        .join(SUBPATHS_DIR)
        .join(s.volume)
        .join(s.container);
    std::fs::create_dir_all(&parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let target = parent.join(s.index.to_string());
    unmount_all_at(&target);
    // The target is a directory for a directory, else an empty file.
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() == is_dir && (is_dir || m.is_file()) => {}
        Ok(m) => {
            let removed = if m.is_dir() {
                std::fs::remove_dir(&target)
            } else {
                std::fs::remove_file(&target)
            };
            removed.map_err(|e| format!("removing {}: {e}", target.display()))?;
            make_target(&target, is_dir)?;
        }
        Err(_) => make_target(&target, is_dir)?,
    }
    let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&source));
    rustix::mount::mount_bind(proc_path.as_str(), &target)
        .map_err(|e| format!("binding onto {}: {e}", target.display()))?;
    // What the target shows now must be what was opened.
    let mounted = rustix::fs::statat(rustix::fs::CWD, &target, AtFlags::SYMLINK_NOFOLLOW);
    if !mounted.is_ok_and(|m| m.st_dev == st.st_dev && m.st_ino == st.st_ino) {
        unmount_all_at(&target);
        return Err(format!("{} is not the file opened", target.display()));
    }
    Ok(target)
}

/// Creates a bind target: a directory, or an empty file.
fn make_target(target: &Path, is_dir: bool) -> Result<(), String> {
    let made = if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(drop)
    };
    made.map_err(|e| format!("creating {}: {e}", target.display()))
}

/// Whether `name` is one plain path component (no `/`, not `.` or `..`).
fn is_one_component(name: &str) -> bool {
    let mut c = Path::new(name).components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
}

/// Unmounts every mount stacked on `target` (none: nothing happens); symlinks are not followed.
fn unmount_all_at(target: &Path) {
    for _ in 0..64 {
        match rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => continue,
            Err(Errno::INVAL | Errno::NOENT) => return,
            Err(e) => {
                tracing::warn!(target = %target.display(), error = %e, "unmounting a subPath bind");
                return;
            }
        }
    }
}

/// Opens `rel` beneath `root` for a bind (`O_PATH`): symlinks are followed only while they stay
/// beneath `root`. openat2 with `RESOLVE_BENEATH` where the kernel has it, else a walk.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &Path) -> std::io::Result<OwnedFd> {
    match rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(fd),
        // No openat2 (before Linux 5.6, or filtered), or a rename raced the lookup.
        Err(Errno::NOSYS | Errno::PERM | Errno::AGAIN) => Ok(resolve_walk(root, rel, None)?),
        Err(e) => Err(e.into()),
    }
}

/// Resolves `rel` beneath `root` one component at a time with `O_NOFOLLOW`, reading each symlink
/// met and resolving its target beneath `root` too (an absolute target, or `..` above `root`, is
/// refused); with `create`, a missing component is made a directory of that mode. Returns an
/// `O_PATH` descriptor of what `rel` names.
pub fn resolve_walk(
    root: BorrowedFd<'_>,
    rel: &Path,
    create: Option<Mode>,
) -> std::io::Result<OwnedFd> {
    let escape = || std::io::Error::other("the path leaves the volume");
    let mut pending: VecDeque<OsString> = components(rel)?;
    // The directories resolved so far, deepest last (empty: the root itself).
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            stack.pop().ok_or_else(escape)?;
            continue;
        }
        let dir = stack.last().map_or(root, |fd| fd.as_fd());
        let opened = rustix::fs::openat(
            dir,
            name.as_os_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let fd = match (opened, create) {
            (Ok(fd), _) => fd,
            (Err(Errno::NOENT), Some(mode)) => make_dir(dir, &name, mode)?,
            (Err(e), _) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&fd)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Errno::LOOP.into());
                }
                let target = rustix::fs::readlinkat(dir, name.as_os_str(), Vec::new())?;
                let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
                if target.is_absolute() {
                    return Err(escape());
                }
                let mut more = components(&target)?;
                more.extend(pending);
                pending = more;
            }
            FileType::Directory => stack.push(fd),
            _ if pending.is_empty() => return Ok(fd),
            _ => return Err(Errno::NOTDIR.into()),
        }
    }
    match stack.pop() {
        Some(fd) => Ok(fd),
        None => Ok(rustix::fs::openat(
            root,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?),
    }
}

/// The names of `rel` (`..` kept, `.` dropped); an absolute path is refused.
fn components(rel: &Path) -> std::io::Result<VecDeque<OsString>> {
    let mut out = VecDeque::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push_back(n.to_os_string()),
            Component::ParentDir => out.push_back(OsString::from("..")),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(std::io::Error::other("the path leaves the volume"));
            }
        }
    }
    Ok(out)
}

/// Makes directory `name` in `dir` (mode `mode`, whatever the umask) and opens it without
/// following a symlink put there meanwhile.
fn make_dir(dir: BorrowedFd<'_>, name: &OsString, mode: Mode) -> std::io::Result<OwnedFd> {
    match rustix::fs::mkdirat(dir, name.as_os_str(), mode) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = rustix::fs::openat(
        dir,
        name.as_os_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchmod(&fd, mode)?;
    Ok(fd)
}

/// The mount points at or under `dir` in this process's mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(&dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// A mountinfo path with its octal escapes (`\040` for a space, ...) decoded.
fn unescape(field: &str) -> OsString {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Unmounts the binds of the pod's subPaths and removes their targets. Returns false when a
/// bind could not be unmounted (its directory is left as it is).
pub fn unmount_all(pod_dir: &Path) -> bool {
    let dir = pod_dir.join(SUBPATHS_DIR);
    if !dir.exists() {
        return true;
    }
    for m in mounts_under(&dir) {
        unmount_all_at(&m);
    }
    if !mounts_under(&dir).is_empty() {
        tracing::warn!(dir = %dir.display(), "subPath binds left mounted");
        return false;
    }
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "removing the subPath binds' directory");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_path_text_is_checked_as_the_kubelet_does() {
        assert_eq!(check_text("a/b"), Ok(()));
        assert_eq!(check_text("a..b/c"), Ok(()));
        assert_eq!(
            check_text("../../.."),
            Err("unable to provision SubPath `../../..`: must not contain '..'".into())
        );
        assert_eq!(
            check_text("a/../b"),
            Err("unable to provision SubPath `a/../b`: must not contain '..'".into())
        );
        assert_eq!(
            check_text("/etc"),
            Err("error SubPath `/etc` must not be an absolute path".into())
        );
    }

    #[test]
    fn sub_path_expr_expands_env_and_names_what_is_missing() {
        let env = |k: &str| match k {
            "POD" => Some("p1".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand("logs/$(POD)", env), Ok("logs/p1".into()));
        assert_eq!(expand("a$$(POD)", env), Ok("a$(POD)".into()));
        assert_eq!(
            expand("$(B)/$(A)/$(EMPTY)/$(A)", env),
            Err("missing value for A, B, EMPTY".into())
        );
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/a\\040b\\134c"), OsString::from("/a b\\c"));
        assert_eq!(unescape("/x\\04"), OsString::from("/x\\04"));
    }

    /// A directory for one test: `vol` (the volume) and `host` (outside it, with a marker).
    fn scratch(tag: &str) -> (PathBuf, OwnedFd) {
        let base = std::env::temp_dir().join(format!("berth-subpath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("vol/in/deep")).expect("vol");
        std::fs::create_dir_all(base.join("host")).expect("host");
        std::fs::write(base.join("host/marker"), "m").expect("marker");
        std::fs::write(base.join("vol/in/deep/file"), "f").expect("file");
        let link = |target: &str, at: &str| {
            std::os::unix::fs::symlink(target, base.join("vol").join(at)).expect("symlink")
        };
        link(&base.join("host").display().to_string(), "abs");
        link("../host", "up");
        link("in/deep", "inside");
        link("../../in", "in/deep/back");
        link("loop", "loop");
        let root = rustix::fs::open(
            base.join("vol"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("root");
        (base, root)
    }

    fn ino(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).expect("fstat").st_ino as u64
    }

    fn path_ino(p: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"))
    }

    #[test]
    fn both_resolutions_stay_beneath_the_volume() {
        let (base, root) = scratch("resolve");
        type Open = fn(BorrowedFd<'_>, &Path) -> std::io::Result<OwnedFd>;
        let walk: Open = |r, p| resolve_walk(r, p, None);
        for (what, open) in [("openat2", open_beneath as Open), ("walk", walk)] {
            for escape in ["abs", "up", "abs/marker", "loop", "inside/back/../../.."] {
                assert!(
                    open(root.as_fd(), Path::new(escape)).is_err(),
                    "{what}: {escape}"
                );
            }
            let file = open(root.as_fd(), Path::new("inside/file")).expect("inside/file");
            assert_eq!(
                ino(&file),
                path_ino(&base.join("vol/in/deep/file")),
                "{what}"
            );
            let dir = open(root.as_fd(), Path::new("in/deep/back/deep")).expect("back");
            assert_eq!(ino(&dir), path_ino(&base.join("vol/in/deep")), "{what}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn the_walk_creates_missing_directories_but_never_through_a_symlink_out() {
        let (base, root) = scratch("create");
        let mode = Mode::from_raw_mode(0o777);
        let made = resolve_walk(root.as_fd(), Path::new("new/a/b"), Some(mode)).expect("made");
        assert_eq!(ino(&made), path_ino(&base.join("vol/new/a/b")));
        let m = std::fs::metadata(base.join("vol/new/a")).expect("a");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o777
        );
        assert!(resolve_walk(root.as_fd(), Path::new("abs/made"), Some(mode)).is_err());
        assert!(resolve_walk(root.as_fd(), Path::new("up/made"), Some(mode)).is_err());
        let host: Vec<_> = std::fs::read_dir(base.join("host"))
            .expect("host")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(host, vec![OsString::from("marker")]);
        let _ = std::fs::remove_dir_all(&base);
    }
}
