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
    /// Create succeeded: the caller's invocation prints the shim's pid and the container
    /// init's pid (`SHIM INIT` on one line) and exits 0.
    pub fn success(self, shim_pid: u32, init_pid: i32) {
        self.send(0, &format!("{shim_pid} {init_pid}"));
    }

    /// Create failed: the caller's invocation prints `msg` and exits 1.
    pub fn failure(self, msg: &str) {
        self.send(1, msg);
    }

    /// One message: status byte, u32 big-endian length, text. The caller reads exactly this
    /// much and does not wait for EOF: the container's init, forked by libcontainer and not
    /// yet exec'd, holds a copy of the pipe until it is started.
    fn send(mut self, status: u8, msg: &str) {
        let len = u32::try_from(msg.len()).unwrap_or(0);
        let mut buf = vec![status];
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(&msg.as_bytes()[..len as usize]);
        let _ = self.0.write_all(&buf);
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
        return Err(ShimError::io(
            "prctl(PR_SET_CHILD_SUBREAPER)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(Reporter(File::from(w)))
}

/// In the caller's process: the exit code from the status pipe.
fn wait_report(r: OwnedFd) -> i32 {
    let mut f = File::from(r);
    let mut head = [0u8; 5];
    if f.read_exact(&mut head).is_err() {
        eprintln!("berth-shim: the shim died before reporting the create result");
        return 1;
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut msg = vec![0u8; len];
    let _ = f.read_exact(&mut msg);
    let msg = String::from_utf8_lossy(&msg);
    if head[0] == 0 {
        println!("{msg}");
        return 0;
    }
    eprintln!("berth-shim: {msg}");
    1
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
            return Err(ShimError::io(
                "dup2 /dev/null",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}
