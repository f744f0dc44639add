//! Detaching: double fork, new session, child subreaper, and the status pipe back to the caller.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, fork, setsid};

use crate::error::{IoContext, ShimError};

/// The detached shim's end of the status pipe: it reports the create result exactly once.
pub struct Reporter(File);

impl Reporter {
    /// Create succeeded: the caller's invocation exits 0.
    pub fn success(mut self) {
        let _ = self.0.write_all(b"\0");
    }

    /// Create failed: the caller's invocation prints `msg` and exits 1.
    pub fn failure(mut self, msg: &str) {
        let _ = self.0.write_all(format!("\x01{msg}").as_bytes());
    }
}

/// Forks twice. Returns only in the detached grandchild (in a new session, a child
/// subreaper); the original process waits for the create result and exits with it.
pub fn detach() -> Result<Reporter, ShimError> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ctx(|| "pipe".to_string())?;
    // SAFETY: the shim is single-threaded here (no threads are ever started), so the child
    // may run arbitrary code after fork.
    match unsafe { fork() }.ctx(|| "fork".to_string())? {
        ForkResult::Parent { child } => {
            drop(w);
            let _ = waitpid(child, None);
            std::process::exit(wait_report(r));
        }
        ForkResult::Child => {}
    }
    drop(r);
    setsid().ctx(|| "setsid".to_string())?;
    // SAFETY: still single-threaded (see above).
    match unsafe { fork() }.ctx(|| "fork".to_string())? {
        // SAFETY: _exit ends the intermediate process without running the parent's atexit
        // handlers or flushing its buffers a second time.
        ForkResult::Parent { .. } => unsafe { libc::_exit(0) },
        ForkResult::Child => {}
    }
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(ShimError::io("prctl(PR_SET_CHILD_SUBREAPER)", std::io::Error::last_os_error()));
    }
    Ok(Reporter(File::from(w)))
}

/// In the caller's process: the exit code from the status pipe.
fn wait_report(r: OwnedFd) -> i32 {
    let mut buf = Vec::new();
    let _ = File::from(r).read_to_end(&mut buf);
    match buf.split_first() {
        Some((0, _)) => 0,
        Some((_, msg)) => {
            eprintln!("berth-shim: {}", String::from_utf8_lossy(msg));
            1
        }
        None => {
            eprintln!("berth-shim: the shim died before reporting the create result");
            1
        }
    }
}

/// Points stdin, stdout and stderr at /dev/null (the caller may be reading them to EOF).
pub fn detach_stdio() -> Result<(), ShimError> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .ctx(|| "open /dev/null".to_string())?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors; `null` stays open for the call.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(ShimError::io("dup2 /dev/null", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}
