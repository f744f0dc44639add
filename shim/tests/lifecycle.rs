//! End-to-end tests of berth-shim with real containers (run as root): a busybox bundle, the
//! shim's CLI, its socket API, the CRI log and the exit file.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{getsockopt, sockopt};
use nix::unistd::Pid;
use prost::Message;

#[allow(clippy::all, clippy::pedantic)]
mod pb {
    include!(concat!(env!("OUT_DIR"), "/berth.shim.v1.rs"));
}

use pb::request::Request as Req;
use pb::response::Result as Res;

const SHIM: &str = env!("CARGO_BIN_EXE_berth-shim");
const CGROUP_PARENT: &str = "berth-test";

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A bundle, its shim and everything they leave behind; cleaned up on drop.
struct Fixture {
    dir: PathBuf,
    id: String,
    cgroup: String,
    shim_pid: Option<Pid>,
    init_pid: Option<Pid>,
    tty: bool,
}

fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{}-{}-{:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

impl Fixture {
    /// A bundle whose init runs `args`.
    fn new(args: &[&str]) -> Self {
        Self::with_memory_limit(args, None)
    }

    /// A bundle whose init runs `args`, optionally under a memory limit in bytes.
    fn with_memory_limit(args: &[&str], limit: Option<i64>) -> Self {
        let u = unique();
        let dir = std::env::temp_dir().join(format!("berth-shim-test-{u}"));
        let f = Self {
            id: format!("t-{u}"),
            cgroup: u,
            dir,
            shim_pid: None,
            init_pid: None,
            tty: false,
        };
        let rootfs = f.bundle().join("rootfs");
        for d in ["bin", "proc", "dev", "sys", "tmp"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for l in ["sh", "echo", "sleep", "true", "false", "cat"] {
            symlink("busybox", rootfs.join("bin").join(l)).unwrap();
        }
        f.write_config(args, &rootfs, limit);
        f
    }

    fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }
    fn socket(&self) -> PathBuf {
        self.dir.join("shim.sock")
    }
    fn log(&self) -> PathBuf {
        self.dir.join("container.log")
    }
    fn exit_file(&self) -> PathBuf {
        self.dir.join("exit.json")
    }
    fn state_root(&self) -> PathBuf {
        self.dir.join("state")
    }

    fn write_config(&self, args: &[&str], rootfs: &Path, memory_limit: Option<i64>) {
        let caps = ["CAP_CHOWN", "CAP_KILL", "CAP_SETUID", "CAP_SETGID"];
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": { "uid": 0, "gid": 0 },
                "args": args,
                "env": ["PATH=/bin", "HOME=/"],
                "cwd": "/",
                "capabilities": { "bounding": caps, "effective": caps, "permitted": caps },
                "noNewPrivileges": true
            },
            "root": { "path": rootfs, "readonly": false },
            "hostname": "berth-test",
            "mounts": [
                { "destination": "/proc", "type": "proc", "source": "proc",
                  "options": ["nosuid", "noexec", "nodev"] },
                { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                  "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
                { "destination": "/sys", "type": "sysfs", "source": "sysfs",
                  "options": ["nosuid", "noexec", "nodev", "ro"] }
            ],
            "linux": {
                "namespaces": [
                    { "type": "pid" }, { "type": "ipc" }, { "type": "uts" },
                    { "type": "mount" }, { "type": "network" }
                ],
                "cgroupsPath": format!("/{CGROUP_PARENT}/{}", self.cgroup),
                "resources": { "devices": [{ "allow": false, "access": "rwm" }] }
            }
        });
        let mut config = config;
        if let Some(limit) = memory_limit {
            config["linux"]["resources"]["memory"] =
                serde_json::json!({ "limit": limit, "swap": limit });
        }
        fs::write(
            self.bundle().join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
    }

    /// Gives the container a terminal (process.terminal and a devpts mount) and passes --tty.
    fn with_tty(mut self) -> Self {
        let path = self.bundle().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        config["process"]["terminal"] = serde_json::Value::Bool(true);
        config["mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "destination": "/dev/pts", "type": "devpts", "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
            }));
        fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        self.tty = true;
        self
    }

    /// Runs the shim's CLI (the create step); returns its output once the parent exits.
    fn spawn(&mut self) -> Output {
        let out = Command::new(SHIM)
            .arg("--id")
            .arg(&self.id)
            .arg("--bundle")
            .arg(self.bundle())
            .arg("--socket")
            .arg(self.socket())
            .arg("--log-path")
            .arg(self.log())
            .arg("--exit-file")
            .arg(self.exit_file())
            .arg("--state-root")
            .arg(self.state_root())
            .args(self.tty.then_some("--tty"))
            .output()
            .unwrap();
        if out.status.success() {
            let (r, pid) = self.try_call_peer(Req::State(pb::StateRequest {})).unwrap();
            self.shim_pid = Some(pid);
            if let Some(Res::State(st)) = r.result {
                self.init_pid = Some(Pid::from_raw(st.pid as i32));
            }
            // The create step prints the pids its caller watches: the shim's, the init's.
            let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let expected = format!(
                "{} {}",
                pid,
                self.init_pid.map(Pid::as_raw).unwrap_or_default()
            );
            assert_eq!(printed, expected, "pids printed by the create step");
        }
        out
    }

    /// Spawns and requires success.
    fn created(mut self) -> Self {
        let out = self.spawn();
        assert!(
            out.status.success(),
            "create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self
    }

    fn try_call(&self, req: Req) -> Result<pb::Response, Box<dyn std::error::Error>> {
        Ok(self.try_call_peer(req)?.0)
    }

    /// Calls the shim; also returns the pid of the process serving the socket.
    fn try_call_peer(&self, req: Req) -> Result<(pb::Response, Pid), Box<dyn std::error::Error>> {
        let mut s = UnixStream::connect(self.socket())?;
        let peer = Pid::from_raw(getsockopt(&s, sockopt::PeerCredentials)?.pid());
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let body = pb::Request { request: Some(req) }.encode_to_vec();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        s.write_all(&frame)?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut buf)?;
        Ok((pb::Response::decode(buf.as_slice())?, peer))
    }

    /// Calls the shim and requires success.
    fn call(&self, req: Req) -> Res {
        let r = self.try_call(req).unwrap();
        assert!(r.error.is_empty(), "shim error: {}", r.error);
        r.result.unwrap()
    }

    fn start(&self) {
        assert!(matches!(
            self.call(Req::Start(pb::StartRequest {})),
            Res::Start(_)
        ));
    }

    fn wait(&self, timeout_ms: u64) -> pb::WaitResponse {
        match self.call(Req::Wait(pb::WaitRequest { timeout_ms })) {
            Res::Wait(w) => w,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn state(&self) -> pb::StateResponse {
        match self.call(Req::State(pb::StateRequest {})) {
            Res::State(s) => s,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn exit_json(&self) -> serde_json::Value {
        serde_json::from_slice(&fs::read(self.exit_file()).unwrap()).unwrap()
    }

    fn shim_alive(&self) -> bool {
        self.shim_pid.is_some_and(|p| {
            fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        })
    }

    /// Deletes through the API and waits for the shim to exit.
    fn delete(&self) -> pb::DeleteResponse {
        let r = match self.call(Req::Delete(pb::DeleteRequest {})) {
            Res::Delete(d) => d,
            other => panic!("unexpected {other:?}"),
        };
        let until = Instant::now() + Duration::from_secs(5);
        while self.shim_alive() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!self.shim_alive(), "shim still running after Delete");
        r
    }

    fn log_records(&self) -> Vec<(String, String, String, String)> {
        let text = fs::read_to_string(self.log()).unwrap_or_default();
        text.lines()
            .map(|l| {
                let mut p = l.splitn(4, ' ');
                let mut next = || p.next().unwrap_or("").to_string();
                (next(), next(), next(), next())
            })
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.shim_alive() {
            let _ = self.try_call(Req::Delete(pb::DeleteRequest {}));
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(p) = self.shim_pid.filter(|_| self.shim_alive()) {
            let _ = kill(p, Signal::SIGKILL);
        }
        if let Some(p) = self.init_pid {
            let _ = kill(p, Signal::SIGKILL);
        }
        for ctl in fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let cg = ctl.path().join(CGROUP_PARENT).join(&self.cgroup);
            if cg.exists() {
                if let Ok(procs) = fs::read_to_string(cg.join("cgroup.procs")) {
                    for p in procs.split_whitespace().filter_map(|p| p.parse().ok()) {
                        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                    }
                }
                let until = Instant::now() + Duration::from_secs(2);
                while let Err(e) = fs::remove_dir(&cg) {
                    if Instant::now() >= until {
                        eprintln!("cleanup: rmdir {}: {e}", cg.display());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`
fn is_rfc3339_nano(ts: &str) -> bool {
    let b = ts.as_bytes();
    b.len() == 30
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            29 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn output_goes_to_cri_log_and_exit_file() -> TestResult {
    let f = Fixture::new(&["sh", "-c", "echo hello; echo err >&2"]).created();
    assert_eq!(f.state().status, pb::Status::Created as i32);
    f.start();
    let w = f.wait(10_000);
    assert!(w.exited);
    assert_eq!(w.exit.unwrap().exit_code, 0);
    let recs = f.log_records();
    assert_eq!(recs.len(), 2, "log: {recs:?}");
    for (ts, _, tag, _) in &recs {
        assert!(is_rfc3339_nano(ts), "bad timestamp {ts}");
        assert_eq!(tag, "F");
    }
    let out: Vec<_> = recs.iter().filter(|r| r.1 == "stdout").collect();
    let err: Vec<_> = recs.iter().filter(|r| r.1 == "stderr").collect();
    assert_eq!((out.len(), out[0].3.as_str()), (1, "hello"));
    assert_eq!((err.len(), err[0].3.as_str()), (1, "err"));
    let e = f.exit_json();
    assert_eq!(e["exit_code"], 0);
    assert_eq!(e["reason"], "Completed");
    assert_eq!(e["oom_killed"], false);
    assert!(is_rfc3339_nano(e["exited_at"].as_str().unwrap_or("")));
    Ok(())
}

#[test]
fn exit_code_reported_everywhere() -> TestResult {
    let f = Fixture::new(&["sh", "-c", "exit 3"]).created();
    f.start();
    let w = f.wait(10_000);
    assert!(w.exited);
    assert_eq!(w.exit.unwrap().exit_code, 3);
    let st = f.state();
    assert_eq!(st.status, pb::Status::Stopped as i32);
    let ex = st.exit.unwrap();
    assert_eq!((ex.exit_code, ex.reason.as_str()), (3, "Error"));
    assert_eq!(f.exit_json()["exit_code"], 3);
    assert_eq!(f.exit_json()["reason"], "Error");
    Ok(())
}

#[test]
fn kill_gives_137_and_wait_times_out_before() -> TestResult {
    let f = Fixture::new(&["sleep", "1000"]).created();
    f.start();
    assert_eq!(f.state().status, pb::Status::Running as i32);
    let t = Instant::now();
    let w = f.wait(200);
    assert!(!w.exited && t.elapsed() >= Duration::from_millis(190));
    f.call(Req::Kill(pb::KillRequest {
        signal: 9,
        all: false,
    }));
    let w = f.wait(10_000);
    assert_eq!(w.exit.unwrap().exit_code, 137);
    assert_eq!(f.state().status, pb::Status::Stopped as i32);
    assert_eq!(f.exit_json()["exit_code"], 137);
    Ok(())
}

#[test]
fn exec_sync_output_and_timeout() -> TestResult {
    let f = Fixture::new(&["sleep", "1000"]).created();
    f.start();
    let exec = |args: &[&str], timeout_ms| match f.call(Req::ExecSync(pb::ExecSyncRequest {
        args: args.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        cwd: String::new(),
        timeout_ms,
        output_cap: 0,
    })) {
        Res::ExecSync(x) => x,
        other => panic!("unexpected {other:?}"),
    };
    let r = exec(&["echo", "hi"], 10_000);
    assert_eq!(String::from_utf8_lossy(&r.stdout), "hi\n");
    assert_eq!((r.exit_code, r.timed_out), (0, false));
    let r = match f.call(Req::ExecSync(pb::ExecSyncRequest {
        args: vec!["sh".into(), "-c".into(), "echo $FOO $PATH; pwd".into()],
        env: vec!["FOO=bar".into()],
        cwd: "/proc".into(),
        timeout_ms: 10_000,
        output_cap: 0,
    })) {
        Res::ExecSync(x) => x,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(String::from_utf8_lossy(&r.stdout), "bar /bin\n/proc\n");
    let r = match f.call(Req::ExecSync(pb::ExecSyncRequest {
        args: vec![
            "sh".into(),
            "-c".into(),
            "i=0; while [ $i -lt 1000 ]; do echo 0123456789; i=$((i+1)); done".into(),
        ],
        env: vec![],
        cwd: String::new(),
        timeout_ms: 10_000,
        output_cap: 100,
    })) {
        Res::ExecSync(x) => x,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!((r.stdout.len(), r.exit_code), (100, 0));
    let r = exec(&["sh", "-c", "echo oops >&2; exit 4"], 10_000);
    assert_eq!(String::from_utf8_lossy(&r.stderr), "oops\n");
    assert_eq!(r.exit_code, 4);
    let t = Instant::now();
    let r = exec(&["sleep", "100"], 300);
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 137);
    assert!(t.elapsed() < Duration::from_secs(5));
    // A command that cannot be run is an error or exit code, never a hang.
    let r = f.try_call(Req::ExecSync(pb::ExecSyncRequest {
        args: vec!["/no/such/binary".into()],
        env: vec![],
        cwd: String::new(),
        timeout_ms: 5_000,
        output_cap: 0,
    }))?;
    eprintln!("exec of a missing binary: {r:?}");
    match r.result {
        Some(Res::ExecSync(x)) => assert_ne!(x.exit_code, 0),
        _ => assert!(!r.error.is_empty()),
    }
    // The container itself still runs.
    assert_eq!(f.state().status, pb::Status::Running as i32);
    // A failed exec leaves a zombie helper in the container's pid namespace; Delete must not
    // deadlock on the init waiting for it.
    let t = Instant::now();
    f.delete();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    Ok(())
}

#[test]
fn natural_exit_after_failed_exec_is_seen_promptly() -> TestResult {
    let f = Fixture::new(&["sleep", "1"]).created();
    f.start();
    let r = f.try_call(Req::ExecSync(pb::ExecSyncRequest {
        args: vec!["/no/such/binary".into()],
        env: vec![],
        cwd: String::new(),
        timeout_ms: 5_000,
        output_cap: 0,
    }))?;
    assert!(!r.error.is_empty() || r.result.is_some());
    let t = Instant::now();
    let w = f.wait(20_000);
    assert_eq!(w.exit.unwrap().exit_code, 0);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    Ok(())
}

#[test]
fn long_line_split_into_partial_records() -> TestResult {
    let script = "s=aaaaaaaaaaaaaaaa; s=$s$s$s$s; s=$s$s$s$s; s=$s$s$s$s; \
                  i=0; while [ $i -lt 40 ]; do printf %s $s; i=$((i+1)); done; echo; printf tail";
    let f = Fixture::new(&["sh", "-c", script]).created();
    f.start();
    assert_eq!(f.wait(10_000).exit.unwrap().exit_code, 0);
    let recs = f.log_records();
    let shape: Vec<_> = recs.iter().map(|r| (r.2.as_str(), r.3.len())).collect();
    assert_eq!(
        shape,
        // The unterminated "tail" is partial, as containerd writes it.
        vec![("P", 16384), ("P", 16384), ("F", 40960 - 32768), ("P", 4)],
        "records"
    );
    assert!(recs.iter().all(|r| r.1 == "stdout"));
    Ok(())
}

#[test]
fn delete_removes_state_and_shim_exits() -> TestResult {
    let f = Fixture::new(&["sleep", "1000"]).created();
    f.start();
    let state_dir = f.state_root().join(&f.id);
    assert!(state_dir.exists());
    let d = f.delete();
    assert_eq!(d.exit.unwrap().exit_code, 137);
    assert!(!state_dir.exists(), "container state left behind");
    assert!(!f.socket().exists(), "socket left behind");
    assert!(
        !Path::new("/sys/fs/cgroup/memory")
            .join(CGROUP_PARENT)
            .join(&f.cgroup)
            .exists()
    );
    assert_eq!(f.exit_json()["exit_code"], 137);
    Ok(())
}

#[test]
fn delete_of_never_started_container() -> TestResult {
    let f = Fixture::new(&["true"]).created();
    let init = f.init_pid.unwrap();
    f.delete();
    assert!(
        !Path::new(&format!("/proc/{init}")).exists(),
        "init left behind"
    );
    assert!(!f.state_root().join(&f.id).exists());
    Ok(())
}

#[test]
fn failed_create_exits_nonzero_naming_bundle() -> TestResult {
    let mut f = Fixture::new(&["true"]);
    fs::remove_dir_all(f.bundle().join("rootfs"))?;
    let out = f.spawn();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&f.bundle().display().to_string()),
        "stderr: {err}"
    );
    assert!(!f.socket().exists(), "socket left behind");
    Ok(())
}

#[test]
fn bad_command_line_is_refused() {
    let out = Command::new(SHIM).args(["--id", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bundle is required"));
}

#[test]
fn silent_client_does_not_stall_others() -> TestResult {
    let f = Fixture::new(&["sleep", "1000"]).created();
    let _silent = UnixStream::connect(f.socket())?;
    let mut half = UnixStream::connect(f.socket())?;
    half.write_all(&[0, 0, 0, 9, 1])?;
    let t = Instant::now();
    f.start();
    assert_eq!(f.state().status, pb::Status::Running as i32);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // A garbage request gets an error answer, not a crash.
    let r = f.try_call(Req::Kill(pb::KillRequest {
        signal: 999,
        all: false,
    }))?;
    assert!(r.error.contains("bad signal"), "{r:?}");
    Ok(())
}

#[test]
fn kill_all_signals_the_cgroup() -> TestResult {
    let f = Fixture::new(&["sh", "-c", "sleep 1000 & sleep 1000"]).created();
    f.start();
    std::thread::sleep(Duration::from_millis(200));
    f.call(Req::Kill(pb::KillRequest {
        signal: 9,
        all: true,
    }));
    let w = f.wait(10_000);
    assert_eq!(w.exit.unwrap().exit_code, 137);
    // libcontainer marks the container stopped after any kill; the shim's own state must
    // still accept a later State and Delete.
    assert_eq!(f.state().status, pb::Status::Stopped as i32);
    f.delete();
    Ok(())
}

#[test]
fn oom_kill_is_reported() -> TestResult {
    let script = "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done";
    let f = Fixture::with_memory_limit(&["sh", "-c", script], Some(16 << 20)).created();
    f.start();
    let w = f.wait(30_000);
    let exit = w.exit.unwrap();
    assert_eq!(exit.exit_code, 137, "{exit:?}");
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.reason, "OOMKilled");
    assert_eq!(f.exit_json()["reason"], "OOMKilled");
    Ok(())
}

#[test]
fn reopen_log_after_rotation() -> TestResult {
    let script = "echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two";
    let f = Fixture::new(&["sh", "-c", script]).created();
    f.start();
    let until = Instant::now() + Duration::from_secs(10);
    while f.log_records().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let rotated = f.dir.join("container.log.1");
    fs::rename(f.log(), &rotated)?;
    assert!(matches!(
        f.call(Req::ReopenLog(pb::ReopenLogRequest {})),
        Res::ReopenLog(_)
    ));
    fs::write(f.bundle().join("rootfs/tmp/go"), "")?;
    assert_eq!(f.wait(10_000).exit.unwrap().exit_code, 0);
    let new: Vec<_> = f.log_records().into_iter().map(|r| r.3).collect();
    assert_eq!(new, vec!["two"]);
    let old = fs::read_to_string(&rotated)?;
    assert!(old.ends_with(" stdout F one\n"), "{old}");
    Ok(())
}

#[test]
fn new_shim_replaces_stale_container() -> TestResult {
    let mut f = Fixture::new(&["sleep", "1000"]).created();
    let (old_shim, old_init) = (f.shim_pid.unwrap(), f.init_pid.unwrap());
    kill(old_shim, Signal::SIGKILL)?;
    std::thread::sleep(Duration::from_millis(100));
    // The old init waits forever in "created"; a new shim for the same id deletes it.
    let out = f.spawn();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(f.init_pid.unwrap(), old_init);
    std::thread::sleep(Duration::from_millis(100));
    let stat = fs::read_to_string(format!("/proc/{old_init}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "old init alive: {stat}"
    );
    f.start();
    assert_eq!(f.state().status, pb::Status::Running as i32);
    Ok(())
}

#[test]
fn tty_output_is_logged_as_stdout() -> TestResult {
    let script = "echo hello-tty; echo to-stderr >&2; [ -t 1 ] && echo is-a-tty";
    let f = Fixture::new(&["sh", "-c", script]).with_tty().created();
    f.start();
    assert_eq!(f.wait(10_000).exit.unwrap().exit_code, 0);
    let recs = f.log_records();
    let lines: Vec<_> = recs.iter().map(|r| (r.1.as_str(), r.3.as_str())).collect();
    assert_eq!(
        lines,
        vec![
            ("stdout", "hello-tty"),
            ("stdout", "to-stderr"),
            ("stdout", "is-a-tty")
        ]
    );
    assert!(
        !f.state_root()
            .join(format!(".console-{}.sock", f.id))
            .exists()
    );
    Ok(())
}

#[test]
fn tty_flag_must_match_the_spec() -> TestResult {
    let mut f = Fixture::new(&["true"]);
    f.tty = true;
    let out = f.spawn();
    assert!(!out.status.success());
    assert!(!f.socket().exists());
    Ok(())
}

fn set_oom_score_adj(f: &Fixture, v: i64) {
    let path = f.bundle().join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["process"]["oomScoreAdj"] = serde_json::json!(v);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

fn own_oom_score_adj(pid: &str) -> i64 {
    fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn oom_score_adj_applies_to_the_container_not_the_shim() -> TestResult {
    let mine = own_oom_score_adj("self");
    let wanted = (mine + 100).min(1000);
    let f = Fixture::new(&["sh", "-c", "cat /proc/1/oom_score_adj"]);
    set_oom_score_adj(&f, wanted);
    let f = f.created();
    let shim = f.shim_pid.unwrap().to_string();
    assert_eq!(
        own_oom_score_adj(&shim),
        mine,
        "shim kept the container's value"
    );
    f.start();
    assert_eq!(f.wait(10_000).exit.unwrap().exit_code, 0);
    assert_eq!(f.log_records()[0].3, wanted.to_string());
    Ok(())
}

#[test]
fn lowering_oom_score_adj_fails_clearly_or_works() -> TestResult {
    let mine = own_oom_score_adj("self");
    if mine <= -1000 {
        return Ok(());
    }
    let f = Fixture::new(&["true"]);
    set_oom_score_adj(&f, -1000);
    let mut f = f;
    let out = f.spawn();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("oomScoreAdj -1000"), "{err}");
    }
    Ok(())
}

#[test]
fn idle_rss_is_reported() -> TestResult {
    let f = Fixture::new(&["sleep", "1000"]).created();
    f.start();
    let pid = f.shim_pid.unwrap();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_string();
    eprintln!("idle shim {rss} (this build profile)");
    // The 2 MiB target is for release builds (measured by hand); this only catches regressions.
    let kib: u64 = rss
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(kib > 0 && kib < 8 * 1024, "{rss}");
    Ok(())
}
