//! Pinned pod namespaces: network, IPC and UTS namespaces kept alive by bind mounts, no pause
//! process.
//!
//! berthd is multi-threaded, and `unshare` there would move only the calling thread, so the
//! namespaces are made by a short-lived child: berthd re-executes itself as
//! `berthd pin-namespaces …` ([`run_pin_child`]), which is single-threaded, unshares, sets the
//! hostname, brings loopback up, applies sysctls, bind-mounts `/proc/self/ns/<kind>` onto the
//! target files and exits. Removing a pod unmounts and deletes the files.
//!
//! A pod with its own user namespace gets it first: a holder process unshares the user
//! namespace together with the others (the kernel makes the user namespace first, so it owns
//! them, which the pod's root needs to join them, mount sysfs or set the hostname), the pin
//! child writes its id maps, enters its network, IPC and UTS namespaces to set them up, and
//! pins all four from the holder.
//!
//! A pod that shares one PID namespace among its containers needs a live process as that
//! namespace's init (a PID namespace whose init died accepts no new process). The pin child
//! then also unshares the PID namespace and starts `berth-pod-init` ([`super::pod_init`]) in
//! it: a detached process that contains itself like a container and only reaps orphans, pinned
//! like the others and killed with the pod.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::process::HostProcess;
use super::userns::{self, IdRange, PodIds};

/// Which namespaces a pod pins, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinRequest {
    /// File to pin a new network namespace on (None: the pod uses the host's).
    pub net: Option<PathBuf>,
    /// File to pin a new IPC namespace on.
    pub ipc: Option<PathBuf>,
    /// File to pin a new UTS namespace on.
    pub uts: Option<PathBuf>,
    /// File to pin a new PID namespace on; its init is `berth-pod-init`.
    pub pid: Option<PathBuf>,
    /// File to pin the pod's own user namespace on, and its id mappings (None: the host's).
    pub user: Option<(PathBuf, PodIds)>,
    /// cgroup directories the pod init joins (its leaf below the pod cgroup, one per hierarchy).
    pub cgroups: Vec<PathBuf>,
    /// Hostname to set in the new UTS namespace.
    pub hostname: Option<String>,
    /// Sysctls (`net.*` in the new network namespace, `kernel.shm*`/`kernel.msg*`/`kernel.sem`/
    /// `fs.mqueue.*` in the new IPC namespace).
    pub sysctls: Vec<(String, String)>,
}

/// Why pinning failed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// A sysctl that is not namespaced, or names a namespace the pod does not own.
    #[error(
        "sysctl {0}: not allowed for this pod (not namespaced, or the pod uses the host's namespace)"
    )]
    SysctlNotAllowed(String),
    /// A malformed sysctl name.
    #[error("sysctl {0:?}: invalid name")]
    SysctlInvalid(String),
    /// A step of the child failed.
    #[error("{step}: {error}")]
    Step { step: String, error: std::io::Error },
    /// The child could not run or reported failure.
    #[error("pinning namespaces: {0}")]
    Child(String),
}

fn step(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> PinError {
    let step = step.into();
    move |error| PinError::Step { step, error }
}

/// Which namespace a sysctl lives in, per the kernel's namespacing.
fn sysctl_namespace(name: &str) -> Option<&'static str> {
    if name.starts_with("net.") {
        Some("net")
    } else if name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name == "kernel.sem"
        || name.starts_with("fs.mqueue.")
    {
        Some("ipc")
    } else if name == "kernel.hostname" || name == "kernel.domainname" {
        Some("uts")
    } else {
        None
    }
}

/// Checks sysctls against the namespaces the pod owns (before anything is created).
pub fn validate_sysctls(req: &PinRequest) -> Result<(), PinError> {
    for (name, _) in &req.sysctls {
        if name.is_empty()
            || name.contains("..")
            || name.starts_with('.')
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        {
            return Err(PinError::SysctlInvalid(name.clone()));
        }
        let owned = match sysctl_namespace(name) {
            Some("net") => req.net.is_some(),
            Some("ipc") => req.ipc.is_some(),
            Some("uts") => req.uts.is_some(),
            _ => false,
        };
        if !owned {
            return Err(PinError::SysctlNotAllowed(name.clone()));
        }
    }
    Ok(())
}

/// Pins the namespaces by running `exe pin-namespaces` (berthd itself); waits for it.
/// Returns the pod init when a PID namespace was asked for.
pub async fn pin(exe: &Path, req: &PinRequest) -> Result<Option<HostProcess>, PinError> {
    validate_sysctls(req)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("pin-namespaces");
    for (flag, path) in [
        ("--net", &req.net),
        ("--ipc", &req.ipc),
        ("--uts", &req.uts),
        ("--pid", &req.pid),
    ] {
        if let Some(p) = path {
            cmd.arg(flag).arg(p);
        }
    }
    if let Some((path, ids)) = &req.user {
        cmd.arg("--user").arg(path);
        cmd.arg("--uid-map").arg(range_arg(&ids.uids));
        cmd.arg("--gid-map").arg(range_arg(&ids.gids));
    }
    for dir in &req.cgroups {
        cmd.arg("--cgroup").arg(dir);
    }
    if let Some(h) = &req.hostname {
        cmd.arg("--hostname").arg(h);
    }
    for (k, v) in &req.sysctls {
        cmd.arg("--sysctl").arg(format!("{k}={v}"));
    }
    let out = cmd
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| PinError::Child(format!("starting {}: {e}", exe.display())))?;
    if out.status.success() {
        if req.pid.is_none() {
            return Ok(None);
        }
        let printed = String::from_utf8_lossy(&out.stdout);
        return match printed.trim().parse::<i32>().ok().and_then(HostProcess::of) {
            Some(init) => Ok(Some(init)),
            None => {
                unpin(req);
                Err(PinError::Child(format!(
                    "the pod init did not start (pin child printed {:?})",
                    printed.trim()
                )))
            }
        };
    }
    // A failed child may have pinned some namespaces already.
    unpin(req);
    Err(PinError::Child(
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    ))
}

/// `CONTAINER:HOST:LENGTH`, as `pin-namespaces` takes a mapping.
pub fn range_arg(r: &IdRange) -> String {
    format!("{}:{}:{}", r.container_id, r.host_id, r.length)
}

/// Parses [`range_arg`]'s form.
pub fn parse_range(arg: &str) -> Option<IdRange> {
    let mut parts = arg.split(':').map(|p| p.parse::<u32>().ok());
    match (parts.next()?, parts.next()?, parts.next()?, parts.next()) {
        (Some(container_id), Some(host_id), Some(length), None) => Some(IdRange {
            container_id,
            host_id,
            length,
        }),
        _ => None,
    }
}

/// Unmounts and removes pinned namespace files; absent ones are fine. Idempotent.
pub fn unpin(req: &PinRequest) {
    let user = req.user.as_ref().map(|(p, _)| p.clone());
    for path in [&req.net, &req.ipc, &req.uts, &req.pid, &user]
        .into_iter()
        .flatten()
    {
        match rustix::mount::unmount(path.as_path(), rustix::mount::UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unmounting pinned namespace")
            }
        }
        if let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "removing pinned namespace file");
        }
    }
}

/// The body of `berthd pin-namespaces`: runs in a fresh, single-threaded process.
pub fn run_pin_child(req: &PinRequest) -> Result<(), PinError> {
    use rustix::thread::UnshareFlags;
    validate_sysctls(req)?;
    let mut flags = UnshareFlags::empty();
    if req.net.is_some() {
        flags |= UnshareFlags::NEWNET;
    }
    if req.ipc.is_some() {
        flags |= UnshareFlags::NEWIPC;
    }
    if req.uts.is_some() {
        flags |= UnshareFlags::NEWUTS;
    }
    let holder = match &req.user {
        None => {
            // SAFETY: this process is single-threaded (a fresh exec of berthd that has started
            // no runtime or thread), so unsharing moves the whole process, as intended.
            unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(|e| PinError::Step {
                step: "unshare".into(),
                error: e.into(),
            })?;
            None
        }
        Some((target, ids)) => {
            let holder = Holder::start(flags | UnshareFlags::NEWUSER)?;
            userns::write_maps(holder.pid, ids).map_err(step("mapping the pod's ids"))?;
            holder.enter(req)?;
            bind_namespace(&format!("/proc/{}/ns/user", holder.pid), target)?;
            Some(holder)
        }
    };
    if let (Some(_), Some(h)) = (&req.uts, &req.hostname) {
        rustix::system::sethostname(h.as_bytes()).map_err(|e| PinError::Step {
            step: format!("sethostname {h}"),
            error: e.into(),
        })?;
    }
    if req.net.is_some() {
        loopback_up()?;
    }
    for (name, value) in &req.sysctls {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        std::fs::write(&path, value).map_err(step(format!("sysctl {name}={value}")))?;
    }
    for (kind, target) in [("net", &req.net), ("ipc", &req.ipc), ("uts", &req.uts)] {
        if let Some(target) = target {
            bind_namespace(&format!("/proc/self/ns/{kind}"), target)?;
        }
    }
    if let Some(target) = &req.pid {
        let init = match &holder {
            Some(h) => h.start_pod_init(&req.cgroups)?,
            None => start_pod_init(&req.cgroups)?,
        };
        let bound = bind_namespace(&format!("/proc/{init}/ns/pid"), target);
        if bound.is_err()
            && let Some(pid) = rustix::process::Pid::from_raw(init)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        bound?;
        println!("{init}");
    }
    Ok(())
}

/// A child of the pin child that holds a pod's new user namespace (and the namespaces it owns)
/// while they are set up and pinned; it exits when dropped.
struct Holder {
    pid: i32,
    /// Closing it tells the holder to exit.
    release: Option<std::os::fd::OwnedFd>,
}

impl Holder {
    /// Forks the holder, which unshares `flags` and waits; returns once it has.
    fn start(flags: rustix::thread::UnshareFlags) -> Result<Self, PinError> {
        let (ready_r, ready_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| PinError::Step {
                step: "pipe".into(),
                error: e.into(),
            })?;
        let (release_r, release_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| PinError::Step {
                step: "pipe".into(),
                error: e.into(),
            })?;
        // SAFETY: the pin child is single-threaded, so the forked child may run any code; it
        // only unshares, writes one byte, reads until the parent closes its end, and exits
        // with _exit (no destructors, no atexit handlers of the parent's state).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(PinError::Step {
                step: "fork".into(),
                error: std::io::Error::last_os_error(),
            });
        }
        if pid == 0 {
            drop(ready_r);
            drop(release_w);
            // SAFETY: this forked child is single-threaded.
            let status = match unsafe { rustix::thread::unshare_unsafe(flags) } {
                Ok(()) => u8::from(rustix::io::write(&ready_w, b"1").is_err()),
                Err(_) => 1,
            };
            let mut byte = [0u8; 1];
            let _ = rustix::io::read(&release_r, &mut byte);
            // SAFETY: _exit ends the child at once, which is all it has left to do.
            unsafe { libc::_exit(i32::from(status)) };
        }
        drop(ready_w);
        drop(release_r);
        let holder = Self {
            pid,
            release: Some(release_w),
        };
        let mut byte = [0u8; 1];
        match rustix::io::read(&ready_r, &mut byte) {
            Ok(1) => Ok(holder),
            _ => Err(PinError::Child(
                "the holder of the pod's user namespace could not unshare its namespaces".into(),
            )),
        }
    }

    /// Moves this process into the holder's network, IPC and UTS namespaces (those `req`
    /// pins), staying in the host's user namespace with its privileges.
    fn enter(&self, req: &PinRequest) -> Result<(), PinError> {
        for (kind, wanted, ns_type) in [
            (
                "net",
                req.net.is_some(),
                rustix::thread::LinkNameSpaceType::Network,
            ),
            (
                "ipc",
                req.ipc.is_some(),
                rustix::thread::LinkNameSpaceType::InterProcessCommunication,
            ),
            (
                "uts",
                req.uts.is_some(),
                rustix::thread::LinkNameSpaceType::HostNameAndNISDomainName,
            ),
        ] {
            if !wanted {
                continue;
            }
            let path = format!("/proc/{}/ns/{kind}", self.pid);
            let fd = std::fs::File::open(&path).map_err(step(format!("opening {path}")))?;
            rustix::thread::move_into_link_name_space(fd.as_fd(), Some(ns_type)).map_err(|e| {
                PinError::Step {
                    step: format!("entering {path}"),
                    error: e.into(),
                }
            })?;
        }
        Ok(())
    }

    /// Starts `berth-pod-init` as pid 1 of a new PID namespace owned by the holder's user
    /// namespace (through a short-lived child that enters it: the pin child itself must keep the
    /// host's privileges to mount and to move the init into `cgroups`).
    fn start_pod_init(&self, cgroups: &[PathBuf]) -> Result<i32, PinError> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| {
            PinError::Step {
                step: "pipe".into(),
                error: e.into(),
            }
        })?;
        let userns = format!("/proc/{}/ns/user", self.pid);
        // SAFETY: the pin child is single-threaded, so the forked child may run any code; it
        // ends with _exit.
        let child = unsafe { libc::fork() };
        if child < 0 {
            return Err(PinError::Step {
                step: "fork".into(),
                error: std::io::Error::last_os_error(),
            });
        }
        if child == 0 {
            drop(r);
            let started = std::fs::File::open(&userns)
                .map_err(|e| format!("opening {userns}: {e}"))
                .and_then(|f| {
                    rustix::thread::move_into_link_name_space(
                        f.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::User),
                    )
                    .map_err(|e| format!("entering {userns}: {e}"))
                })
                .and_then(|()| become_namespace_root())
                .and_then(|()| start_pod_init(&[]).map_err(|e| e.to_string()));
            let status = match started {
                Ok(pid) => i32::from(rustix::io::write(&w, &pid.to_ne_bytes()).is_err()),
                Err(e) => {
                    // The pin child's stderr becomes the error berthd reports.
                    eprintln!("{e}");
                    1
                }
            };
            // SAFETY: _exit ends the child at once, which is all it has left to do.
            unsafe { libc::_exit(status) };
        }
        drop(w);
        let mut buf = [0u8; 4];
        let got = rustix::io::read(&r, &mut buf);
        let mut status = 0;
        // SAFETY: `child` is our own child; waitpid only writes the status integer.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let init = match got {
            Ok(4) => i32::from_ne_bytes(buf),
            _ => {
                return Err(PinError::Child(
                    "the pod init did not start in the pod's user namespace".into(),
                ));
            }
        };
        join_cgroups(init, cgroups)?;
        Ok(init)
    }
}

/// Takes uid and gid 0 of the user namespace just entered (the host's root is not mapped
/// there), so that the pod init keeps its capabilities in that namespace across its exec, as it
/// needs them to contain itself.
fn become_namespace_root() -> Result<(), String> {
    // SAFETY: setresgid/setresuid take plain ids; this forked child is single-threaded, so the
    // credentials of the whole process change.
    let rc = unsafe {
        if libc::setresgid(0, 0, 0) != 0 {
            -1
        } else {
            libc::setresuid(0, 0, 0)
        }
    };
    if rc != 0 {
        return Err(format!(
            "becoming root of the pod's user namespace: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.release.take();
        let mut status = 0;
        // SAFETY: `pid` is our own child, released just above; waitpid only writes the status.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

/// Bind-mounts the namespace file `source` on `target` (created empty first).
fn bind_namespace(source: &str, target: &Path) -> Result<(), PinError> {
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).map_err(step(format!("creating {}", dir.display())))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target)
        .map_err(step(format!("creating {}", target.display())))?;
    rustix::mount::mount_bind(source, target).map_err(|e| PinError::Step {
        step: format!("bind-mounting {source} on {}", target.display()),
        error: e.into(),
    })
}

/// Unshares the PID namespace and starts `berth-pod-init` as its pid 1, detached (own
/// session, stdio on /dev/null) in `cgroups`; returns its host pid.
fn start_pod_init(cgroups: &[PathBuf]) -> Result<i32, PinError> {
    use std::os::unix::process::CommandExt;
    // SAFETY: this process is single-threaded (see run_pin_child); unsharing the PID namespace
    // affects only the children it creates next, of which the pod init is the first.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWPID) }.map_err(
        |e| PinError::Step {
            step: "unshare PID namespace".into(),
            error: e.into(),
        },
    )?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("berth-pod-init")
        .arg("pod-init")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(step("starting berth-pod-init"))?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    // The init reports once it is contained (or why it could not be), then closes its stdout.
    let mut report = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.by_ref().take(4096).read_to_string(&mut report);
    }
    if report.trim() != super::pod_init::READY {
        let _ = child.kill();
        let _ = child.wait();
        return Err(PinError::Child(if report.trim().is_empty() {
            "berth-pod-init exited before it was contained".into()
        } else {
            report.trim().to_string()
        }));
    }
    join_cgroups(pid, cgroups)?;
    // The child is not waited for: once this process exits it is re-parented to the host's
    // init (or a subreaper), and lives as long as the pod.
    std::mem::forget(child);
    Ok(pid)
}

/// Moves process `pid` into `cgroups` (one directory per hierarchy); kills it on failure.
fn join_cgroups(pid: i32, cgroups: &[PathBuf]) -> Result<(), PinError> {
    for dir in cgroups {
        let procs = dir.join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, pid.to_string()) {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            return Err(PinError::Step {
                step: format!("moving the pod init into {}", procs.display()),
                error: e,
            });
        }
    }
    Ok(())
}

/// Brings `lo` up in the current network namespace.
fn loopback_up() -> Result<(), PinError> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0");
    // A fresh namespace has lo down, so binding 127.0.0.1 may fail; any datagram socket works
    // for the ioctl, so fall back to an unbound one.
    let fd = match sock {
        Ok(s) => std::os::fd::OwnedFd::from(s),
        Err(_) => rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::DGRAM,
            None,
        )
        .map_err(|e| PinError::Step {
            step: "socket for loopback".into(),
            error: e.into(),
        })?,
    };
    let mut ifr: libc::ifreq = unsafe_zeroed_ifreq();
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: `ifr` is a valid, initialised ifreq naming "lo"; SIOCGIFFLAGS/SIOCSIFFLAGS read
    // and write only its flags union member, and `raw` is an open socket we own.
    let got = unsafe { libc::ioctl(raw, libc::SIOCGIFFLAGS, &mut ifr) };
    if got < 0 {
        return Err(PinError::Step {
            step: "reading lo flags".into(),
            error: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialised one.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above.
    let set = unsafe { libc::ioctl(raw, libc::SIOCSIFFLAGS, &ifr) };
    if set < 0 {
        return Err(PinError::Step {
            step: "bringing lo up".into(),
            error: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn unsafe_zeroed_ifreq() -> libc::ifreq {
    // SAFETY: ifreq is a plain C struct of byte arrays and integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctls_must_belong_to_an_owned_namespace() {
        let mut req = PinRequest {
            net: Some("/x/net".into()),
            ..Default::default()
        };
        req.sysctls = vec![("net.ipv4.ip_forward".into(), "1".into())];
        assert!(validate_sysctls(&req).is_ok());
        req.sysctls = vec![("kernel.shmmax".into(), "1".into())];
        assert!(matches!(
            validate_sysctls(&req),
            Err(PinError::SysctlNotAllowed(_))
        ));
        req.sysctls = vec![("vm.swappiness".into(), "1".into())];
        assert!(matches!(
            validate_sysctls(&req),
            Err(PinError::SysctlNotAllowed(_))
        ));
        req.sysctls = vec![("net/../../x".into(), "1".into())];
        assert!(matches!(
            validate_sysctls(&req),
            Err(PinError::SysctlInvalid(_))
        ));
    }
}
