//! Follows the CNI conf dir: a 1 s poll of its file names, sizes and mtimes (no inotify
//! dependency), logging each NetworkReady change. Status also re-reads on demand, so a reply
//! never lags the directory.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::manager::NetManager;

/// How often the conf dir is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the watcher; it ends when the manager is dropped.
pub fn spawn(manager: &Arc<NetManager>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<NetManager> = Arc::downgrade(manager);
    tokio::spawn(async move {
        let mut last: Option<bool> = None;
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(manager) = weak.upgrade() else {
                return;
            };
            let status = manager.status();
            if last != Some(status.ready) {
                if status.ready {
                    tracing::info!("NetworkReady: true");
                } else {
                    tracing::warn!(reason = %status.reason, message = %status.message, "NetworkReady: false");
                }
                last = Some(status.ready);
            }
        }
    })
}
