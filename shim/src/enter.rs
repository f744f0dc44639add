//! Starting a process inside the running container (exec): it joins the cgroups and namespaces
//! of the container's init, takes on the container process's identity and restrictions (user,
//! groups, rlimits, AppArmor, no_new_privs, capabilities, seccomp, umask, oom_score_adj) and
//! execs. Until the exec it is not dumpable, and its working directory is resolved inside the
//! container's root and checked to be there.
//!
//! libcontainer 0.7's tenant builder does the same at several times the cost: its intermediate
//! process builds a cgroup manager that, on cgroup v1, reads `/proc/self/mountinfo` once per
//! controller (fourteen reads, about 7 ms with two hundred mounts on the host, more with more
//! pods), and it reloads the container's state and spec and writes a process file each time.
//! Here the cgroup mounts are read once per shim, the spec once per container, and the order of
//! the steps is the one libcontainer's init uses (and runc's).
//!
//! Two forks: the first child starts in the container's cgroup v2 (clone3 CLONE_INTO_CGROUP) or
//! is moved into its cgroups by the shim (cgroup v1, older kernels), joins its pid
//! (and time) namespace, which applies to its children only, and forks the process that execs;
//! then it exits, so that process is re-parented to the shim (a child subreaper). A pipe that
//! closes on exec carries any failure back as one line.

use std::ffi::CString;
use std::fs;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Process, Spec};
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::socket::{AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};
use nix::unistd::{ForkResult, Gid, Pid, Uid};

use crate::clone_into;
use crate::error::{IoContext, ShimError};

/// How long the exec'd process may take from fork to exec before it is killed.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What the new process's stdio is.
pub enum Io {
    /// These descriptors as stdin, stdout and stderr.
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// A new pty of the container's devpts; its master is returned.
    Tty,
}

/// A process started in the container.
pub struct Entered {
    /// Its host pid (a child of the shim).
    pub pid: Pid,
    /// The pty master, for [`Io::Tty`].
    pub pty: Option<OwnedFd>,
}

/// Namespace kinds in the order they are joined: the user namespace first (the others may be
/// owned by it), the mount namespace last of those joined by the process itself (its root and
/// working directory become the container's). Pid and time apply to children only and are
/// joined before the second fork.
const NAMESPACES: [(LinuxNamespaceType, &str, CloneFlags); 8] = [
    (LinuxNamespaceType::User, "user", CloneFlags::CLONE_NEWUSER),
    (LinuxNamespaceType::Ipc, "ipc", CloneFlags::CLONE_NEWIPC),
    (LinuxNamespaceType::Uts, "uts", CloneFlags::CLONE_NEWUTS),
    (LinuxNamespaceType::Network, "net", CloneFlags::CLONE_NEWNET),
    (
        LinuxNamespaceType::Cgroup,
        "cgroup",
        CloneFlags::CLONE_NEWCGROUP,
    ),
    (LinuxNamespaceType::Mount, "mnt", CloneFlags::CLONE_NEWNS),
    (LinuxNamespaceType::Pid, "pid", CloneFlags::CLONE_NEWPID),
    // CLONE_NEWTIME, which nix does not name.
    (
        LinuxNamespaceType::Time,
        "time",
        CloneFlags::from_bits_retain(0x80),
    ),
];

/// A namespace of the init to join.
struct Join {
    kind: LinuxNamespaceType,
    flag: CloneFlags,
    fd: OwnedFd,
}

/// Starts `process` (the container's own process with the exec's args, env and cwd) in the
/// container `id` whose init is `init` and whose spec is `spec`.
pub fn spawn(
    id: &str,
    init: Pid,
    spec: &Spec,
    process: &Process,
    io: Io,
) -> Result<Entered, ShimError> {
    let fail = |message: String| ShimError::Enter {
        id: id.to_string(),
        message,
    };
    let joins = namespaces(init, spec).map_err(fail)?;
    let mut procs = cgroup_procs(init).map_err(fail)?;
    let mut plan = Plan::new(spec, process).map_err(fail)?;
    // The exec is the container's as much as its init is, for the OOM killer too (not the
    // shim's, which runs at berthd's adjustment).
    plan.oom_score_adj = fs::read_to_string(format!("/proc/{init}/oom_score_adj"))
        .ok()
        .map(|s| s.trim().to_string());
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ctx(|| "pipe".into())?;
    let (go_r, go_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ctx(|| "pipe".into())?;
    let (pid_r, pid_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ctx(|| "pipe".into())?;
    let console = match io {
        Io::Tty => Some(
            nix::sys::socket::socketpair(
                AddressFamily::Unix,
                SockType::Stream,
                None,
                SockFlag::SOCK_CLOEXEC,
            )
            .ctx(|| "console socketpair".into())?,
        ),
        Io::Pipes { .. } => None,
    };
    // The first child starts in the init's cgroup v2 where the kernel can put it there (it then
    // need not be moved); otherwise it is forked and moved.
    let into = procs
        .iter()
        .find(|p| p.unified)
        .and_then(|p| p.file.parent())
        .and_then(|dir| clone_into::open_cgroup(dir).ok());
    let (forked, placed) = fork_first_child(into.as_ref())?;
    if placed {
        procs.retain(|p| !p.unified);
    }
    match forked {
        ForkResult::Child => {
            drop((err_r, go_w, pid_r));
            intermediate(go_r, pid_w, err_w, &joins, &plan, io, console.map(|c| c.1))
        }
        ForkResult::Parent { child } => {
            drop((go_r, pid_w, err_w));
            let console = console.map(|(ours, theirs)| {
                drop(theirs);
                ours
            });
            parent(id, child, &procs, go_w, pid_r, err_r, console).map_err(|e| match e {
                Failure::Shim(e) => e,
                Failure::Child(m) => fail(m),
            })
        }
    }
}

/// Forks the exec's first child, into the cgroup `into` where the kernel can (then `true`).
fn fork_first_child(into: Option<&OwnedFd>) -> Result<(ForkResult, bool), ShimError> {
    if let Some(fd) = into {
        // SAFETY: the shim is single-threaded (see container.rs), so the child may allocate
        // and use any library code; it ends in exec or _exit and never returns here.
        match unsafe { clone_into::fork_into(fd) } {
            Ok(forked) => return Ok((forked, true)),
            Err(e) => tracing::debug!("clone3 into the cgroup: {e}; forking and moving the child"),
        }
    }
    // SAFETY: as above, single-threaded; the child ends in exec or _exit.
    let forked = unsafe { nix::unistd::fork() }.ctx(|| "fork".into())?;
    Ok((forked, false))
}

enum Failure {
    Shim(ShimError),
    Child(String),
}

impl From<ShimError> for Failure {
    fn from(e: ShimError) -> Self {
        Self::Shim(e)
    }
}

/// The shim's side: the first child into the cgroups, then the exec'd process's pid and its
/// outcome.
fn parent(
    id: &str,
    first: Pid,
    procs: &[CgroupProcs],
    go: OwnedFd,
    pid_r: OwnedFd,
    err_r: OwnedFd,
    console: Option<OwnedFd>,
) -> Result<Entered, Failure> {
    let abort = |e: Failure| {
        let _ = kill(first, Signal::SIGKILL);
        crate::server::reap_blocking(first);
        e
    };
    let me = first.as_raw().to_string();
    for p in procs {
        if let Err(e) = fs::write(&p.file, &me) {
            return Err(abort(Failure::Child(format!(
                "joining cgroup {}: {e}",
                p.file.display()
            ))));
        }
    }
    let mut go = fs::File::from(go);
    if let Err(e) = go.write_all(b"g") {
        return Err(abort(Failure::Shim(ShimError::io("start exec", e))));
    }
    drop(go);
    let mut pid_bytes = [0u8; 4];
    let got_pid = fs::File::from(pid_r).read_exact(&mut pid_bytes);
    crate::server::reap_blocking(first);
    let mut err = fs::File::from(err_r);
    if got_pid.is_err() {
        let mut message = String::new();
        let _ = err.read_to_string(&mut message);
        return Err(Failure::Child(if message.is_empty() {
            "the exec's first child ended early".into()
        } else {
            message
        }));
    }
    let pid = Pid::from_raw(i32::from_le_bytes(pid_bytes));
    let message = match read_until_exec(&mut err, pid) {
        Ok(m) => m,
        Err(e) => {
            let _ = kill(pid, Signal::SIGKILL);
            crate::server::reap_blocking(pid);
            return Err(e.into());
        }
    };
    if !message.is_empty() {
        crate::server::reap_blocking(pid);
        return Err(Failure::Child(message));
    }
    let pty = match console {
        Some(c) => match receive_fd(c.as_raw_fd()) {
            Ok(fd) => Some(fd),
            Err(e) => {
                let _ = kill(pid, Signal::SIGKILL);
                crate::server::reap_blocking(pid);
                return Err(e.into());
            }
        },
        None => None,
    };
    tracing::debug!(container = %id, %pid, "exec started");
    Ok(Entered { pid, pty })
}

/// Reads the failure pipe until it closes (the exec happened, or the process failed and wrote
/// why); gives up after [`START_TIMEOUT`].
fn read_until_exec(err: &mut fs::File, pid: Pid) -> Result<String, ShimError> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(ShimError::Precondition(format!(
                "exec'd process {pid} did not start within {START_TIMEOUT:?}"
            )));
        }
        let mut pfd = libc::pollfd {
            fd: err.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let mut chunk = [0u8; 1024];
        match err.read(&mut chunk) {
            Ok(0) => return Ok(String::from_utf8_lossy(&out).trim().to_string()),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(ShimError::io("read the exec's start result", e)),
        }
    }
}

/// Takes the descriptor already sent over the connected socket `fd` (the pty master); never
/// blocks.
pub fn receive_fd(fd: RawFd) -> Result<OwnedFd, ShimError> {
    let mut name = [0u8; 256];
    let mut iov = [IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = nix::sys::socket::recvmsg::<()>(
        fd,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .ctx(|| "receive pty master".to_string())?;
    let mut received = None;
    for cmsg in msg.cmsgs().ctx(|| "receive pty master".to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel installed this descriptor in our table for this message;
                // nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                received.get_or_insert(owned);
            }
        }
    }
    received.ok_or_else(|| ShimError::Precondition("no pty master was sent".into()))
}

/// The first child: waits to be in the cgroups, joins the pid and time namespaces, forks the
/// process that execs and reports its pid.
fn intermediate(
    go: OwnedFd,
    pid_w: OwnedFd,
    err_w: OwnedFd,
    joins: &[Join],
    plan: &Plan,
    io: Io,
    console: Option<OwnedFd>,
) -> ! {
    let mut byte = [0u8; 1];
    if !matches!(fs::File::from(go).read(&mut byte), Ok(1)) {
        exit(1);
    }
    for j in joins.iter().filter(|j| for_children(&j.kind)) {
        if let Err(e) = nix::sched::setns(j.fd.as_fd(), j.flag) {
            report(&err_w, &format!("joining the {:?} namespace: {e}", j.kind));
        }
    }
    // SAFETY: single-threaded (the shim's copy); the child execs or exits.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop(pid_w);
            let Err(message) = start(joins, plan, io, console);
            report(&err_w, &message)
        }
        Ok(ForkResult::Parent { child }) => {
            let _ = fs::File::from(pid_w).write_all(&child.as_raw().to_le_bytes());
            exit(0)
        }
        Err(e) => report(&err_w, &format!("fork: {e}")),
    }
}

/// Whether joining this kind of namespace only applies to children.
fn for_children(kind: &LinuxNamespaceType) -> bool {
    matches!(kind, LinuxNamespaceType::Pid | LinuxNamespaceType::Time)
}

/// Writes why the exec failed for the shim and exits.
fn report(err_w: &OwnedFd, message: &str) -> ! {
    let _ = nix::unistd::write(err_w, message.as_bytes());
    exit(126)
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the forked child at once, running no atexit handlers or destructors
    // that belong to the shim.
    unsafe { libc::_exit(code) }
}

/// Everything the process needs, prepared before the fork.
struct Plan {
    args: Vec<CString>,
    env: Vec<String>,
    path: Option<String>,
    cwd: PathBuf,
    uid: u32,
    gid: u32,
    gids: Vec<Gid>,
    umask: Option<u32>,
    no_new_privileges: bool,
    process: Process,
    seccomp: Option<libcontainer::oci_spec::runtime::LinuxSeccomp>,
    /// The container init's `oom_score_adj`, given to the process.
    oom_score_adj: Option<String>,
}

impl Plan {
    fn new(spec: &Spec, process: &Process) -> Result<Self, String> {
        let args: Vec<CString> = process
            .args()
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| "an argument holds a NUL byte".to_string())?;
        if args.is_empty() {
            return Err("exec needs args".into());
        }
        let env = process.env().clone().unwrap_or_default();
        if env.iter().any(|e| e.contains('\0')) {
            return Err("an environment entry holds a NUL byte".into());
        }
        let path = env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .map(str::to_string);
        let user = process.user();
        Ok(Self {
            args,
            path,
            env,
            cwd: process.cwd().clone(),
            uid: user.uid(),
            gid: user.gid(),
            gids: user
                .additional_gids()
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|g| Gid::from_raw(*g))
                .collect(),
            umask: user.umask(),
            no_new_privileges: process.no_new_privileges() == Some(true),
            process: process.clone(),
            seccomp: spec.linux().as_ref().and_then(|l| l.seccomp().clone()),
            oom_score_adj: None,
        })
    }
}

/// The exec'd process, in the container's pid namespace: everything else, then exec. Returns
/// only with the reason it could not.
fn start(
    joins: &[Join],
    plan: &Plan,
    io: Io,
    console: Option<OwnedFd>,
) -> Result<std::convert::Infallible, String> {
    let syscall = libcontainer::syscall::syscall::create_syscall();
    // Not dumpable until execve (which makes it dumpable again): while it holds the shim's
    // descriptors and privileges, nothing in the container may ptrace it or open its /proc
    // files.
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers and changes only this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_DUMPABLE: {}",
            std::io::Error::last_os_error()
        ));
    }
    if let Some(adj) = &plan.oom_score_adj {
        // Raising it always works; lowering needs CAP_SYS_RESOURCE, and without it the
        // process keeps the shim's (higher) value, as the init's was clamped too.
        let _ = fs::write("/proc/self/oom_score_adj", adj);
    }
    // The shim's signal mask is inherited across exec; nothing of it belongs to the process.
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    if let Io::Pipes {
        stdin,
        stdout,
        stderr,
    } = io
    {
        for (fd, target) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
            stdio(fd, target)?;
        }
    }
    for j in joins.iter().filter(|j| !for_children(&j.kind)) {
        nix::sched::setns(j.fd.as_fd(), j.flag)
            .map_err(|e| format!("joining the {:?} namespace: {e}", j.kind))?;
    }
    if plan.no_new_privileges {
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    }
    if let Some(c) = console {
        // A pty of the container's devpts (the mount namespace is the container's now), its
        // master sent to the shim, its slave the controlling terminal and stdio.
        libcontainer::tty::setup_console(syscall.as_ref(), c.as_raw_fd(), false)
            .map_err(|e| format!("setting up the terminal: {e}"))?;
        std::mem::forget(c);
    }
    if let Some(profile) = plan.process.apparmor_profile() {
        libcontainer::apparmor::apply_profile(profile)
            .map_err(|e| format!("AppArmor profile {profile}: {e}"))?;
    }
    if let Some(umask) = plan.umask {
        let mode = nix::sys::stat::Mode::from_bits(umask)
            .ok_or_else(|| format!("invalid umask {umask:o}"))?;
        nix::sys::stat::umask(mode);
    }
    // An unprivileged user may not be able to enter the directory yet: again after setuid.
    let chdir_later = match enter_cwd(&plan.cwd) {
        Ok(()) => false,
        Err(nix::errno::Errno::EPERM | nix::errno::Errno::EACCES) => true,
        Err(e) => return Err(format!("chdir {}: {e}", plan.cwd.display())),
    };
    let home = home_of(plan);
    syscall
        .set_groups(&plan.gids)
        .map_err(|e| format!("supplementary groups {:?}: {e}", plan.gids))?;
    syscall
        .set_id(Uid::from_raw(plan.uid), Gid::from_raw(plan.gid))
        .map_err(|e| format!("uid {} gid {}: {e}", plan.uid, plan.gid))?;
    for r in plan.process.rlimits().as_deref().unwrap_or_default() {
        syscall
            .set_rlimit(r)
            .map_err(|e| format!("rlimit {:?}: {e}", r.typ()))?;
    }
    // Every descriptor but stdio is gone at exec (the failure pipe too: that is its signal).
    syscall
        .close_range(0)
        .map_err(|e| format!("closing descriptors: {e}"))?;
    // Without no_new_privs the kernel takes a filter only from a privileged process: load it
    // while the capabilities are still there (as runc and libcontainer do).
    if !plan.no_new_privileges {
        seccomp(plan)?;
    }
    libcontainer::capabilities::reset_effective(syscall.as_ref())
        .map_err(|e| format!("capabilities: {e}"))?;
    if let Some(caps) = plan.process.capabilities() {
        libcontainer::capabilities::drop_privileges(caps, syscall.as_ref())
            .map_err(|e| format!("capabilities: {e}"))?;
    }
    if chdir_later {
        enter_cwd(&plan.cwd).map_err(|e| format!("chdir {}: {e}", plan.cwd.display()))?;
    }
    verify_cwd(&plan.cwd)?;
    if plan.no_new_privileges {
        seccomp(plan)?;
    }
    let mut env = plan.env.clone();
    if let Some(home) = home {
        env.push(format!("HOME={home}"));
    }
    let env: Vec<CString> = env
        .into_iter()
        .filter_map(|e| CString::new(e).ok())
        .collect();
    let exe = executable(&plan.args[0], plan.path.as_deref())?;
    let e = nix::unistd::execve(&exe, &plan.args, &env).err();
    Err(format!(
        "exec {}: {}",
        exe.to_string_lossy(),
        e.map_or_else(|| "failed".to_string(), |e| e.to_string())
    ))
}

/// Changes to the working directory `cwd`, resolved inside the process's root (the
/// container's, once its mount namespace is joined): symlinks are followed as if that root were
/// `/` and magic links (`/proc/<pid>/root`, `/proc/<pid>/cwd`, ...) are refused. Kernels
/// without openat2 fall back to chdir, and [`verify_cwd`] still holds.
fn enter_cwd(cwd: &Path) -> nix::Result<()> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: `open` returned this descriptor just now and nothing else owns it.
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match nix::fcntl::openat2(root.as_raw_fd(), cwd, how) {
        Ok(dir) => {
            // SAFETY: `openat2` returned this descriptor just now and nothing else owns it.
            let dir = unsafe { OwnedFd::from_raw_fd(dir) };
            nix::unistd::fchdir(dir.as_raw_fd())
        }
        Err(nix::errno::Errno::ENOSYS) => nix::unistd::chdir(cwd),
        Err(e) => Err(e),
    }
}

/// Checks that the working directory lies inside the process's root: `getcwd` fails (or names
/// no absolute path) for a directory reached through a link out of it.
fn verify_cwd(cwd: &Path) -> Result<(), String> {
    match nix::unistd::getcwd() {
        Ok(p) if p.is_absolute() => Ok(()),
        _ => Err(format!(
            "working directory {} leads outside the container's root",
            cwd.display()
        )),
    }
}

fn seccomp(plan: &Plan) -> Result<(), String> {
    if let Some(s) = &plan.seccomp {
        libcontainer::seccomp::initialize_seccomp(s).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// Puts `fd` at descriptor `target`, open across exec.
fn stdio(fd: OwnedFd, target: RawFd) -> Result<(), String> {
    if fd.as_raw_fd() == target {
        // Already there: only its close-on-exec flag goes.
        nix::fcntl::fcntl(
            target,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| format!("stdio {target}: {e}"))?;
        std::mem::forget(fd);
        return Ok(());
    }
    nix::unistd::dup2(fd.as_raw_fd(), target).map_err(|e| format!("stdio {target}: {e}"))?;
    Ok(())
}

/// HOME for a process whose environment has none: the user's home in the container's
/// `/etc/passwd`, as libcontainer and runc set it.
fn home_of(plan: &Plan) -> Option<String> {
    if plan
        .env
        .iter()
        .any(|e| e.strip_prefix("HOME=").is_some_and(|h| !h.is_empty()))
    {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && f[2].parse() == Ok(plan.uid)).then(|| f[5].to_string())
    })
}

/// The file to exec for `name`: itself when it names a path, else the first match in `path`.
fn executable(name: &CString, path: Option<&str>) -> Result<CString, String> {
    let name_str = name.to_string_lossy();
    if name_str.contains('/') {
        if fs::symlink_metadata(&*name_str).is_err() {
            return Err(format!("executable '{name_str}' not found"));
        }
        return Ok(name.clone());
    }
    let path = path.ok_or_else(|| "PATH environment variable is not set".to_string())?;
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(&*name_str);
        if let Ok(meta) = fs::metadata(&candidate)
            && meta.is_file()
            && meta.mode() & 0o111 != 0
        {
            return CString::new(candidate.into_os_string().into_encoded_bytes())
                .map_err(|_| "a PATH entry holds a NUL byte".to_string());
        }
    }
    Err(format!("executable '{name_str}' not found in $PATH"))
}

/// The init's namespaces this process is not in already, in joining order.
fn namespaces(init: Pid, spec: &Spec) -> Result<Vec<Join>, String> {
    let listed: Vec<LinuxNamespaceType> = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default()
        .iter()
        .map(|n| n.typ())
        .collect();
    let mut out = Vec::new();
    for (kind, name, flag) in NAMESPACES {
        if !listed.contains(&kind) {
            continue;
        }
        let theirs = format!("/proc/{init}/ns/{name}");
        let file = fs::File::open(&theirs).map_err(|e| format!("open {theirs}: {e}"))?;
        let same = match (
            file.metadata(),
            fs::metadata(format!("/proc/self/ns/{name}")),
        ) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if !same {
            out.push(Join {
                kind,
                flag,
                fd: file.into(),
            });
        }
    }
    Ok(out)
}

/// The `cgroup.procs` file of one cgroup the init is in.
struct CgroupProcs {
    file: PathBuf,
    /// In the cgroup v2 hierarchy.
    unified: bool,
}

/// The `cgroup.procs` files of every cgroup the init is in.
fn cgroup_procs(init: Pid) -> Result<Vec<CgroupProcs>, String> {
    let file = format!("/proc/{init}/cgroup");
    let text = fs::read_to_string(&file).map_err(|e| format!("read {file}: {e}"))?;
    let mounts = cgroup_mounts();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Some(mount) = mounts.iter().find(|m| m.serves(controllers)) else {
            continue;
        };
        out.push(CgroupProcs {
            file: mount
                .point
                .join(path.trim_start_matches('/'))
                .join("cgroup.procs"),
            unified: mount.options.is_none(),
        });
    }
    Ok(out)
}

/// A cgroup hierarchy's mount point and what it holds (v1: its controllers and `name=`; v2:
/// nothing).
struct CgroupMount {
    point: PathBuf,
    /// None for cgroup2.
    options: Option<Vec<String>>,
}

impl CgroupMount {
    /// Whether this mount is the hierarchy of a `/proc/<pid>/cgroup` line's controllers.
    fn serves(&self, controllers: &str) -> bool {
        match &self.options {
            None => controllers.is_empty(),
            Some(options) => {
                !controllers.is_empty()
                    && controllers
                        .split(',')
                        .all(|c| options.iter().any(|o| o == c))
            }
        }
    }
}

/// The host's cgroup mounts, read once per shim (they do not change while it runs).
fn cgroup_mounts() -> &'static [CgroupMount] {
    static MOUNTS: OnceLock<Vec<CgroupMount>> = OnceLock::new();
    MOUNTS.get_or_init(|| {
        fs::read_to_string("/proc/self/mountinfo")
            .map(|t| parse_cgroup_mounts(&t))
            .unwrap_or_default()
    })
}

fn parse_cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out: Vec<CgroupMount> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let (Some(fstype), Some(_source), Some(options)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        let options = match fstype {
            "cgroup2" => None,
            "cgroup" => Some(options.split(',').map(str::to_string).collect()),
            _ => continue,
        };
        let point = PathBuf::from(unescape(point));
        // A hierarchy mounted twice is joined once, at its first mount.
        if out.iter().any(|m| m.options == options) {
            continue;
        }
        out.push(CgroupMount { point, options });
    }
    out
}

/// A mountinfo path with its octal escapes (`\040` for a space) decoded.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
36 30 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
37 30 0:32 / /mnt/with\\040space rw,nosuid - cgroup cgroup rw,memory
";

    #[test]
    fn cgroup_lines_map_to_their_hierarchies() {
        let mounts = parse_cgroup_mounts(MOUNTINFO);
        assert_eq!(mounts.len(), 4, "the second memory mount is skipped");
        let find = |c: &str| {
            mounts
                .iter()
                .find(|m| m.serves(c))
                .map(|m| m.point.display().to_string())
        };
        assert_eq!(find("").as_deref(), Some("/sys/fs/cgroup/unified"));
        assert_eq!(
            find("name=systemd").as_deref(),
            Some("/sys/fs/cgroup/systemd")
        );
        assert_eq!(
            find("cpu,cpuacct").as_deref(),
            Some("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(find("memory").as_deref(), Some("/sys/fs/cgroup/memory"));
        assert_eq!(find("pids"), None);
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
    }

    #[test]
    fn executables_are_found_on_the_path() {
        let sh = CString::new("sh").expect("cstring");
        assert_eq!(
            executable(&sh, Some("/nonexistent:/bin")).expect("found"),
            CString::new("/bin/sh").expect("cstring")
        );
        let missing = CString::new("no-such-binary-here").expect("cstring");
        assert_eq!(
            executable(&missing, Some("/bin")).expect_err("missing"),
            "executable 'no-such-binary-here' not found in $PATH"
        );
        assert!(executable(&sh, None).is_err(), "no PATH");
        let abs = CString::new("/bin/sh").expect("cstring");
        assert_eq!(executable(&abs, None).expect("as is"), abs);
        let gone = CString::new("/no/such/binary").expect("cstring");
        assert_eq!(
            executable(&gone, None).expect_err("missing"),
            "executable '/no/such/binary' not found"
        );
    }
}
