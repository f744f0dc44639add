//! Streaming sessions with a container's shim: exec and attach whose stdio descriptors the shim
//! passes over its socket (SCM_RIGHTS), for the streaming server.

use std::io::{IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use prost::Message;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use tokio::io::AsyncReadExt;

use super::container::{ContainerError, ContainerManager};
use super::shim_client::api;

/// How long the shim may take to start the process and answer.
const SESSION_SETUP: Duration = Duration::from_secs(30);

/// A live session with the shim: the passed descriptors by name, and the connection whose
/// closing ends the session (kills an exec process, detaches an attacher).
pub struct ShimSession {
    pub fds: Vec<(String, OwnedFd)>,
    pub conn: tokio::net::UnixStream,
    /// The exec process's host pid (0 for attach).
    pub pid: u32,
    /// The container has a tty (attach).
    pub tty: bool,
    /// The container's stdin closes when this attacher's input ends (CRI stdin_once).
    pub close_stdin: bool,
}

impl ShimSession {
    /// Takes the descriptor named `name`.
    pub fn take(&mut self, name: &str) -> Option<OwnedFd> {
        let i = self.fds.iter().position(|(n, _)| n == name)?;
        Some(self.fds.swap_remove(i).1)
    }

    /// Asks the shim to close the container's stdin now (a stdin-once attacher's input ended).
    pub async fn close_stdin(&self) {
        for _ in 0..100 {
            if self.conn.writable().await.is_err() {
                return;
            }
            match self.conn.try_write(b"c") {
                Ok(_) => return,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }

    /// Waits for the end of the session: `Some(code)` for an exec that exited; `None` when the
    /// shim closed the connection without one (an attach whose container exited, a dead shim).
    pub async fn wait(&mut self) -> Option<i32> {
        let mut len = [0u8; 4];
        self.conn.read_exact(&mut len).await.ok()?;
        let len = u32::from_be_bytes(len) as usize;
        if len > 1 << 20 {
            return None;
        }
        let mut body = vec![0u8; len];
        self.conn.read_exact(&mut body).await.ok()?;
        match api::Response::decode(body.as_slice()).ok()?.result {
            Some(api::response::Result::ExecExit(e)) => Some(e.exit_code),
            _ => None,
        }
    }
}

/// Why a session could not be opened.
fn internal(socket: &std::path::Path, e: impl std::fmt::Display) -> ContainerError {
    ContainerError::Internal(format!("shim {}: {e}", socket.display()))
}

/// Sends `request` and receives the answer with its descriptors (blocking).
fn open_blocking(
    socket: PathBuf,
    request: api::request::Request,
) -> Result<(api::response::Result, Vec<OwnedFd>, UnixStream), ContainerError> {
    let conn = UnixStream::connect(&socket).map_err(|e| internal(&socket, e))?;
    conn.set_read_timeout(Some(SESSION_SETUP))
        .and_then(|()| conn.set_write_timeout(Some(SESSION_SETUP)))
        .map_err(|e| internal(&socket, e))?;
    let body = api::Request {
        request: Some(request),
    }
    .encode_to_vec();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    (&conn)
        .write_all(&frame)
        .map_err(|e| internal(&socket, e))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let got = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        rustix::net::recvmsg(&conn, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)
            .map_err(|e| internal(&socket, e))?
            .bytes
    };
    let mut fds = Vec::new();
    for msg in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if got < 4 {
        return Err(internal(&socket, "connection closed before an answer"));
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > 16 << 20 {
        return Err(internal(&socket, format!("answer of {len} bytes")));
    }
    let mut body = buf[4..got].to_vec();
    if body.len() < len {
        let mut rest = vec![0u8; len - body.len()];
        (&conn)
            .read_exact(&mut rest)
            .map_err(|e| internal(&socket, e))?;
        body.extend_from_slice(&rest);
    }
    body.truncate(len);
    let response = api::Response::decode(body.as_slice()).map_err(|e| internal(&socket, e))?;
    if !response.error.is_empty() {
        return Err(ContainerError::FailedPrecondition(format!(
            "shim {}: {}",
            socket.display(),
            response.error
        )));
    }
    let result = response
        .result
        .ok_or_else(|| internal(&socket, "answer without a result"))?;
    conn.set_read_timeout(None)
        .and_then(|()| conn.set_nonblocking(true))
        .map_err(|e| internal(&socket, e))?;
    Ok((result, fds, conn))
}

async fn open(
    socket: PathBuf,
    request: api::request::Request,
) -> Result<(api::response::Result, Vec<OwnedFd>, tokio::net::UnixStream), ContainerError> {
    let what = socket.clone();
    let (result, fds, conn) = tokio::task::spawn_blocking(move || open_blocking(socket, request))
        .await
        .map_err(|e| internal(&what, e))??;
    let conn = tokio::net::UnixStream::from_std(conn).map_err(|e| internal(&what, e))?;
    Ok((result, fds, conn))
}

fn named(names: &[String], fds: Vec<OwnedFd>) -> Vec<(String, OwnedFd)> {
    names.iter().cloned().zip(fds).collect()
}

impl ContainerManager {
    /// Starts `cmd` in the running container `id` with its stdio handed to the caller.
    pub async fn exec_stream(
        &self,
        id: &str,
        cmd: &[String],
        tty: bool,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    ) -> Result<ShimSession, ContainerError> {
        let rec = self.running(id, "Exec")?;
        // The process joins the container's cgroups in the shim.
        super::cgroup_attach::prime();
        let request = api::request::Request::ExecStream(api::ExecStreamRequest {
            args: cmd.to_vec(),
            tty,
            stdin,
            stdout,
            stderr: stderr && !tty,
            ..Default::default()
        });
        match open(rec.socket.clone(), request).await? {
            (api::response::Result::ExecStream(r), fds, conn) => Ok(ShimSession {
                fds: named(&r.fds, fds),
                conn,
                pid: r.pid,
                tty,
                close_stdin: false,
            }),
            (other, ..) => Err(internal(
                &rec.socket,
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// Attaches to the running container `id`'s own stdio.
    pub async fn attach_stream(
        &self,
        id: &str,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    ) -> Result<ShimSession, ContainerError> {
        let rec = self.running(id, "Attach")?;
        let config = rec.config();
        let close_stdin = stdin && config.stdin && config.stdin_once;
        let request = api::request::Request::Attach(api::AttachRequest {
            stdin: stdin && config.stdin,
            stdout,
            stderr,
            close_stdin_on_detach: close_stdin,
        });
        match open(rec.socket.clone(), request).await? {
            (api::response::Result::Attach(r), fds, conn) => Ok(ShimSession {
                fds: named(&r.fds, fds),
                conn,
                pid: 0,
                tty: r.tty,
                close_stdin,
            }),
            (other, ..) => Err(internal(
                &rec.socket,
                format!("unexpected answer {other:?}"),
            )),
        }
    }
}
