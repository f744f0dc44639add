//! TTY mode: the console socket libcontainer sends the container's pty master through when it
//! creates the container.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

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
        crate::enter::receive_fd(conn.as_raw_fd())
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
