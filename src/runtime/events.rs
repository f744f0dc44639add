//! Container life-cycle events (created, started, stopped, deleted) for any number of
//! subscribers: `GetContainerEvents` streams and the agent.
//!
//! Events go out on a bounded broadcast channel: the runtime never waits for a subscriber,
//! and one that falls behind by more than the channel holds loses its place (its receiver
//! reports the lag, and the CRI stream ends it). Events found while recovering at start-up
//! (exits that happened while berthd was down, when no one could be told) are also kept for
//! [`STARTUP_REPLAY`] and handed first to every subscriber that arrives in that time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use super::container::ContainerRecord;

/// Events a subscriber may fall behind by before it is dropped.
pub const CHANNEL_CAPACITY: usize = 1024;

/// How long after start-up a new subscriber still receives the recovery events.
pub const STARTUP_REPLAY: Duration = Duration::from_secs(120);

/// What happened to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

/// One event, about a container or (as containerd reports its sandbox containers) about a pod
/// sandbox itself, whose id then stands as the container id.
#[derive(Debug, Clone)]
pub struct ContainerEvent {
    pub kind: EventKind,
    /// Unix nanoseconds.
    pub at: i64,
    /// The container's id, or the sandbox's.
    pub id: String,
    pub sandbox_id: String,
    /// Every container of the sandbox at the time of the event (a deleted one no more).
    pub pod: Vec<Arc<ContainerRecord>>,
}

/// The event channel.
pub struct EventBus {
    tx: broadcast::Sender<Arc<ContainerEvent>>,
    recovery: Mutex<Vec<Arc<ContainerEvent>>>,
    started: Instant,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// A bus with no subscriber.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(CHANNEL_CAPACITY).0,
            recovery: Mutex::new(Vec::new()),
            started: Instant::now(),
        }
    }

    /// Sends `event` to every subscriber; never waits.
    pub fn emit(&self, event: ContainerEvent) {
        tracing::debug!(id = %event.id, kind = ?event.kind, "container event");
        // No subscriber is not an error.
        let _ = self.tx.send(Arc::new(event));
    }

    /// Sends an event found while recovering at start-up, and keeps it for late subscribers.
    pub fn emit_recovered(&self, event: ContainerEvent) {
        let event = Arc::new(event);
        // Kept and sent under one lock, so a subscriber gets it exactly once (see subscribe).
        let mut kept = self.recovery.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(event.clone());
        let _ = self.tx.send(event);
    }

    /// A new subscription: the recovery events (during the replay window), then the live
    /// receiver. Each event is in exactly one of the two.
    pub fn subscribe(
        &self,
    ) -> (
        Vec<Arc<ContainerEvent>>,
        broadcast::Receiver<Arc<ContainerEvent>>,
    ) {
        let mut kept = self.recovery.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.tx.subscribe();
        if self.started.elapsed() < STARTUP_REPLAY {
            (kept.clone(), rx)
        } else {
            *kept = Vec::new();
            (Vec::new(), rx)
        }
    }

    /// Subscribers right now.
    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }
}
