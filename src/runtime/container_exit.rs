//! Container exits as events: a watcher task per created or running container waits on pidfds
//! of its init process and of its shim, and the moment either ends the exit is recorded and the
//! STOPPED event sent. Also the recovery at start-up of containers whose init or shim ended
//! while berthd was down.
//!
//! Once its exit is recorded, a container is retired in the background, as containerd deletes
//! a task when it exits: its shim deletes it (whatever is left in its cgroup is killed, the
//! cgroup removed) and exits, and its rootfs is unmounted. RemoveContainer then only deletes
//! files and the record.
//!
//! The exit code comes from the shim (which reaps the init and writes the exit file): asked
//! with a deadline when the init ends, read from the exit file when the shim is gone. A shim
//! that died under a running container leaves it with no one to control it: its processes are
//! killed and it is reported exited 255, reason Unknown, with a message saying so.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::task::AbortHandle;
use tracing::{Instrument, debug_span};

use super::container::{ContainerManager, ContainerRecord, ContainerState, ExitInfo};
use super::events::EventKind;
use super::process::{HostProcess, Pidfd};
use super::shim_client::{ShimClient, ShimError, api};

/// How long the shim may take to report an exit it is reaping.
const EXIT_REPORT: Duration = Duration::from_secs(3);

/// Per container: its exit watcher, and the lock that orders its state changes (a start and
/// an exit), so that its events go out in order.
#[derive(Default)]
pub(super) struct Live {
    transition: Arc<tokio::sync::Mutex<()>>,
    watcher: Option<AbortHandle>,
    /// Notified when the container has been retired.
    retired: Arc<tokio::sync::Notify>,
}

/// How long a StopContainer waits for its container's retirement.
const RETIRE_WAIT: Duration = Duration::from_secs(10);

/// Which process ended first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Init,
    Shim,
}

/// What can be waited for about one process.
enum Watch {
    /// Not recorded (a record of an older berthd): never ends as far as the watcher knows.
    Unknown,
    /// Already gone.
    Gone,
    /// Alive: its pidfd.
    Alive(Pidfd),
}

impl Watch {
    fn of(process: Option<HostProcess>) -> Self {
        match process {
            None => Watch::Unknown,
            Some(p) => p.pidfd().map_or(Watch::Gone, Watch::Alive),
        }
    }

    fn is_gone(&self) -> bool {
        matches!(self, Watch::Gone)
    }

    fn ended(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match self {
            Watch::Unknown => Box::pin(std::future::pending()),
            Watch::Gone => Box::pin(std::future::ready(())),
            Watch::Alive(fd) => Box::pin(async move {
                if let Err(e) = fd.exited().await {
                    // Cannot be waited for: as if unknown.
                    tracing::warn!(error = %e, "waiting on a pidfd");
                    std::future::pending::<()>().await;
                }
            }),
        }
    }
}

/// The exit file the shim writes.
#[derive(Debug, Deserialize)]
struct ExitFile {
    exit_code: i32,
    #[serde(default)]
    exited_at: String,
    #[serde(default)]
    reason: String,
}

/// An exit as the shim reports it.
pub(super) fn exit_info(e: api::ExitStatus) -> ExitInfo {
    ExitInfo {
        exit_code: e.exit_code,
        finished_at: parse_rfc3339_utc(&e.exited_at).unwrap_or_else(crate::util::unix_nanos_now),
        reason: e.reason,
        message: String::new(),
    }
}

/// An exit from a Wait answer that should carry one.
pub(super) fn from_status(e: Option<api::ExitStatus>) -> ExitInfo {
    e.map(exit_info)
        .unwrap_or_else(|| unknown_exit("its shim reported the exit without a status".into()))
}

/// Exit 255, reason Unknown, with `message`.
fn unknown_exit(message: String) -> ExitInfo {
    ExitInfo {
        exit_code: 255,
        finished_at: crate::util::unix_nanos_now(),
        reason: "Unknown".into(),
        message,
    }
}

impl ContainerManager {
    /// The lock that orders the state changes of container `id`.
    pub(super) fn transition_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.live()
            .entry(id.to_string())
            .or_default()
            .transition
            .clone()
    }

    /// Watches a created or running container for the end of its init or its shim.
    pub(super) fn watch(&self, rec: &ContainerRecord) {
        let (shim, init) = (Watch::of(rec.shim_process), Watch::of(rec.init_process));
        self.spawn_watcher(&rec.id, shim, init, false);
    }

    fn spawn_watcher(&self, id: &str, shim: Watch, init: Watch, recovered: bool) {
        let me = self.weak();
        let owned = id.to_string();
        let task = tokio::spawn(async move {
            let ended = tokio::select! {
                biased;
                () = init.ended() => Ended::Init,
                () = shim.ended() => Ended::Shim,
            };
            if let Some(me) = me.upgrade() {
                me.ended(&owned, ended, recovered).await;
            }
        });
        if let Some(old) = self
            .live()
            .entry(id.to_string())
            .or_default()
            .watcher
            .replace(task.abort_handle())
        {
            old.abort();
        }
    }

    /// Stops watching container `id` (it is being removed) and forgets its lock.
    pub(super) fn unwatch(&self, id: &str) {
        if let Some(live) = self.live().remove(id)
            && let Some(w) = live.watcher
        {
            w.abort();
        }
    }

    /// At start-up: watches a created or running container again, or records the exit of one
    /// whose init or shim ended while berthd was down.
    pub(super) fn recover(&self, rec: &ContainerRecord) {
        let (shim, init) = (Watch::of(rec.shim_process), Watch::of(rec.init_process));
        if rec.init_process.is_none() {
            // A record of an older berthd: the shim names the init.
            self.adopt_from_shim(rec);
            return;
        }
        if init.is_gone() || shim.is_gone() {
            tracing::info!(container = %rec.id, "container ended while berthd was down");
        }
        let ended = init.is_gone() || shim.is_gone();
        if !shim.is_gone() {
            crate::metrics::prometheus::runtime()
                .shims_reconnected
                .inc();
        }
        self.spawn_watcher(&rec.id, shim, init, ended);
    }

    /// Learns the init of a container recorded without one from its shim, then watches it.
    fn adopt_from_shim(&self, rec: &ContainerRecord) {
        let me = self.weak();
        let rec = rec.clone();
        tokio::spawn(async move {
            let Some(me) = me.upgrade() else { return };
            match ShimClient::new(&rec.socket).state(EXIT_REPORT).await {
                Ok(s) if s.status == api::Status::Stopped as i32 => {
                    me.record_exit(&rec.id, from_status(s.exit), true).await;
                }
                Ok(s) => {
                    let init = i32::try_from(s.pid).ok().and_then(HostProcess::of);
                    let adopted = me.table().update(&rec.id, |r| {
                        r.init_process = init;
                        true
                    });
                    if let Ok(Some(adopted)) = adopted {
                        me.recover(&adopted);
                    }
                }
                Err(ShimError::Unavailable { .. }) => {
                    let exit = me.exit_from_file(&rec);
                    me.record_exit(&rec.id, exit, true).await;
                }
                Err(e) => tracing::warn!(container = %rec.id, error = %e,
                    "the shim did not answer at start-up: its container keeps its last known state"),
            }
        });
    }

    /// The init or the shim of container `id` ended: finds out how and records the exit.
    async fn ended(&self, id: &str, ended: Ended, recovered: bool) {
        let Some(rec) = self.table().get(id) else {
            return;
        };
        if !rec.is_active() {
            return;
        }
        let exit = match ended {
            Ended::Init => self.collect_exit(&rec).await,
            Ended::Shim => {
                let init_runs = rec.init_process.is_some_and(|p| p.is_running());
                match self.read_exit_file(&rec) {
                    Some(exit) if !init_runs => exit,
                    _ => {
                        // No one controls the container any more: end it, say what happened.
                        tracing::warn!(container = %rec.id, "the shim of the container exited: killing the container's processes");
                        crate::metrics::prometheus::runtime().shims_died.inc();
                        self.kill_cgroup(&rec);
                        unknown_exit(format!(
                            "the shim of container {} exited while the container ran; its processes were killed",
                            rec.id
                        ))
                    }
                }
            }
        };
        self.record_exit(id, exit, recovered).await;
    }

    /// The exit of a container whose init ended: from the shim (it reaps the init), else the
    /// exit file, else Unknown.
    async fn collect_exit(&self, rec: &ContainerRecord) -> ExitInfo {
        if let Some(exit) = self.read_exit_file(rec) {
            return exit;
        }
        let wait = api::request::Request::Wait(api::WaitRequest {
            timeout_ms: EXIT_REPORT.as_millis() as u64,
        });
        match ShimClient::new(&rec.socket)
            .call(wait, EXIT_REPORT + Duration::from_secs(1))
            .await
        {
            Ok(api::response::Result::Wait(w)) if w.exited => from_status(w.exit),
            answer => self.read_exit_file(rec).unwrap_or_else(|| {
                let why = match answer {
                    Err(e) => e.to_string(),
                    Ok(_) => "no exit reported".into(),
                };
                unknown_exit(format!(
                    "the process of container {} exited and its shim did not report the status ({why})",
                    rec.id
                ))
            }),
        }
    }

    /// Records that container `id` exited (if it is still created or running) and sends the
    /// STOPPED event; ordered after a start in progress.
    pub(super) async fn record_exit(&self, id: &str, exit: ExitInfo, recovered: bool) {
        let transition = self.transition_lock(id);
        let _turn = transition.lock().await;
        let code = exit.exit_code;
        let updated = self.table().update(id, |r| {
            let active = r.is_active();
            if active {
                r.state = ContainerState::Exited;
                r.exit = Some(exit);
            }
            active
        });
        match updated {
            Ok(Some(rec)) => {
                tracing::info!(container = %id, exit_code = code, "container exited");
                if rec.exit.as_ref().is_some_and(|e| e.reason == "OOMKilled") {
                    crate::metrics::prometheus::runtime().oom_kills.inc();
                }
                self.emit(EventKind::Stopped, rec.clone(), recovered);
                self.spawn_retire(rec);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(container = %id, error = %e, "saving exit"),
        }
    }

    /// Retires an exited container in the background (see the module doc).
    fn spawn_retire(&self, rec: Arc<ContainerRecord>) {
        let me = self.weak();
        tokio::spawn(async move {
            let Some(me) = me.upgrade() else { return };
            me.release_shim(&rec)
                .instrument(debug_span!("shim_delete", container = %rec.id))
                .await;
            let rootfs = rec.bundle.join("rootfs");
            let span = debug_span!("unmount_rootfs", container = %rec.id);
            let unmounted = tokio::task::spawn_blocking(move || {
                let _entered = span.enter();
                super::container_create::unmount_rootfs(&rootfs)
                    .inspect_err(|e| {
                        tracing::debug!(rootfs = %rootfs.display(), error = %e, "unmounting an exited container's rootfs");
                    })
                    .is_ok()
            })
            .await
            .unwrap_or(false);
            if !unmounted {
                tracing::warn!(container = %rec.id, "the exited container's rootfs stays mounted until it is removed");
            }
            // Only while it is still there and exited (a removal may have come first).
            let marked = me.table().update(&rec.id, |r| {
                let exited = r.state == ContainerState::Exited && !r.retired;
                r.retired |= exited;
                exited
            });
            if let Err(e) = marked {
                tracing::warn!(container = %rec.id, error = %e, "saving a retired container");
            }
            let notify = me.live().get(&rec.id).map(|l| l.retired.clone());
            if let Some(n) = notify {
                n.notify_waiters();
            }
        });
    }

    /// Waits (at most 10 s) until container `id` is retired or gone: a StopContainer returns
    /// once nothing of the container runs and its cgroup is gone, as containerd's does.
    pub(super) async fn wait_retired(&self, id: &str) {
        let notify = self
            .live()
            .entry(id.to_string())
            .or_default()
            .retired
            .clone();
        let waited = tokio::time::timeout(RETIRE_WAIT, async {
            loop {
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                match self.table().get(id) {
                    Some(r) if !r.retired => {}
                    _ => return,
                }
                notified.await;
            }
        })
        .await;
        if waited.is_err() {
            tracing::warn!(container = %id, "not retired within 10 s of its stop");
        }
    }

    /// The exit the shim wrote, if it did.
    fn read_exit_file(&self, rec: &ContainerRecord) -> Option<ExitInfo> {
        let f = std::fs::read(&rec.exit_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<ExitFile>(&b).ok())?;
        Some(ExitInfo {
            exit_code: f.exit_code,
            finished_at: parse_rfc3339_utc(&f.exited_at)
                .unwrap_or_else(crate::util::unix_nanos_now),
            reason: f.reason,
            message: String::new(),
        })
    }

    /// The exit the shim wrote, or Unknown.
    pub(super) fn exit_from_file(&self, rec: &ContainerRecord) -> ExitInfo {
        self.read_exit_file(rec).unwrap_or_else(|| {
            unknown_exit(format!(
                "container {}: its shim is gone and left no exit status",
                rec.id
            ))
        })
    }
}

/// Parses RFC 3339 `YYYY-MM-DDTHH:MM:SS[.frac]Z` into Unix nanoseconds (UTC only).
fn parse_rfc3339_utc(s: &str) -> Option<i64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let nanos: i64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    // Days from civil (proleptic Gregorian), after Howard Hinnant's well-known method.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000) + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_to_unix_nanos() {
        assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_utc("1970-01-01T00:00:01.5Z"),
            Some(1_500_000_000)
        );
        assert_eq!(
            parse_rfc3339_utc("2026-11-29T12:00:00.000000001Z"),
            Some(1_795_953_600_000_000_001)
        );
        assert_eq!(parse_rfc3339_utc("garbage"), None);
    }

    #[tokio::test]
    async fn a_gone_process_ends_at_once_and_an_unknown_one_never() {
        let gone = Watch::of(Some(HostProcess {
            pid: std::process::id() as i32,
            start_time: u64::MAX,
        }));
        assert!(gone.is_gone());
        tokio::time::timeout(Duration::from_secs(1), gone.ended())
            .await
            .expect("a gone process has ended");
        let unknown = Watch::of(None);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), unknown.ended())
                .await
                .is_err()
        );
    }
}
