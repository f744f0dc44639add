//! The event loop: serves the shim API, copies container output to the log, reaps children.

use std::fs;
use std::io::{self, ErrorKind, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use prost::Message;

use crate::args::Args;
use crate::container::{Ctr, Stdio};
use crate::crilog::{LineSplitter, LogFile};
use crate::error::{IoContext, ShimError};
use crate::exitfile::ExitInfo;
use crate::proto::{self, pb};
use crate::stream::{StreamSlot, Streams};
use crate::timefmt;

/// Output kept per stream by ExecSync when the request sets no cap, and the most it may ask
/// for: both streams together still fit in one 16 MiB response frame.
const DEFAULT_OUTPUT_CAP: usize = (8 << 20) - 1024;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle wake-up to reap orphans re-parented to the shim (it is a child subreaper).
const REAP_INTERVAL: Duration = Duration::from_secs(10);
/// Extra orphan reaps after each request: libcontainer's helper processes (a failed exec's
/// init, for one) exit just after the call returns, and a zombie of the container's pid
/// namespace keeps that namespace's init from finishing its own exit until it is reaped.
const REAP_SOON: [Duration; 3] = [
    Duration::from_millis(20),
    Duration::from_millis(200),
    Duration::from_secs(2),
];
/// How long Delete waits for a SIGKILLed init to be reaped.
const KILL_REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// One of the container's output pipes.
struct OutPipe {
    fd: OwnedFd,
    splitter: LineSplitter,
}

/// The container's init process, as the shim tracks it (libcontainer's own status is not
/// trusted: it reports "stopped" after any signal).
enum Init {
    Created { pid: Pid, pidfd: OwnedFd },
    Running { pid: Pid, pidfd: OwnedFd },
    Stopped(ExitInfo),
}

/// A connection whose request frame has not fully arrived yet.
struct Incoming {
    conn: UnixStream,
    buf: Vec<u8>,
    deadline: Instant,
}

/// A pending Wait call.
struct Waiter {
    conn: UnixStream,
    deadline: Option<Instant>,
}

/// A running ExecSync process.
struct Exec {
    conn: UnixStream,
    pid: Pid,
    pidfd: OwnedFd,
    outs: [Option<OwnedFd>; 2],
    bufs: [Vec<u8>; 2],
    cap: usize,
    deadline: Option<Instant>,
    timed_out: bool,
}

pub struct Shim {
    args: Args,
    ctr: Ctr,
    listener: UnixListener,
    log: LogFile,
    outs: [Option<OutPipe>; 2],
    /// The write end of the container's stdin (the pty master with a tty), held open for the
    /// container's lifetime (or until a stdin-once attacher leaves).
    stdin: Option<OwnedFd>,
    /// Streaming exec sessions and attachers.
    streams: Streams,
    init: Init,
    incoming: Vec<Incoming>,
    reap_soon: Vec<Instant>,
    waiters: Vec<Waiter>,
    execs: Vec<Exec>,
    exit_requested: bool,
}

/// What a poll slot refers to.
#[derive(Clone, Copy)]
enum Slot {
    Listener,
    Incoming,
    Out(usize),
    Init,
    OomEvents,
    ExecPid,
    ExecOut(usize, usize),
    Stream(StreamSlot),
}

/// Opens a pidfd for `pid` (reported readable when the process exits).
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe whose both ends are close-on-exec (libcontainer dup2()s the child's end to 0/1/2).
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{F_GETFL, F_SETFL, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), F_GETFL)?);
    fcntl(fd.as_raw_fd(), F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Exit code of a wait status: the code, or 128 + signal.
fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// Non-blocking reap of one pid; `Some(code)` once it has exited.
pub(crate) fn try_reap(pid: Pid) -> Option<i32> {
    match waitpid(pid, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
        Ok(st) => exit_code(st),
        // Already reaped or not our child: treat as gone.
        Err(nix::errno::Errno::ECHILD) => Some(255),
        Err(_) => None,
    }
}

/// Blocking reap of one pid.
pub(crate) fn reap_blocking(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL)) {
            Ok(st) => {
                if let Some(code) = exit_code(st) {
                    return code;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return 255,
        }
    }
}

/// Reads what is available from a non-blocking fd. Returns false at EOF or error.
fn drain(fd: &OwnedFd, mut sink: impl FnMut(&[u8])) -> bool {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => return false,
            Ok(n) => sink(&buf[..n]),
            Err(nix::errno::Errno::EAGAIN) => return true,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
}

fn pb_exit(e: &ExitInfo) -> pb::ExitStatus {
    pb::ExitStatus {
        exit_code: e.exit_code,
        exited_at: e.exited_at.clone(),
        oom_killed: e.oom_killed,
        reason: e.reason().to_string(),
    }
}

fn respond(conn: &UnixStream, resp: Result<pb::response::Result, ShimError>) {
    let msg = match resp {
        Ok(r) => pb::Response {
            error: String::new(),
            result: Some(r),
        },
        Err(e) => pb::Response {
            error: e.to_string(),
            result: None,
        },
    };
    let _ = conn.set_write_timeout(Some(REQUEST_TIMEOUT));
    if let Err(e) = proto::write_frame(conn, &msg.encode_to_vec()) {
        tracing::debug!("write response: {e}");
    }
}

impl Shim {
    /// Takes over a created container. `outs` are the read ends of its stdout and stderr pipes
    /// (or its pty master) with the splitter for each.
    pub fn new(
        args: Args,
        ctr: Ctr,
        listener: UnixListener,
        log: LogFile,
        outs: [Option<(OwnedFd, LineSplitter)>; 2],
        stdin: Option<OwnedFd>,
        pidfd: OwnedFd,
    ) -> Self {
        if let Err(e) = listener.set_nonblocking(true) {
            tracing::error!("listener non-blocking: {e}");
        }
        let outs = outs.map(|o| {
            o.map(|(fd, splitter)| {
                if let Err(e) = set_nonblocking(&fd) {
                    tracing::error!("output non-blocking: {e}");
                }
                OutPipe { fd, splitter }
            })
        });
        let pid = ctr.pid().unwrap_or(Pid::from_raw(0));
        Self {
            args,
            ctr,
            listener,
            log,
            outs,
            stdin,
            streams: Streams::default(),
            init: Init::Created { pid, pidfd },
            incoming: Vec::new(),
            reap_soon: Vec::new(),
            waiters: Vec::new(),
            execs: Vec::new(),
            exit_requested: false,
        }
    }

    /// Host pid of the container's init (0 once it has been reaped).
    pub fn init_pid(&self) -> i32 {
        match &self.init {
            Init::Created { pid, .. } | Init::Running { pid, .. } => pid.as_raw(),
            Init::Stopped(_) => 0,
        }
    }

    /// Serves until Delete or Shutdown.
    pub fn run(mut self) {
        while !self.exit_requested {
            let mut slots = Vec::new();
            let mut fds = Vec::new();
            let mut add = |fd: RawFd, slot: Slot| {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                slots.push(slot);
            };
            add(self.listener.as_raw_fd(), Slot::Listener);
            for c in &self.incoming {
                add(c.conn.as_raw_fd(), Slot::Incoming);
            }
            for (i, p) in self.outs.iter().enumerate() {
                if let Some(p) = p {
                    add(p.fd.as_raw_fd(), Slot::Out(i));
                }
            }
            // Before the init: a count that changed as the init died is read before its exit.
            if let Some(fd) = self.ctr.oom_poll_fd() {
                add(fd, Slot::OomEvents);
            }
            if let Init::Created { pidfd, .. } | Init::Running { pidfd, .. } = &self.init {
                add(pidfd.as_raw_fd(), Slot::Init);
            }
            for (i, e) in self.execs.iter().enumerate() {
                add(e.pidfd.as_raw_fd(), Slot::ExecPid);
                for (j, o) in e.outs.iter().enumerate() {
                    if let Some(o) = o {
                        add(o.as_raw_fd(), Slot::ExecOut(i, j));
                    }
                }
            }
            self.streams
                .poll_fds(&mut |fd, slot| add(fd, Slot::Stream(slot)));
            let timeout = self.next_timeout();
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd structs.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    tracing::error!("poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            let mut exec_done = false;
            let mut incoming_ready = false;
            let mut streams_ready = Vec::new();
            for (pfd, slot) in fds.iter().zip(&slots) {
                if pfd.revents == 0 {
                    continue;
                }
                match *slot {
                    Slot::Listener => self.accept_all(),
                    Slot::Incoming => incoming_ready = true,
                    Slot::Out(i) => self.pump_output(i),
                    Slot::OomEvents => self.ctr.oom_changed(),
                    Slot::Init => self.check_init(),
                    Slot::ExecOut(i, j) => self.pump_exec(i, j),
                    Slot::ExecPid => exec_done = true,
                    Slot::Stream(s) => streams_ready.push(s),
                }
                if self.exit_requested {
                    break;
                }
            }
            // Highest index first: handling one may swap-remove it.
            streams_ready.sort_by_key(|s| std::cmp::Reverse(stream_slot_key(*s)));
            let mut stream_done = false;
            for s in streams_ready {
                if self.streams.ready(s) {
                    tracing::info!("stdin-once attacher left: closing the container's stdin");
                    self.stdin = None;
                }
                stream_done = true;
            }
            if stream_done && self.streams.is_idle() {
                crate::mem::trim();
            }
            if incoming_ready && !self.exit_requested {
                self.read_incoming();
            }
            if exec_done {
                self.check_execs();
                if self.execs.is_empty() {
                    crate::mem::trim();
                }
            }
            self.expire_deadlines();
            self.reap_orphans();
        }
        let _ = fs::remove_file(&self.args.socket);
    }

    fn next_timeout(&self) -> Duration {
        let now = Instant::now();
        let deadlines = self
            .waiters
            .iter()
            .filter_map(|w| w.deadline)
            .chain(self.incoming.iter().map(|c| c.deadline))
            .chain(self.reap_soon.iter().copied())
            .chain(
                self.execs
                    .iter()
                    .filter(|e| !e.timed_out)
                    .filter_map(|e| e.deadline),
            );
        deadlines
            .map(|d| d.saturating_duration_since(now) + Duration::from_millis(1))
            .min()
            .unwrap_or(REAP_INTERVAL)
            .min(REAP_INTERVAL)
    }

    fn pump_output(&mut self, i: usize) {
        let Some(p) = &mut self.outs[i] else { return };
        let log = &mut self.log;
        let splitter = &mut p.splitter;
        let streams = &mut self.streams;
        let open = drain(&p.fd, |data| {
            streams.fan_out(i, data);
            if let Err(e) = splitter.feed(data, log) {
                tracing::warn!("write log: {e}");
            }
        });
        if !open {
            self.streams.output_closed(i);
            if let Err(e) = splitter.finish(log) {
                tracing::warn!("write log: {e}");
            }
            self.outs[i] = None;
        }
    }

    fn check_init(&mut self) {
        let pid = match &self.init {
            Init::Created { pid, .. } | Init::Running { pid, .. } => *pid,
            Init::Stopped(_) => return,
        };
        if let Some(code) = try_reap(pid) {
            self.init_exited(code);
        }
    }

    /// Records the init's exit: drains output, writes the exit file, answers waiters.
    fn init_exited(&mut self, code: i32) {
        let exited_at = timefmt::now();
        // Read first: under the systemd driver the scope (and its count) goes away soon.
        let oom_killed = self.ctr.oom_kills(code == 128 + libc::SIGKILL) > 0;
        // Output written before the exit is still in the pipes: log it first, an unterminated
        // last line included (as a P record), so the log is complete by the time the exit is
        // reported (the kubelet reads it at once for a FallbackToLogsOnError message).
        for i in 0..2 {
            self.pump_output(i);
            if let Some(p) = &mut self.outs[i]
                && let Err(e) = p.splitter.finish(&mut self.log)
            {
                tracing::warn!("write log: {e}");
            }
        }
        let info = ExitInfo {
            exit_code: code,
            exited_at,
            oom_killed,
        };
        self.streams.container_exited();
        if let Err(e) = info.write_atomic(&self.args.exit_file) {
            tracing::error!("exit file: {e}");
        }
        for w in self.waiters.drain(..) {
            respond(
                &w.conn,
                Ok(pb::response::Result::Wait(pb::WaitResponse {
                    exited: true,
                    exit: Some(pb_exit(&info)),
                })),
            );
        }
        self.init = Init::Stopped(info);
    }

    fn pump_exec(&mut self, i: usize, j: usize) {
        let Some(e) = self.execs.get_mut(i) else {
            return;
        };
        let Some(fd) = &e.outs[j] else { return };
        let (buf, cap) = (&mut e.bufs[j], e.cap);
        let open = drain(fd, |data| {
            let room = cap.saturating_sub(buf.len());
            buf.extend_from_slice(&data[..room.min(data.len())]);
        });
        if !open {
            e.outs[j] = None;
        }
    }

    fn check_execs(&mut self) {
        let mut i = 0;
        while i < self.execs.len() {
            let pid = self.execs[i].pid;
            match try_reap(pid) {
                Some(code) => {
                    for j in 0..2 {
                        self.pump_exec(i, j);
                    }
                    let e = self.execs.swap_remove(i);
                    let [out, err] = e.bufs;
                    respond(
                        &e.conn,
                        Ok(pb::response::Result::ExecSync(pb::ExecSyncResponse {
                            stdout: out,
                            stderr: err,
                            exit_code: code,
                            timed_out: e.timed_out,
                        })),
                    );
                }
                None => i += 1,
            }
        }
    }

    fn expire_deadlines(&mut self) {
        let now = Instant::now();
        let (expired, kept): (Vec<_>, Vec<_>) = self
            .waiters
            .drain(..)
            .partition(|w| w.deadline.is_some_and(|d| d <= now));
        self.waiters = kept;
        // Clients too slow to send their request are dropped.
        self.incoming.retain(|c| c.deadline > now);
        self.reap_soon.retain(|t| *t > now);
        for w in expired {
            respond(
                &w.conn,
                Ok(pb::response::Result::Wait(pb::WaitResponse {
                    exited: false,
                    exit: None,
                })),
            );
        }
        for e in &mut self.execs {
            if !e.timed_out && e.deadline.is_some_and(|d| d <= now) {
                e.timed_out = true;
                let _ = kill(e.pid, Signal::SIGKILL);
            }
        }
    }

    /// Waits for a SIGKILLed child while reaping orphans: the init of a pid namespace finishes
    /// exiting only once every other process of that namespace has been reaped, and some of
    /// those (libcontainer's helpers) are the shim's children.
    fn reap_killed(&mut self, pid: Pid) -> Option<i32> {
        let until = Instant::now() + KILL_REAP_TIMEOUT;
        loop {
            if let Some(code) = try_reap(pid) {
                return Some(code);
            }
            self.reap_orphans();
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Reaps processes re-parented to the shim that it did not start (it is a subreaper).
    /// Only pids outside the init and exec set are waited for, never `waitpid(-1)`.
    fn reap_orphans(&mut self) {
        let me = std::process::id();
        let Ok(children) = fs::read_to_string(format!("/proc/{me}/task/{me}/children")) else {
            return;
        };
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let pid = Pid::from_raw(pid);
            let known = matches!(&self.init, Init::Created { pid: p, .. } | Init::Running { pid: p, .. } if *p == pid)
                || self.execs.iter().any(|e| e.pid == pid)
                || self.streams.owns_pid(pid);
            if !known {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL));
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((conn, _)) => {
                    if let Err(e) = conn.set_nonblocking(true) {
                        tracing::warn!("connection non-blocking: {e}");
                        continue;
                    }
                    self.incoming.push(Incoming {
                        conn,
                        buf: Vec::new(),
                        deadline: Instant::now() + REQUEST_TIMEOUT,
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    return;
                }
            }
        }
    }

    /// Reads what has arrived on pending connections; handles each complete request.
    fn read_incoming(&mut self) {
        let mut i = 0;
        while i < self.incoming.len() && !self.exit_requested {
            let c = &mut self.incoming[i];
            let mut chunk = [0u8; 4096];
            let mut closed = false;
            loop {
                match c.conn.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
                if c.buf.len() > proto::MAX_FRAME + 4 {
                    closed = true;
                    break;
                }
            }
            match proto::split_frame(&c.buf) {
                Ok(Some(body)) => {
                    let req = pb::Request::decode(body);
                    let c = self.incoming.swap_remove(i);
                    if c.conn.set_nonblocking(false).is_ok() {
                        self.handle(c.conn, req);
                        // Start, Kill(all), ExecSync and Delete run libcontainer code once.
                        crate::mem::trim();
                        let now = Instant::now();
                        self.reap_soon = REAP_SOON.iter().map(|d| now + *d).collect();
                    }
                }
                Ok(None) if !closed => i += 1,
                _ => {
                    self.incoming.swap_remove(i);
                }
            }
        }
    }

    fn handle(&mut self, conn: UnixStream, req: Result<pb::Request, prost::DecodeError>) {
        use pb::request::Request as R;
        use pb::response::Result as W;
        let result = match req.map(|r| r.request) {
            Err(e) => Err(ShimError::Precondition(format!("bad request: {e}"))),
            Ok(None) => Err(ShimError::Precondition("empty request".into())),
            Ok(Some(R::Start(_))) => self.start().map(W::Start),
            Ok(Some(R::State(_))) => Ok(W::State(self.state())),
            Ok(Some(R::Kill(k))) => self.kill(k).map(W::Kill),
            Ok(Some(R::Wait(w))) => match &self.init {
                Init::Stopped(info) => Ok(W::Wait(pb::WaitResponse {
                    exited: true,
                    exit: Some(pb_exit(info)),
                })),
                _ => {
                    let deadline = (w.timeout_ms > 0)
                        .then(|| Instant::now() + Duration::from_millis(w.timeout_ms));
                    self.waiters.push(Waiter { conn, deadline });
                    return;
                }
            },
            Ok(Some(R::ExecSync(x))) => match self.exec_sync(x, conn) {
                Ok(()) => return,
                Err((conn, e)) => {
                    respond(&conn, Err(e));
                    return;
                }
            },
            Ok(Some(R::ExecStream(x))) => {
                let res = if matches!(self.init, Init::Running { .. }) {
                    self.streams.exec(&self.ctr, x, conn)
                } else {
                    let e = ShimError::Precondition(format!(
                        "container {} is not running",
                        self.ctr.id()
                    ));
                    Err((conn, e))
                };
                if let Err((conn, e)) = res {
                    respond(&conn, Err(e));
                }
                return;
            }
            Ok(Some(R::Attach(a))) => {
                let res = if matches!(self.init, Init::Running { .. }) {
                    let open = [self.outs[0].is_some(), self.outs[1].is_some()];
                    self.streams
                        .attach(a, self.args.tty, self.stdin.as_ref(), open, conn)
                } else {
                    let e = ShimError::Precondition(format!(
                        "container {} is not running",
                        self.ctr.id()
                    ));
                    Err((conn, e))
                };
                if let Err((conn, e)) = res {
                    respond(&conn, Err(e));
                }
                return;
            }
            Ok(Some(R::ReopenLog(_))) => self
                .log
                .reopen()
                .ctx(|| "reopen log".to_string())
                .map(|()| W::ReopenLog(pb::ReopenLogResponse {})),
            Ok(Some(R::Delete(_))) => self.delete().map(W::Delete),
            Ok(Some(R::Shutdown(_))) => match self.init {
                Init::Stopped(_) => {
                    self.exit_requested = true;
                    Ok(W::Shutdown(pb::ShutdownResponse {}))
                }
                _ => Err(ShimError::Precondition(
                    "container is not stopped: delete it or kill it first".into(),
                )),
            },
        };
        respond(&conn, result);
    }

    fn start(&mut self) -> Result<pb::StartResponse, ShimError> {
        let init = std::mem::replace(&mut self.init, Init::Stopped(placeholder()));
        match init {
            Init::Created { pid, pidfd } => match self.ctr.start() {
                Ok(()) => {
                    wait_for_exec(pid);
                    self.init = Init::Running { pid, pidfd };
                    Ok(pb::StartResponse {
                        pid: pid.as_raw().unsigned_abs(),
                    })
                }
                Err(e) => {
                    self.init = Init::Created { pid, pidfd };
                    Err(e)
                }
            },
            other => {
                let what = if matches!(other, Init::Running { .. }) {
                    "running"
                } else {
                    "stopped"
                };
                self.init = other;
                Err(ShimError::Precondition(format!(
                    "container {} is {what}, not created",
                    self.ctr.id()
                )))
            }
        }
    }

    fn state(&self) -> pb::StateResponse {
        let (status, pid, exit) = match &self.init {
            Init::Created { pid, .. } => (pb::Status::Created, pid.as_raw(), None),
            Init::Running { pid, .. } => (pb::Status::Running, pid.as_raw(), None),
            Init::Stopped(info) => (pb::Status::Stopped, 0, Some(pb_exit(info))),
        };
        pb::StateResponse {
            id: self.ctr.id().to_string(),
            status: status as i32,
            pid: pid.unsigned_abs(),
            exit,
            bundle: self.ctr.bundle().display().to_string(),
            log_path: self.args.log_path.display().to_string(),
        }
    }

    fn kill(&mut self, k: pb::KillRequest) -> Result<pb::KillResponse, ShimError> {
        let signo = i32::try_from(k.signal)
            .map_err(|_| ShimError::Precondition(format!("bad signal {}", k.signal)))?;
        if k.all {
            self.ctr.kill_all(signo)?;
            return Ok(pb::KillResponse {});
        }
        let sig = Signal::try_from(signo)
            .map_err(|_| ShimError::Precondition(format!("bad signal {signo}")))?;
        match &self.init {
            Init::Created { pid, .. } | Init::Running { pid, .. } => {
                match kill(*pid, sig) {
                    // ESRCH: it exited and is about to be reaped.
                    Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(pb::KillResponse {}),
                    Err(e) => Err(ShimError::io(format!("kill {pid} with {sig}"), e)),
                }
            }
            Init::Stopped(_) => Err(ShimError::Precondition(format!(
                "container {} is stopped",
                self.ctr.id()
            ))),
        }
    }

    fn exec_sync(
        &mut self,
        x: pb::ExecSyncRequest,
        conn: UnixStream,
    ) -> Result<(), (UnixStream, ShimError)> {
        if !matches!(self.init, Init::Running { .. }) {
            let e = ShimError::Precondition(format!("container {} is not running", self.ctr.id()));
            return Err((conn, e));
        }
        if x.args.is_empty() {
            return Err((conn, ShimError::Precondition("exec needs args".into())));
        }
        let setup = || -> Result<_, ShimError> {
            let (out_r, out_w) = cloexec_pipe().ctx(|| "pipe".to_string())?;
            let (err_r, err_w) = cloexec_pipe().ctx(|| "pipe".to_string())?;
            let null = fs::File::open("/dev/null").ctx(|| "open /dev/null".to_string())?;
            set_nonblocking(&out_r).ctx(|| "pipe non-blocking".to_string())?;
            set_nonblocking(&err_r).ctx(|| "pipe non-blocking".to_string())?;
            let cwd = (!x.cwd.is_empty()).then(|| PathBuf::from(&x.cwd));
            let stdio = Stdio {
                stdin: Some(null.into()),
                stdout: out_w,
                stderr: err_w,
            };
            let pid = self.ctr.exec(x.args.clone(), &x.env, cwd, stdio)?;
            let pidfd = match pidfd_open(pid) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = kill(pid, Signal::SIGKILL);
                    reap_blocking(pid);
                    return Err(ShimError::io(format!("pidfd_open {pid}"), e));
                }
            };
            Ok((pid, pidfd, out_r, err_r))
        };
        match setup() {
            Ok((pid, pidfd, out_r, err_r)) => {
                let cap = match usize::try_from(x.output_cap) {
                    Ok(0) | Err(_) => DEFAULT_OUTPUT_CAP,
                    Ok(n) => n.min(DEFAULT_OUTPUT_CAP),
                };
                self.execs.push(Exec {
                    conn,
                    pid,
                    pidfd,
                    outs: [Some(out_r), Some(err_r)],
                    bufs: [Vec::new(), Vec::new()],
                    cap,
                    deadline: (x.timeout_ms > 0)
                        .then(|| Instant::now() + Duration::from_millis(x.timeout_ms)),
                    timed_out: false,
                });
                Ok(())
            }
            Err(e) => Err((conn, e)),
        }
    }

    fn delete(&mut self) -> Result<pb::DeleteResponse, ShimError> {
        if let Init::Created { pid, .. } | Init::Running { pid, .. } = &self.init {
            let pid = *pid;
            let _ = kill(pid, Signal::SIGKILL);
            let code = self.reap_killed(pid).ok_or_else(|| {
                ShimError::Precondition(format!(
                    "init {pid} of container {} did not exit within {KILL_REAP_TIMEOUT:?} of SIGKILL",
                    self.ctr.id()
                ))
            })?;
            self.init_exited(code);
        }
        self.ctr.delete()?;
        self.streams.kill_all();
        for e in self.execs.drain(..) {
            let _ = kill(e.pid, Signal::SIGKILL);
            let code = reap_blocking(e.pid);
            respond(
                &e.conn,
                Ok(pb::response::Result::ExecSync(pb::ExecSyncResponse {
                    stdout: e.bufs[0].clone(),
                    stderr: e.bufs[1].clone(),
                    exit_code: code,
                    timed_out: e.timed_out,
                })),
            );
        }
        for i in 0..2 {
            self.pump_output(i);
        }
        self.exit_requested = true;
        let exit = match &self.init {
            Init::Stopped(info) => Some(pb_exit(info)),
            _ => None,
        };
        Ok(pb::DeleteResponse { exit })
    }
}

/// A stand-in while `start` moves the init state out and back.
/// Waits (at most 2 s) until the started init has exec'd the container's program.
///
/// libcontainer's start only releases the init, which still runs our own image until its
/// execve. A stop signal sent in that window reaches a pid-namespace init that has not yet
/// installed its handlers and is dropped, so StartContainer returns once the image changed.
fn wait_for_exec(pid: Pid) {
    use std::os::unix::fs::MetadataExt;
    let exe = PathBuf::from(format!("/proc/{}/exe", pid.as_raw()));
    // Compared by inode: the init's path may read differently once it pivoted its root.
    let ident = |m: fs::Metadata| (m.dev(), m.ino());
    let Ok(before) = fs::metadata("/proc/self/exe").map(ident) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut pause = Duration::from_micros(50);
    while Instant::now() < deadline {
        match fs::metadata(&exe).map(ident) {
            Ok(now) if now != before => return,
            Ok(_) => {}
            Err(_) => return, // exited (or reaped): nothing to wait for
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    tracing::warn!(pid = pid.as_raw(), "container init did not exec within 2 s");
}

/// Orders stream slots so that removals by index stay valid.
fn stream_slot_key(s: StreamSlot) -> (usize, usize) {
    match s {
        StreamSlot::ExecConn(i) | StreamSlot::ExecPid(i) => (0, i),
        StreamSlot::AttachConn(i) => (1, i),
    }
}

fn placeholder() -> ExitInfo {
    ExitInfo {
        exit_code: -1,
        exited_at: String::new(),
        oom_killed: false,
    }
}
