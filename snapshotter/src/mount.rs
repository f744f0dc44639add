//! Mount descriptions returned by the snapshotter, and helpers that perform and undo them.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::StatVfsMountFlags;
use rustix::io::Errno;
use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::{Error, IoContext, Result};

/// The `mount(8)` binary used for mounts that need a working directory.
const MOUNT_BIN: &str = "/bin/mount";

/// One mount to perform, in the style of containerd's `mount.Mount`.
///
/// The snapshotter only describes mounts; [`Mount::mount`] performs one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mount {
    /// Filesystem type: `"overlay"` or `"bind"`.
    pub fstype: String,
    /// Mount source: `"overlay"` for overlays, the directory for binds.
    pub source: String,
    /// Mount options, such as `"rbind"`, `"ro"` or `"lowerdir=..."`.
    pub options: Vec<String>,
    /// Directory that relative paths in `options` are relative to.
    ///
    /// Set when absolute paths would not fit in the kernel's one-page limit on mount data; the
    /// mount must then be made by a process whose working directory is this one.
    pub cwd: Option<PathBuf>,
}

/// Mount options split into `mount(2)` flags and filesystem data.
#[derive(Debug)]
struct ParsedOptions {
    flags: MountFlags,
    bind: bool,
    recursive: bool,
    data: Vec<String>,
}

fn parse_options(options: &[String]) -> ParsedOptions {
    let mut parsed = ParsedOptions {
        flags: MountFlags::empty(),
        bind: false,
        recursive: false,
        data: Vec::new(),
    };
    for option in options {
        let (set, clear) = match option.as_str() {
            "bind" => {
                parsed.bind = true;
                continue;
            }
            "rbind" => {
                parsed.bind = true;
                parsed.recursive = true;
                continue;
            }
            "defaults" => continue,
            "ro" => (MountFlags::RDONLY, MountFlags::empty()),
            "rw" => (MountFlags::empty(), MountFlags::RDONLY),
            "nosuid" => (MountFlags::NOSUID, MountFlags::empty()),
            "suid" => (MountFlags::empty(), MountFlags::NOSUID),
            "nodev" => (MountFlags::NODEV, MountFlags::empty()),
            "dev" => (MountFlags::empty(), MountFlags::NODEV),
            "noexec" => (MountFlags::NOEXEC, MountFlags::empty()),
            "exec" => (MountFlags::empty(), MountFlags::NOEXEC),
            "noatime" => (MountFlags::NOATIME, MountFlags::empty()),
            "nodiratime" => (MountFlags::NODIRATIME, MountFlags::empty()),
            "relatime" => (MountFlags::RELATIME, MountFlags::empty()),
            "sync" => (MountFlags::SYNCHRONOUS, MountFlags::empty()),
            "async" => (MountFlags::empty(), MountFlags::SYNCHRONOUS),
            "dirsync" => (MountFlags::DIRSYNC, MountFlags::empty()),
            _ => {
                parsed.data.push(option.clone());
                continue;
            }
        };
        parsed.flags.insert(set);
        parsed.flags.remove(clear);
    }
    parsed
}

/// Per-mount flags that a read-only bind remount must repeat, or the kernel refuses it when they
/// are locked (as in a user namespace).
fn locked_flags(target: &Path) -> MountFlags {
    let Ok(st) = rustix::fs::statvfs(target) else {
        return MountFlags::empty();
    };
    let mut flags = MountFlags::empty();
    for (vfs, mount) in [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if st.f_flag.contains(vfs) {
            flags.insert(mount);
        }
    }
    flags
}

impl Mount {
    /// Performs this mount on `target`, which must be an existing directory.
    ///
    /// Without [`Mount::cwd`] this calls `mount(2)` directly (a bind is made with
    /// `MS_BIND|MS_REC` and then remounted read-only when asked). With a `cwd`, `/bin/mount` is
    /// run in that directory, so the calling process never changes its own working directory.
    pub fn mount(&self, target: &Path) -> Result<()> {
        match &self.cwd {
            None => self.mount_syscall(target),
            Some(cwd) => self.mount_command(cwd, target),
        }
    }

    fn mount_syscall(&self, target: &Path) -> Result<()> {
        let parsed = parse_options(&self.options);
        if parsed.bind || self.fstype == "bind" {
            return self.mount_bind(target, &parsed);
        }
        let data = CString::new(parsed.data.join(",")).map_err(|e| {
            Error::io(
                format!("{} mount options contain a NUL byte", self.fstype),
                target,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })?;
        let data = (!data.as_bytes().is_empty()).then_some(data.as_c_str());
        rustix::mount::mount(
            self.source.as_str(),
            target,
            self.fstype.as_str(),
            parsed.flags,
            data,
        )
        .map_err(std::io::Error::from)
        .io(
            || format!("mount {} from {:?}", self.fstype, self.source),
            target,
        )
    }

    fn mount_bind(&self, target: &Path, parsed: &ParsedOptions) -> Result<()> {
        let source = Path::new(&self.source);
        // A "bind" fstype without an explicit "bind" option means a recursive bind.
        let recursive = parsed.recursive || !parsed.bind;
        let bound = if recursive {
            rustix::mount::mount_bind_recursive(source, target)
        } else {
            rustix::mount::mount_bind(source, target)
        };
        bound
            .map_err(std::io::Error::from)
            .io(|| format!("bind mount {:?}", self.source), target)?;
        if parsed.flags.is_empty() {
            return Ok(());
        }
        let flags = MountFlags::BIND | parsed.flags | locked_flags(target);
        if let Err(e) = rustix::mount::mount_remount(target, flags, "") {
            if let Err(undo) = unmount(target) {
                tracing::warn!(target = %target.display(), error = %undo, "undoing failed bind mount");
            }
            return Err(Error::io(
                format!("remount bind of {:?} with {:?}", self.source, parsed.flags),
                target,
                e.into(),
            ));
        }
        Ok(())
    }

    fn mount_command(&self, cwd: &Path, target: &Path) -> Result<()> {
        // The child runs in `cwd`, so a relative target would be resolved against the wrong
        // directory.
        let target = if target.is_absolute() {
            target.to_path_buf()
        } else {
            std::env::current_dir()
                .io(|| "resolve mount target".to_string(), target)?
                .join(target)
        };
        let mut cmd = Command::new(MOUNT_BIN);
        if self.fstype != "bind" {
            cmd.arg("-t").arg(&self.fstype);
        }
        cmd.arg("-o")
            .arg(self.options.join(","))
            .arg(&self.source)
            .arg(&target)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let output = cmd.output().io(
            || {
                format!(
                    "run {MOUNT_BIN} for {} mount in {}",
                    self.fstype,
                    cwd.display()
                )
            },
            &target,
        )?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(Error::io(
            format!("{MOUNT_BIN} -t {} in {}", self.fstype, cwd.display()),
            &target,
            std::io::Error::other(format!("{}: {}", output.status, stderr.trim())),
        ))
    }
}

/// Unmounts `target` with `umount2(2)`, detaching it lazily if it is busy.
pub fn unmount(target: &Path) -> Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        Err(Errno::BUSY) => {
            tracing::debug!(target = %target.display(), "mount busy, detaching lazily");
            rustix::mount::unmount(target, UnmountFlags::DETACH)
                .map_err(std::io::Error::from)
                .io(|| "lazy unmount".to_string(), target)
        }
        Err(e) => Err(Error::io("unmount", target, e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_into_flags_and_data() {
        let opts: Vec<String> = ["ro", "nosuid", "index=off", "lowerdir=a:b", "rw", "nodev"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let parsed = parse_options(&opts);
        assert_eq!(parsed.flags, MountFlags::NOSUID | MountFlags::NODEV);
        assert_eq!(parsed.data, vec!["index=off", "lowerdir=a:b"]);
        assert!(!parsed.bind);

        let parsed = parse_options(&["rbind".to_string(), "ro".to_string()]);
        assert!(parsed.bind && parsed.recursive);
        assert_eq!(parsed.flags, MountFlags::RDONLY);
    }
}
