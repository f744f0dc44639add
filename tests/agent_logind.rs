//! Graceful node shutdown driven by systemd-logind's D-Bus interface: berthd holds a delay
//! inhibitor lock, and on PrepareForShutdown(true) ends its pods and then releases the lock.
//! The bus is a real dbus-daemon; logind is a stand-in (tests/fixtures/logind_standin.py, with
//! Debian's python3-dbus, run by Debian's /usr/bin/python3) because this machine does not run systemd.

mod agent_support;
mod cni_support;
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_support::*;
use common::TempDir;

/// A private bus with the logind stand-in on it; both killed on drop.
struct Bus {
    dir: TempDir,
    daemon: Child,
    standin: Option<Child>,
}

impl Bus {
    /// The bus and the stand-in; `reload` is "apply" (a SIGHUP re-reads the drop-ins, as
    /// logind does) or "ignore" (logind keeps its 5 s).
    fn start(reload: &str) -> Self {
        let dir = TempDir::new("dbus");
        // Debian's session bus configuration (anyone may own names and call) on our socket.
        let daemon = Command::new("dbus-daemon")
            .arg("--session")
            .arg(format!("--address=unix:path={}/bus", dir.path().display()))
            .arg("--nofork")
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("dbus-daemon (Debian's dbus-daemon package)");
        let mut bus = Self {
            dir,
            daemon,
            standin: None,
        };
        let socket = bus.dir.path().join("bus");
        wait_for("the bus socket", || socket.exists());
        let standin = Command::new("/usr/bin/python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/logind_standin.py"
            ))
            .arg(bus.address())
            .arg(bus.log_path())
            .arg(bus.conf_dir())
            .arg(reload)
            .spawn()
            .expect("logind stand-in");
        bus.standin = Some(standin);
        wait_for("the logind stand-in", || bus.log().contains("ready"));
        bus
    }

    fn address(&self) -> String {
        format!("unix:path={}/bus", self.dir.path().display())
    }

    /// logind's drop-in directory (where berthd raises InhibitDelayMaxSec).
    fn conf_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("logind.conf.d")
    }

    /// The agent's configuration: graceful shutdown over 6 s (more than logind's 5 s), 2 s of
    /// them for critical pods, drop-ins into this bus's directory.
    fn agent_config(&self) -> String {
        format!(
            "shutdown_grace_period_secs = 6.0\nshutdown_grace_period_critical_pods_secs = 2.0\nlogind_config_dir = {:?}\n",
            self.conf_dir().display().to_string()
        )
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("logind.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Makes the stand-in announce the node's shutdown.
    fn prepare_for_shutdown(&self) {
        if let Some(s) = &self.standin {
            let ok = Command::new("kill")
                .arg("-USR1")
                .arg(s.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "signalling the logind stand-in");
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        if let Some(mut s) = self.standin.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// The bus and stand-in (`reload` as in `Bus::start`), a tokio runtime and an agent on that
/// bus, once berthd holds its delay inhibitor lock. Call it first thing in a test: it sets the
/// environment berthd inherits.
fn start(reload: &str) -> (Bus, tokio::runtime::Runtime, Agent) {
    let bus = Bus::start(reload);
    // SAFETY: set before any other thread of this test process exists (each test calls this
    // first, in a plain #[test]; the tokio runtime is made below, and nextest runs each test in
    // its own process); berthd inherits it.
    unsafe { std::env::set_var("DBUS_SYSTEM_BUS_ADDRESS", bus.address()) };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let a = Agent::start_with_config(&[], &bus.agent_config());
    wait_for("berthd's delay inhibitor lock", || {
        bus.log().contains("inhibit shutdown berth delay")
    });
    (bus, rt, a)
}

/// The Unix time (seconds) on the stand-in's log line starting with `event` (`prepare True`,
/// `released`).
fn logged_at(log: &str, event: &str) -> f64 {
    log.lines()
        .find(|l| l.starts_with(event))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{event} with a time in {log}"))
}

/// When container `main` of `pod` finished (Unix seconds; the API's whole seconds).
fn finished_at(pod: &serde_json::Value) -> i64 {
    let at = &container(pod, "main")["state"]["terminated"]["finishedAt"];
    at.as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or_else(|| panic!("finishedAt in {pod}"))
}

#[test]
fn prepare_for_shutdown_ends_pods_then_releases_the_inhibitor_lock() {
    let (bus, rt, a) = start("apply");
    // logind's 5 s were shorter than the 6 s grace period: berthd raised them with a drop-in
    // and a reload before taking the lock.
    let drop_in =
        std::fs::read_to_string(bus.conf_dir().join(berth::agent::shutdown::logind::DROP_IN))
            .expect("berthd's logind drop-in");
    assert!(
        drop_in.contains("[Login]\nInhibitDelayMaxSec=6\n"),
        "{drop_in}"
    );
    let log = bus.log();
    let reloaded = log
        .find("reloaded 6000000")
        .expect("logind reloaded with 6 s");
    assert!(log.contains("kill systemd-logind.service main 1"), "{log}");
    assert!(
        reloaded < log.find("inhibit shutdown").expect("inhibit"),
        "raised before the lock: {log}"
    );
    assert!(
        !a.daemon.log().contains("logind waits less than"),
        "no warning once raised"
    );
    start_regular_and_critical_pods(&a, "true");
    assert!(!bus.log().contains("released"), "{}", bus.log());

    bus.prepare_for_shutdown();
    // The regular pod ends first while the lock is still held (its Failed status is published
    // before the critical group starts, and that group lasts its 2 s share: the critical
    // container ignores SIGTERM).
    a.wait_pod("default", "regular", "regular ended", |p| {
        p["status"]["phase"] == "Failed"
    });
    assert!(!bus.log().contains("released"), "{}", bus.log());
    wait_for("the lock released", || bus.log().contains("released"));
    // By then every pod has ended, the critical one last.
    let mut pods = Vec::new();
    for name in ["regular", "critical"] {
        let p = a.pod("default", name).expect("pod");
        assert_eq!(p["status"]["phase"], "Failed", "{name}: {p}");
        assert_eq!(p["status"]["reason"], "Terminated", "{name}: {p}");
        pods.push(p);
    }
    let (regular, critical) = (&pods[0], &pods[1]);
    let exit =
        |p: &serde_json::Value| container(p, "main")["state"]["terminated"]["exitCode"].as_i64();
    assert_eq!(exit(regular), Some(0), "stopped on SIGTERM: {regular}");
    assert_eq!(
        exit(critical),
        Some(137),
        "killed at the end of its share: {critical}"
    );
    let log = bus.log();
    let (prepared, released) = (logged_at(&log, "prepare True"), logged_at(&log, "released"));
    let (regular_end, critical_end) = (finished_at(regular), finished_at(critical));
    assert!(
        prepared.floor() as i64 <= regular_end,
        "the regular pod ended after the announcement: {prepared} {regular}"
    );
    assert!(
        regular_end <= critical_end,
        "the critical pod ended last: {regular} {critical}"
    );
    assert!(
        critical_end as f64 <= released,
        "the lock released after the critical pod ended: {released} {critical}"
    );
    assert!(
        a.daemon
            .log()
            .contains("systemd-logind: the node is shutting down")
    );
    rt.block_on(a.finish());
}

#[test]
fn a_logind_that_keeps_a_short_inhibit_delay_is_warned_about() {
    let (bus, rt, a) = start("ignore");
    assert!(bus.log().contains("kill systemd-logind.service main 1"));
    wait_for("the warning", || {
        a.daemon
            .log()
            .contains("logind waits less than the shutdown grace period")
    });
    rt.block_on(a.finish());
}
