//! TTY mode: the console socket libcontainer sends the container's pty master through.

use std::fs;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

use crate::error::{IoContext, ShimError};

/// A listening socket passed to libcontainer as the console socket; removed on drop.
pub struct ConsoleSocket {
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    pub fn bind(path: &Path) -> Result<Self, ShimError> {
        let _ = fs::remove_file(path);
        let listener =
            UnixListener::bind(path).ctx(|| format!("bind console socket {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits at most `timeout` for the pty master to be sent, then takes it.
    pub fn receive_master_wait(&self, timeout: std::time::Duration) -> Result<OwnedFd, ShimError> {
        let mut pfd = libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        self.receive_master()
    }

    /// Takes the pty master that libcontainer sent while creating the container.
    pub fn receive_master(&self) -> Result<OwnedFd, ShimError> {
        // The sender connected and wrote during create, which has returned: never block.
        self.listener
            .set_nonblocking(true)
            .ctx(|| "console socket non-blocking".to_string())?;
        let (conn, _) = self
            .listener
            .accept()
            .ctx(|| "no pty master arrived on the console socket".to_string())?;
        let mut pfd = libc::pollfd {
            fd: conn.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, 2000) };
        let mut name = [0u8; 256];
        let mut iov = [IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let msg = recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        )
        .ctx(|| "receive pty master".to_string())?;
        let mut master = None;
        for cmsg in msg.cmsgs().ctx(|| "receive pty master".to_string())? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // SAFETY: the kernel installed this descriptor in our table for this
                    // message; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    master.get_or_insert(owned);
                }
            }
        }
        master.ok_or_else(|| {
            ShimError::Precondition("console socket message carried no pty master".into())
        })
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
