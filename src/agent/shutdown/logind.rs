//! The node's shutdown as systemd-logind announces it: a delay inhibitor lock held while the
//! node runs, and on PrepareForShutdown(true) the graceful node shutdown, then the lock released.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{ShutdownError, ShutdownManager};
use crate::dbus::{Connection, DbusError, Value, system_bus_address};

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
/// Seconds between reconnections after the bus went away.
const RECONNECT: Duration = Duration::from_secs(10);
/// The drop-in the agent writes into logind's configuration directory.
pub const DROP_IN: &str = "99-berth-inhibit-delay.conf";
const SIGHUP: i32 = 1;

/// Watches logind from a thread of its own (the D-Bus client blocks) for as long as berthd
/// runs; `grace` is the whole shutdown grace period the lock must cover, `conf_dir` logind's
/// drop-in directory. Without a system bus or logind (containers, this VM) it logs once and
/// stops: `berthctl node shutdown` remains.
pub fn spawn(
    manager: Arc<ShutdownManager>,
    grace: Duration,
    conf_dir: PathBuf,
    rt: tokio::runtime::Handle,
) {
    let spawned = std::thread::Builder::new()
        .name("logind-watch".into())
        .spawn(move || {
            let address = system_bus_address();
            let mut connected_once = false;
            loop {
                let watched = watch(&address, &manager, grace, &conf_dir, &rt, &mut connected_once);
                match watched {
                    Ok(()) => return,
                    Err(e) if !connected_once => {
                        tracing::info!(bus = %address, error = %e, "graceful node shutdown: systemd-logind is not reachable; only `berthctl node shutdown` starts it");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(bus = %address, error = %e, "graceful node shutdown: lost systemd-logind; reconnecting");
                    }
                }
                std::thread::sleep(RECONNECT);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "graceful node shutdown: cannot start the logind watcher");
    }
}

/// Takes a delay inhibitor lock: logind waits (up to its InhibitDelayMaxSec) for it to be
/// released before it shuts the machine down.
fn inhibit(c: &mut Connection) -> Result<Option<OwnedFd>, DbusError> {
    let mut reply = c.call(
        LOGIND,
        LOGIND_PATH,
        MANAGER,
        "Inhibit",
        &[
            Value::Str("shutdown".into()),
            Value::Str("berth".into()),
            Value::Str("Berth node agent is ending pods for the node shutdown".into()),
            Value::Str("delay".into()),
        ],
    )?;
    Ok(reply.fds.pop())
}

/// logind's longest delay for a delay lock, in microseconds.
fn inhibit_delay_max(c: &mut Connection) -> Option<u64> {
    let reply = c
        .call(
            LOGIND,
            LOGIND_PATH,
            "org.freedesktop.DBus.Properties",
            "Get",
            &[
                Value::Str(MANAGER.into()),
                Value::Str("InhibitDelayMaxUSec".into()),
            ],
        )
        .ok()?;
    match reply.body.first() {
        Some(Value::Variant(v)) => match **v {
            Value::U64(us) => Some(us),
            _ => None,
        },
        _ => None,
    }
}

/// Makes logind wait the whole grace period for the lock, as the kubelet does: when its
/// `InhibitDelayMaxSec` is shorter, writes a drop-in raising it to the grace period, has
/// systemd send logind SIGHUP (it re-reads its configuration then) and reads the value back;
/// a value still short is a warning (logind will cut the pods' shutdown short), not an error.
fn ensure_inhibit_delay(c: &mut Connection, grace: Duration, conf_dir: &Path) {
    let Some(before) = inhibit_delay_max(c) else {
        return;
    };
    if Duration::from_micros(before) >= grace {
        return;
    }
    let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    let raised = write_drop_in(conf_dir, secs)
        .map_err(|e| format!("writing {}: {e}", conf_dir.join(DROP_IN).display()))
        .and_then(|()| reload_logind(c).map_err(|e| format!("reloading systemd-logind: {e}")));
    if let Err(e) = raised {
        // Nothing changed, so polling for the new value would only repeat this warning.
        tracing::warn!(
            error = %e,
            inhibit_delay_max_secs = before / 1_000_000,
            shutdown_grace_secs = secs,
            "graceful node shutdown: cannot raise logind's InhibitDelayMaxSec, so pods may be cut short; set InhibitDelayMaxSec in logind's configuration"
        );
        return;
    }
    // logind re-reads its configuration on the signal, a moment after KillUnit returns.
    let mut now = before;
    for _ in 0..20 {
        match inhibit_delay_max(c) {
            Some(us) => now = us,
            None => break,
        }
        if Duration::from_micros(now) >= grace {
            tracing::info!(
                before_secs = before / 1_000_000,
                now_secs = now / 1_000_000,
                drop_in = %conf_dir.join(DROP_IN).display(),
                "graceful node shutdown: raised logind's InhibitDelayMaxSec to the shutdown grace period"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::warn!(
        inhibit_delay_max_secs = now / 1_000_000,
        shutdown_grace_secs = secs,
        "graceful node shutdown: logind waits less than the shutdown grace period, so pods may be cut short; set InhibitDelayMaxSec in logind's configuration"
    );
}

/// Writes the drop-in (`[Login] InhibitDelayMaxSec=secs`), replacing it atomically.
fn write_drop_in(dir: &Path, secs: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let text = format!(
        "# Written by berthd: logind waits this long for pods to end when the node shuts down\n# (the agent's shutdown grace period).\n[Login]\nInhibitDelayMaxSec={secs}\n"
    );
    let tmp = dir.join(format!(".{DROP_IN}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(DROP_IN))
}

/// Asks systemd to send systemd-logind SIGHUP (its configuration reload).
fn reload_logind(c: &mut Connection) -> Result<(), DbusError> {
    c.call(
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "KillUnit",
        &[
            Value::Str("systemd-logind.service".into()),
            Value::Str("main".into()),
            Value::I32(SIGHUP),
        ],
    )?;
    Ok(())
}

/// One connection's life: Ok when the node shut down (nothing more to watch). `connected` turns
/// true once the bus answered, so that losing it later means reconnecting, not giving up.
fn watch(
    address: &str,
    manager: &ShutdownManager,
    grace: Duration,
    conf_dir: &Path,
    rt: &tokio::runtime::Handle,
    connected: &mut bool,
) -> Result<(), DbusError> {
    let mut c = Connection::open(address)?;
    *connected = true;
    c.call(
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "AddMatch",
        &[Value::Str(format!(
            "type='signal',sender='{LOGIND}',path='{LOGIND_PATH}',interface='{MANAGER}',member='PrepareForShutdown'"
        ))],
    )?;
    ensure_inhibit_delay(&mut c, grace, conf_dir);
    let mut lock = inhibit(&mut c)?;
    tracing::info!(
        locked = lock.is_some(),
        "graceful node shutdown: watching systemd-logind"
    );
    loop {
        let Some(signal) = c.next_signal(None)? else {
            continue;
        };
        if signal.member.as_deref() != Some("PrepareForShutdown") {
            continue;
        }
        match signal.body.first() {
            Some(Value::Bool(true)) => {
                tracing::info!("systemd-logind: the node is shutting down");
                match rt.block_on(manager.shutdown()) {
                    Ok(report) => tracing::info!(
                        elapsed_ms = report.elapsed_ms,
                        "graceful node shutdown done; releasing the inhibitor lock"
                    ),
                    Err(ShutdownError::InProgress) => {
                        // Started by `berthctl node shutdown`: its pods are still ending, so the
                        // lock is held until that shutdown is done.
                        tracing::info!(
                            "graceful node shutdown already running; waiting for it before releasing the inhibitor lock"
                        );
                        rt.block_on(manager.wait_finished());
                        tracing::info!("graceful node shutdown done; releasing the inhibitor lock");
                    }
                    Err(e) => tracing::warn!(error = %e, "graceful node shutdown"),
                }
                drop(lock.take());
                return Ok(());
            }
            Some(Value::Bool(false)) if lock.is_none() => {
                // The shutdown was called off: hold the lock again for the next one.
                lock = inhibit(&mut c)?;
            }
            _ => {}
        }
    }
}
