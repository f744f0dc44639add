//! The node's shutdown as systemd-logind announces it: a delay inhibitor lock held while the
//! node runs, and on PrepareForShutdown(true) the graceful node shutdown, then the lock released.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use super::dbus::{Connection, DbusError, Value, system_bus_address};
use super::shutdown::ShutdownManager;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
/// Seconds between reconnections after the bus went away.
const RECONNECT: Duration = Duration::from_secs(10);

/// Watches logind from a thread of its own (the D-Bus client blocks) for as long as berthd
/// runs; `grace` is the whole shutdown grace period the lock must cover. Without a system bus
/// or logind (containers, this VM) it logs once and stops: `berthctl node shutdown` remains.
pub fn spawn(manager: Arc<ShutdownManager>, grace: Duration, rt: tokio::runtime::Handle) {
    let spawned = std::thread::Builder::new()
        .name("logind-watch".into())
        .spawn(move || {
            let address = system_bus_address();
            let mut connected_once = false;
            loop {
                match watch(&address, &manager, grace, &rt, &mut connected_once) {
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

/// One connection's life: Ok when the node shut down (nothing more to watch). `connected` turns
/// true once the bus answered, so that losing it later means reconnecting, not giving up.
fn watch(
    address: &str,
    manager: &ShutdownManager,
    grace: Duration,
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
    let mut lock = inhibit(&mut c)?;
    if let Some(max) = inhibit_delay_max(&mut c)
        && Duration::from_micros(max) < grace
    {
        tracing::warn!(
            inhibit_delay_max_secs = max / 1_000_000,
            shutdown_grace_secs = grace.as_secs(),
            "graceful node shutdown: logind waits less than the shutdown grace period; raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/ and reload systemd-logind"
        );
    }
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
