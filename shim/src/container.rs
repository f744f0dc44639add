//! The one container this shim owns: created, started, signalled and deleted through
//! libcontainer, entered for execs by the shim's own `enter`.
//!
//! libcontainer is not thread-safe and changes the working directory: the shim is single-
//! threaded, calls it from one place at a time, and passes absolute paths only.

use std::cell::OnceCell;
use std::fs;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::error::LibcontainerError;
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use nix::unistd::Pid;

use crate::args::Args;
use crate::error::{IoContext, ShimError};
use crate::oom_watch::{self, OomWatch};
use crate::{enter, exec_process};

/// Where a pure cgroup v2 hierarchy is mounted (the systemd driver runs on nothing else).
const V2_ROOT: &str = "/sys/fs/cgroup";

/// Stdio handed to a container process.
pub struct Stdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

pub struct Ctr {
    id: String,
    bundle: PathBuf,
    container: Container,
    /// The cgroup path libcontainer resolved (relative to each hierarchy's mount point).
    cgroup_path: Option<PathBuf>,
    /// Under the systemd driver, the OOM kills seen while the scope lived (systemd removes it,
    /// and its `memory.events`, once the last process is gone).
    oom_watch: Option<OomWatch>,
    /// Under the systemd driver, the parent's `memory.events` and its `oom_kill` count when the
    /// container was made: the parent (the pod's slice) outlives the scope and counts the OOM
    /// kills of everything below it.
    oom_parent: Option<(PathBuf, u64)>,
    /// The bundle's spec, once an exec has read it.
    spec: OnceCell<Spec>,
}

impl Ctr {
    /// Creates the container (its init waits for [`Ctr::start`]).
    pub fn create(
        args: &Args,
        stdio: Option<Stdio>,
        console_socket: Option<&Path>,
    ) -> Result<Self, ShimError> {
        let (id, bundle, state_root) = (args.id.as_str(), &args.bundle, &args.state_root);
        fs::create_dir_all(state_root)
            .ctx(|| format!("create state root {}", state_root.display()))?;
        remove_stale(id, state_root);
        let wrap = |op, source| ShimError::Container {
            op,
            id: id.to_string(),
            bundle: bundle.to_path_buf(),
            source: Box::new(source),
        };
        let saved_oom = fs::read_to_string("/proc/self/oom_score_adj").ok();
        check_oom_score_adj(bundle, saved_oom.as_deref())?;
        let mut builder = ContainerBuilder::new(id.to_string(), SyscallType::default())
            .with_root_path(state_root)
            .map_err(|e| wrap("create", e))?
            .with_console_socket(console_socket);
        if let Some(stdio) = stdio {
            builder = builder.with_stdout(stdio.stdout).with_stderr(stdio.stderr);
            if let Some(stdin) = stdio.stdin {
                builder = builder.with_stdin(stdin);
            }
        }
        let built = builder
            .as_init(bundle)
            .with_systemd(args.systemd_cgroup)
            .with_detach(true)
            .build();
        // libcontainer writes the spec's oom_score_adj into the shim itself; put ours back
        // (raising always works; lowering may not, which is then only logged).
        if let Some(v) = saved_oom
            && let Err(e) = fs::write("/proc/self/oom_score_adj", v.trim())
        {
            tracing::warn!("restore shim oom_score_adj {}: {e}", v.trim());
        }
        let container = built.map_err(|e| wrap("create", e))?;
        // A systemd cgroupsPath names a scope; the init's own cgroup is its path.
        let cgroup_path = if args.systemd_cgroup {
            container
                .pid()
                .and_then(|pid| unified_cgroup_of(pid.as_raw()))
        } else {
            container.spec().ok().map(|c| c.cgroup_path)
        };
        let (mut oom_watch, mut oom_parent) = (None, None);
        if let (Some(cg), true) = (&cgroup_path, args.systemd_cgroup) {
            let dir = Path::new(V2_ROOT).join(cg.strip_prefix("/").unwrap_or(cg));
            match OomWatch::new(&dir) {
                Ok(w) => oom_watch = Some(w),
                Err(e) => tracing::warn!("following the OOM kills of {}: {e}", dir.display()),
            }
            oom_parent = dir.parent().map(|p| p.join("memory.events")).and_then(|f| {
                let n = oom_watch::read_count(&f)?;
                Some((f, n))
            });
        }
        Ok(Self {
            id: id.to_string(),
            bundle: bundle.to_path_buf(),
            container,
            cgroup_path,
            oom_watch,
            oom_parent,
            spec: OnceCell::new(),
        })
    }

    fn wrap(&self, op: &'static str, source: LibcontainerError) -> ShimError {
        ShimError::Container {
            op,
            id: self.id.clone(),
            bundle: self.bundle.clone(),
            source: Box::new(source),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bundle(&self) -> &Path {
        &self.bundle
    }

    /// The init's host pid.
    pub fn pid(&self) -> Option<Pid> {
        self.container.pid()
    }

    pub fn start(&mut self) -> Result<(), ShimError> {
        self.container.start().map_err(|e| self.wrap("start", e))
    }

    /// Signals every process in the container's cgroup.
    pub fn kill_all(&mut self, signal: i32) -> Result<(), ShimError> {
        let sig = Signal::try_from(signal)
            .map_err(|e| ShimError::Precondition(format!("bad signal {signal}: {e}")))?;
        self.container
            .kill(sig, true)
            .map_err(|e| self.wrap("kill", e))
    }

    /// The bundle's OCI spec, read the first time an exec needs it (the process, namespaces
    /// and seccomp filter an exec takes on never change).
    fn spec(&self) -> Result<&Spec, ShimError> {
        if let Some(spec) = self.spec.get() {
            return Ok(spec);
        }
        let spec = exec_process::load_spec(&self.bundle)?;
        Ok(self.spec.get_or_init(|| spec))
    }

    fn enter(
        &self,
        args: Vec<String>,
        env: &[String],
        cwd: Option<PathBuf>,
        io: enter::Io,
    ) -> Result<enter::Entered, ShimError> {
        let init = self.pid().ok_or_else(|| {
            ShimError::Precondition(format!("container {} has no init process", self.id))
        })?;
        let spec = self.spec()?;
        let tty = matches!(io, enter::Io::Tty);
        let process = exec_process::exec_process(spec, args, env, cwd, tty)?;
        enter::spawn(&self.id, init, spec, &process, io)
    }

    /// Starts `args` inside the container as the container's own process would run (user,
    /// groups, capabilities, seccomp); returns its host pid (a child of the shim).
    pub fn exec(
        &self,
        args: Vec<String>,
        env: &[String],
        cwd: Option<PathBuf>,
        stdio: Stdio,
    ) -> Result<Pid, ShimError> {
        let stdin = match stdio.stdin {
            Some(fd) => fd,
            None => fs::File::open("/dev/null")
                .ctx(|| "open /dev/null".to_string())?
                .into(),
        };
        let io = enter::Io::Pipes {
            stdin,
            stdout: stdio.stdout,
            stderr: stdio.stderr,
        };
        self.enter(args, env, cwd, io).map(|e| e.pid)
    }

    /// Starts `args` inside the container on a new terminal of the container's devpts; returns
    /// its host pid and the terminal's master.
    pub fn exec_tty(
        &self,
        args: Vec<String>,
        env: &[String],
        cwd: Option<PathBuf>,
    ) -> Result<(Pid, OwnedFd), ShimError> {
        let entered = self.enter(args, env, cwd, enter::Io::Tty)?;
        match entered.pty {
            Some(pty) => Ok((entered.pid, pty)),
            None => Err(ShimError::Precondition("no terminal was made".into())),
        }
    }

    /// The OOM watch's descriptor to poll, while the container's scope lives.
    pub fn oom_poll_fd(&self) -> Option<RawFd> {
        self.oom_watch.as_ref().and_then(OomWatch::poll_fd)
    }

    /// Reads the OOM-kill count after a change notification.
    pub fn oom_changed(&mut self) {
        if let Some(w) = &mut self.oom_watch {
            w.refresh();
        }
    }

    /// The cgroup's OOM-kill counter (v1 `memory.oom_control`, v2 `memory.events`). Under the
    /// systemd driver the scope may be gone by the time the init's exit is seen: then the kills
    /// seen while it lived count, and, for an init ended by SIGKILL (`sigkilled`), the kills its
    /// parent counted since the container was made.
    pub fn oom_kills(&mut self, sigkilled: bool) -> u64 {
        let seen = self.oom_watch.as_mut().map_or(0, |w| {
            w.refresh();
            w.seen()
        });
        if seen > 0 {
            return seen;
        }
        let parent = || match &self.oom_parent {
            Some((file, base)) if sigkilled => {
                oom_watch::read_count(file).map_or(0, |n| n.saturating_sub(*base))
            }
            _ => 0,
        };
        let Some(cg) = &self.cgroup_path else {
            return seen;
        };
        let rel = cg.strip_prefix("/").unwrap_or(cg);
        let candidates = [
            (
                Path::new("/sys/fs/cgroup/memory").join(rel),
                "memory.oom_control",
            ),
            (Path::new("/sys/fs/cgroup").join(rel), "memory.events"),
            (
                Path::new("/sys/fs/cgroup/unified").join(rel),
                "memory.events",
            ),
        ];
        for (dir, file) in candidates {
            if let Some(n) = fs::read_to_string(dir.join(file))
                .ok()
                .as_deref()
                .and_then(oom_watch::oom_kill_count)
            {
                return n;
            }
        }
        parent()
    }

    /// Deletes the container (SIGKILLs what is left in its cgroup, removes cgroups and state).
    /// The caller reaps the init.
    pub fn delete(&mut self) -> Result<(), ShimError> {
        let _ = self.container.refresh_status();
        self.container
            .delete(true)
            .map_err(|e| self.wrap("delete", e))
    }
}

/// The cgroup v2 path of process `pid` (its `0::` line of /proc/PID/cgroup).
fn unified_cgroup_of(pid: i32) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(PathBuf::from)
}

/// libcontainer sets the spec's oom_score_adj on the shim itself before forking, and fails with
/// a bare "io error" when it may not lower it (root cannot, on some hosts). Try the write here
/// so that the failure names the value and the reason.
fn check_oom_score_adj(bundle: &Path, current: Option<&str>) -> Result<(), ShimError> {
    let config = bundle.join("config.json");
    let text = fs::read(&config).ctx(|| format!("read {}", config.display()))?;
    let spec: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        ShimError::Precondition(format!("bundle {}: config.json: {e}", bundle.display()))
    })?;
    let Some(wanted) = spec["process"]["oomScoreAdj"].as_i64() else {
        return Ok(());
    };
    let Some(current) = current.and_then(|c| c.trim().parse::<i64>().ok()) else {
        return Ok(());
    };
    if wanted >= current {
        return Ok(());
    }
    fs::write("/proc/self/oom_score_adj", wanted.to_string()).map_err(|e| {
        ShimError::Precondition(format!(
            "bundle {}: process.oomScoreAdj {wanted} is below the shim's own {current} and \
             this host does not allow lowering it ({e}); clamp it to at least {current}",
            bundle.display()
        ))
    })
}

/// Deletes a container left by an earlier shim with the same id (its init may be stuck in
/// "created" forever if that shim died before start).
fn remove_stale(id: &str, state_root: &Path) {
    let dir = state_root.join(id);
    if !dir.exists() {
        return;
    }
    tracing::warn!("removing stale container state {}", dir.display());
    match Container::load(dir.clone()) {
        Ok(mut c) => {
            if let Err(e) = c.delete(true) {
                tracing::warn!("delete stale container {id}: {e}");
            }
        }
        Err(e) => tracing::warn!("load stale container {id}: {e}"),
    }
    if dir.exists() {
        let _ = fs::remove_dir_all(&dir);
    }
}
