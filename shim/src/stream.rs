//! Streaming sessions: exec processes and attachers whose stdio descriptors go to the caller.

use std::fs;
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use nix::unistd::Pid;
use prost::Message;

use crate::container::{Ctr, Stdio};
use crate::error::{IoContext, ShimError};
use crate::proto::pb;

/// Largest pipe buffer asked for on an attacher's output pipe (the shim never blocks on it).
const ATTACH_PIPE_SIZE: i32 = 1 << 20;

/// A streaming exec: the process runs until it exits; its caller holds its stdio.
struct ExecSession {
    conn: UnixStream,
    pid: Pid,
    pidfd: OwnedFd,
    /// The caller hung up: the process was SIGKILLed and is only reaped.
    abandoned: bool,
}

/// An attached client: the write ends of its output pipes.
struct Attacher {
    conn: UnixStream,
    outs: [Option<OwnedFd>; 2],
    close_stdin_on_detach: bool,
    dropped_bytes: u64,
}

/// A started exec: its pid, its pidfd and the named descriptors for the caller.
type Started = (Pid, OwnedFd, Vec<(&'static str, OwnedFd)>);

/// What a poll slot of a streaming session refers to.
#[derive(Clone, Copy)]
pub enum StreamSlot {
    ExecConn(usize),
    ExecPid(usize),
    AttachConn(usize),
}

/// The shim's streaming sessions.
#[derive(Default)]
pub struct Streams {
    execs: Vec<ExecSession>,
    attachers: Vec<Attacher>,
}

/// Sends one answer frame carrying `fds`; never raises SIGPIPE.
fn send_with_fds(conn: &UnixStream, msg: &pb::Response, fds: &[RawFd]) -> std::io::Result<()> {
    let body = msg.encode_to_vec();
    let len = u32::try_from(body.len())
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidInput, "frame too large"))?;
    let mut data = Vec::with_capacity(body.len() + 4);
    data.extend_from_slice(&len.to_be_bytes());
    data.extend_from_slice(&body);
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let iov = [IoSlice::new(&data)];
    let sent = loop {
        match sendmsg::<()>(conn.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    // The rest (if the socket took only part) goes without descriptors.
    if sent < data.len() {
        crate::proto::write_frame_tail(conn, &data[sent..])?;
    }
    Ok(())
}

fn ok(r: pb::response::Result) -> pb::Response {
    pb::Response {
        error: String::new(),
        result: Some(r),
    }
}

/// Reads what a session connection sent: whether it is still open, and whether any bytes came
/// (an attacher's request to close the container's stdin).
fn conn_read(conn: &mut UnixStream) -> (bool, bool) {
    let mut buf = [0u8; 256];
    let mut got = false;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return (false, got),
            Ok(_) => got = true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return (true, got),
            Err(_) => return (false, got),
        }
    }
}

fn conn_alive(conn: &mut UnixStream) -> bool {
    conn_read(conn).0
}

impl Streams {
    /// Descriptors to poll for readability.
    pub fn poll_fds(&self, add: &mut impl FnMut(RawFd, StreamSlot)) {
        for (i, e) in self.execs.iter().enumerate() {
            add(e.pidfd.as_raw_fd(), StreamSlot::ExecPid(i));
            if !e.abandoned {
                add(e.conn.as_raw_fd(), StreamSlot::ExecConn(i));
            }
        }
        for (i, a) in self.attachers.iter().enumerate() {
            add(a.conn.as_raw_fd(), StreamSlot::AttachConn(i));
        }
    }

    /// Whether `pid` is a streaming exec's process (the shim reaps it itself).
    pub fn owns_pid(&self, pid: Pid) -> bool {
        self.execs.iter().any(|e| e.pid == pid)
    }

    pub fn is_idle(&self) -> bool {
        self.execs.is_empty() && self.attachers.is_empty()
    }

    /// Handles a ready slot. Returns true when the container's stdin must be closed (a
    /// stdin-once attacher left).
    pub fn ready(&mut self, slot: StreamSlot) -> bool {
        match slot {
            StreamSlot::ExecConn(i) => {
                if let Some(e) = self.execs.get_mut(i)
                    && !conn_alive(&mut e.conn)
                {
                    tracing::info!(pid = e.pid.as_raw(), "exec caller hung up: killing");
                    let _ = kill(e.pid, Signal::SIGKILL);
                    e.abandoned = true;
                }
                false
            }
            StreamSlot::ExecPid(_) => {
                self.reap_execs();
                false
            }
            StreamSlot::AttachConn(i) => {
                let Some(a) = self.attachers.get_mut(i) else {
                    return false;
                };
                let (alive, got) = conn_read(&mut a.conn);
                if alive {
                    // A byte from a stdin-once attacher: its input ended, close the stdin now.
                    return got && a.close_stdin_on_detach;
                }
                let a = self.attachers.swap_remove(i);
                if a.dropped_bytes > 0 {
                    tracing::warn!(
                        bytes = a.dropped_bytes,
                        "attacher was too slow: output dropped"
                    );
                }
                a.close_stdin_on_detach
            }
        }
    }

    /// Reaps exited exec processes and reports their exit to their callers.
    pub fn reap_execs(&mut self) {
        let mut i = 0;
        while i < self.execs.len() {
            match crate::server::try_reap(self.execs[i].pid) {
                Some(code) => {
                    let e = self.execs.swap_remove(i);
                    if !e.abandoned {
                        let msg = ok(pb::response::Result::ExecExit(pb::ExecExit {
                            exit_code: code,
                        }));
                        let _ = e.conn.set_nonblocking(false);
                        let _ = e
                            .conn
                            .set_write_timeout(Some(std::time::Duration::from_secs(2)));
                        if let Err(err) = send_with_fds(&e.conn, &msg, &[]) {
                            tracing::debug!("exec exit: {err}");
                        }
                    }
                }
                None => i += 1,
            }
        }
    }

    /// Copies container output (stream `i`: 0 stdout, 1 stderr) to every attacher.
    pub fn fan_out(&mut self, i: usize, data: &[u8]) {
        for a in &mut self.attachers {
            let Some(fd) = &a.outs[i] else { continue };
            let mut off = 0;
            while off < data.len() {
                match nix::unistd::write(fd, &data[off..]) {
                    Ok(n) => off += n,
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(nix::errno::Errno::EAGAIN) => {
                        a.dropped_bytes += (data.len() - off) as u64;
                        break;
                    }
                    Err(_) => {
                        a.outs[i] = None;
                        break;
                    }
                }
            }
        }
    }

    /// Output stream `i` of the container reached EOF: attachers see EOF too.
    pub fn output_closed(&mut self, i: usize) {
        for a in &mut self.attachers {
            a.outs[i] = None;
        }
    }

    /// The container exited: every attacher is detached.
    pub fn container_exited(&mut self) {
        self.attachers.clear();
    }

    /// Kills every exec process (the container is being deleted).
    pub fn kill_all(&mut self) {
        for e in &mut self.execs {
            let _ = kill(e.pid, Signal::SIGKILL);
        }
        for e in self.execs.drain(..) {
            crate::server::reap_blocking(e.pid);
        }
        self.attachers.clear();
    }

    /// Starts a streaming exec and answers with its descriptors.
    pub fn exec(
        &mut self,
        ctr: &Ctr,
        x: pb::ExecStreamRequest,
        conn: UnixStream,
    ) -> Result<(), (UnixStream, ShimError)> {
        if x.args.is_empty() {
            return Err((conn, ShimError::Precondition("exec needs args".into())));
        }
        let started = if x.tty {
            self.start_tty(ctr, &x)
        } else {
            start_pipes(ctr, &x)
        };
        let (pid, pidfd, fds) = match started {
            Ok(s) => s,
            Err(e) => return Err((conn, e)),
        };
        let names: Vec<String> = fds.iter().map(|(n, _)| (*n).to_string()).collect();
        let raw: Vec<RawFd> = fds.iter().map(|(_, f)| f.as_raw_fd()).collect();
        let msg = ok(pb::response::Result::ExecStream(pb::ExecStreamResponse {
            pid: pid.as_raw().unsigned_abs(),
            fds: names,
        }));
        let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(2)));
        if let Err(e) = send_with_fds(&conn, &msg, &raw) {
            tracing::warn!("exec stream answer: {e}: killing the process");
            let _ = kill(pid, Signal::SIGKILL);
            crate::server::reap_blocking(pid);
            return Ok(());
        }
        // The shim's copies go: the caller holds the only ones.
        drop(fds);
        if let Err(e) = conn.set_nonblocking(true) {
            tracing::warn!("exec connection non-blocking: {e}");
        }
        self.execs.push(ExecSession {
            conn,
            pid,
            pidfd,
            abandoned: false,
        });
        Ok(())
    }

    fn start_tty(&self, ctr: &Ctr, x: &pb::ExecStreamRequest) -> Result<Started, ShimError> {
        let cwd = (!x.cwd.is_empty()).then(|| PathBuf::from(&x.cwd));
        let (pid, master) = ctr.exec_tty(x.args.clone(), &x.env, cwd)?;
        let pidfd = with_pidfd(pid)?;
        Ok((pid, pidfd, vec![("pty", master)]))
    }

    /// Attaches a caller to the container's stdio.
    pub fn attach(
        &mut self,
        a: pb::AttachRequest,
        tty: bool,
        stdin: Option<&OwnedFd>,
        outs_open: [bool; 2],
        conn: UnixStream,
    ) -> Result<(), (UnixStream, ShimError)> {
        let mut fds: Vec<(&'static str, OwnedFd)> = Vec::new();
        let mut keep: [Option<OwnedFd>; 2] = [None, None];
        let setup = (|| -> Result<(), ShimError> {
            if a.stdin || tty {
                match stdin {
                    Some(fd) => {
                        let dup = fd.try_clone().ctx(|| "dup stdin".to_string())?;
                        fds.push((if tty { "pty" } else { "stdin" }, dup));
                    }
                    None if a.stdin => {
                        return Err(ShimError::Precondition(
                            "container was not created with stdin open".into(),
                        ));
                    }
                    None => {}
                }
            }
            let wanted = [a.stdout || (tty && a.stderr), a.stderr && !tty];
            for (i, name) in ["stdout", "stderr"].into_iter().enumerate() {
                if !wanted[i] {
                    continue;
                }
                let (r, w) = crate::server::cloexec_pipe().ctx(|| "pipe".to_string())?;
                crate::server::set_nonblocking(&w).ctx(|| "pipe non-blocking".to_string())?;
                // SAFETY: F_SETPIPE_SZ takes an integer; a refusal only keeps the default size.
                unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, ATTACH_PIPE_SIZE) };
                fds.push((name, r));
                if outs_open[i] {
                    keep[i] = Some(w);
                }
            }
            Ok(())
        })();
        if let Err(e) = setup {
            return Err((conn, e));
        }
        let names: Vec<String> = fds.iter().map(|(n, _)| (*n).to_string()).collect();
        let raw: Vec<RawFd> = fds.iter().map(|(_, f)| f.as_raw_fd()).collect();
        let msg = ok(pb::response::Result::Attach(pb::AttachResponse {
            tty,
            fds: names,
        }));
        let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(2)));
        if let Err(e) = send_with_fds(&conn, &msg, &raw) {
            tracing::warn!("attach answer: {e}");
            return Ok(());
        }
        drop(fds);
        if let Err(e) = conn.set_nonblocking(true) {
            tracing::warn!("attach connection non-blocking: {e}");
        }
        self.attachers.push(Attacher {
            conn,
            outs: keep,
            close_stdin_on_detach: a.close_stdin_on_detach,
            dropped_bytes: 0,
        });
        Ok(())
    }
}

fn with_pidfd(pid: Pid) -> Result<OwnedFd, ShimError> {
    match crate::server::pidfd_open(pid) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let _ = kill(pid, Signal::SIGKILL);
            crate::server::reap_blocking(pid);
            Err(ShimError::io(format!("pidfd_open {pid}"), e))
        }
    }
}

/// A non-tty exec with a pipe per requested stream.
fn start_pipes(ctr: &Ctr, x: &pb::ExecStreamRequest) -> Result<Started, ShimError> {
    let null = |write: bool| -> Result<OwnedFd, ShimError> {
        let f = fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")
            .ctx(|| "open /dev/null".to_string())?;
        Ok(f.into())
    };
    let mut fds = Vec::new();
    let stdin = if x.stdin {
        let (r, w) = crate::server::cloexec_pipe().ctx(|| "pipe".to_string())?;
        fds.push(("stdin", w));
        r
    } else {
        null(false)?
    };
    let mut out = |want: bool, name: &'static str| -> Result<OwnedFd, ShimError> {
        if want {
            let (r, w) = crate::server::cloexec_pipe().ctx(|| "pipe".to_string())?;
            fds.push((name, r));
            Ok(w)
        } else {
            null(true)
        }
    };
    let stdout = out(x.stdout, "stdout")?;
    let stderr = out(x.stderr, "stderr")?;
    let cwd = (!x.cwd.is_empty()).then(|| PathBuf::from(&x.cwd));
    let stdio = Stdio {
        stdin: Some(stdin),
        stdout,
        stderr,
    };
    let pid = ctr.exec(x.args.clone(), &x.env, cwd, stdio)?;
    let pidfd = with_pidfd(pid)?;
    Ok((pid, pidfd, fds))
}
