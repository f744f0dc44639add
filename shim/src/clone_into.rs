//! Forking straight into a cgroup v2 directory: clone3 with CLONE_INTO_CGROUP (Linux 5.7), so
//! the exec's first child starts in the container's cgroup instead of being migrated there by
//! a write to `cgroup.procs` after the fork (a migration takes the kernel's global
//! thread-group lock, which every fork and exit on the host contends for).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::{ForkResult, Pid};

/// `CLONE_INTO_CGROUP` from linux/sched.h.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// clone3's arguments: linux/sched.h's `struct clone_args` up to `cgroup` (its second version).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Opens the cgroup v2 directory `dir` for [`fork_into`].
pub fn open_cgroup(dir: &Path) -> std::io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)?;
    Ok(file.into())
}

/// Forks a child that starts in the cgroup `cgroup` (a cgroup v2 directory). An error means
/// no child was made (a kernel without clone3 or CLONE_INTO_CGROUP, a cgroup that cannot take
/// the process): the caller forks and moves the child itself.
///
/// # Safety
/// As `fork`: the calling process must be single-threaded, since the child is a copy of this
/// thread alone and, unlike glibc's `fork`, nothing prepares the C library's locks for it.
pub unsafe fn fork_into(cgroup: &OwnedFd) -> nix::Result<ForkResult> {
    let fd = u64::try_from(cgroup.as_raw_fd()).map_err(|_| Errno::EBADF)?;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: fd,
        ..Default::default()
    };
    // SAFETY: `args` is a valid clone_args of the size given, alive for the call; with no
    // CLONE_VM and no stack the child runs on a copy of this address space, as after fork,
    // and the caller guarantees no other thread exists.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        -1 => Err(Errno::last()),
        0 => Ok(ForkResult::Child),
        pid => {
            let pid = i32::try_from(pid).map_err(|_| Errno::ERANGE)?;
            Ok(ForkResult::Parent {
                child: Pid::from_raw(pid),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the kernel reads: eleven 64-bit fields, CLONE_ARGS_SIZE_VER2.
    #[test]
    fn clone_args_is_the_kernels_second_version() {
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }

    /// The child starts in the cgroup given: its own `/proc/self/cgroup` says so before it
    /// does anything else.
    #[test]
    fn the_child_starts_in_the_cgroup() {
        let Some(root) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|p| {
                nix::sys::statfs::statfs(*p)
                    .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            })
        else {
            panic!("no cgroup v2 hierarchy mounted");
        };
        let name = format!("berth-clone-into-{}", std::process::id());
        let dir = root.join(&name);
        std::fs::create_dir(&dir).expect("make a cgroup");
        let fd = open_cgroup(&dir).expect("open the cgroup");
        let want = format!("0::/{name}\n");
        // SAFETY: the child makes no allocation (the test harness has other threads, whose
        // locks it may not take): raw open and read into a stack buffer, then _exit.
        let forked = unsafe { fork_into(&fd) };
        let code = match forked {
            Ok(ForkResult::Child) => {
                let mut buf = [0u8; 512];
                // SAFETY: a NUL-terminated path and a buffer of the length given.
                let n = unsafe {
                    let f = libc::open(c"/proc/self/cgroup".as_ptr(), libc::O_RDONLY);
                    libc::read(f, buf.as_mut_ptr().cast(), buf.len())
                };
                let mine = usize::try_from(n).map_or(&[][..], |n| &buf[..n]);
                let found = mine.ends_with(want.as_bytes());
                // SAFETY: _exit ends the child at once, touching nothing of the harness's state.
                unsafe { libc::_exit(if found { 0 } else { 1 }) }
            }
            Ok(ForkResult::Parent { child }) => nix::sys::wait::waitpid(child, None),
            Err(e) => panic!("clone3 into {}: {e}", dir.display()),
        };
        std::fs::remove_dir(&dir).expect("remove the cgroup");
        assert!(
            matches!(code, Ok(nix::sys::wait::WaitStatus::Exited(_, 0))),
            "the child was not in {}: {code:?}",
            dir.display()
        );
    }

    /// A directory that is not a cgroup is refused and no child is made.
    #[test]
    fn a_directory_outside_cgroupfs_is_refused() {
        let dir = open_cgroup(Path::new("/tmp")).expect("open /tmp");
        // SAFETY: the test thread forks only if the kernel accepts, which it does not for a
        // tmpfs or disk directory; a child, were one made, exits at once.
        match unsafe { fork_into(&dir) } {
            Err(_) => {}
            // SAFETY: _exit ends the child at once, touching nothing of the harness's state.
            Ok(ForkResult::Child) => unsafe { libc::_exit(0) },
            Ok(ForkResult::Parent { child }) => {
                let _ = nix::sys::wait::waitpid(child, None);
                panic!("a child was made in a directory that is no cgroup");
            }
        }
    }
}
