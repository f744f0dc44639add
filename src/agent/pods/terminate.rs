//! Requests to end pods before their manifest does (eviction, node shutdown), and the
//! admission verdicts of the node's pressure conditions.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Why and how a pod is to end.
#[derive(Debug, Clone, PartialEq)]
pub struct Termination {
    /// The pod status reason (`Evicted`, `Terminated`).
    pub reason: String,
    /// The pod status message.
    pub message: String,
    /// Grace period in seconds for its containers (None: the pod's own).
    pub grace_secs: Option<i64>,
}

#[derive(Default)]
struct Entry {
    termination: Option<Termination>,
    done: bool,
}

/// Pending and finished terminations by pod UID; workers act on them at their next sync.
#[derive(Default)]
pub struct Terminations {
    by_uid: Mutex<HashMap<String, Entry>>,
    /// The node is shutting down: no new pod is admitted.
    shutting_down: AtomicBool,
    /// Wakes workers (a new request) and waiters (a finished one).
    changed: Notify,
}

impl Terminations {
    /// Asks the worker of pod `uid` to end it (a second request for the same pod is ignored).
    pub fn request(&self, uid: &str, t: Termination) {
        if let Ok(mut m) = self.by_uid.lock() {
            let e = m.entry(uid.to_string()).or_default();
            if e.termination.is_none() {
                e.termination = Some(t);
            }
        }
        self.changed.notify_waiters();
    }

    /// The termination asked for pod `uid`, if any.
    pub fn requested(&self, uid: &str) -> Option<Termination> {
        self.by_uid
            .lock()
            .ok()
            .and_then(|m| m.get(uid).and_then(|e| e.termination.clone()))
    }

    /// Whether pod `uid` was asked to end (and has not been forgotten since).
    pub fn is_requested(&self, uid: &str) -> bool {
        self.requested(uid).is_some()
    }

    /// The worker ended pod `uid` as asked.
    pub fn mark_done(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock()
            && let Some(e) = m.get_mut(uid)
        {
            e.done = true;
        }
        self.changed.notify_waiters();
    }

    /// Whether pod `uid`'s termination finished.
    pub fn is_done(&self, uid: &str) -> bool {
        self.by_uid
            .lock()
            .ok()
            .is_some_and(|m| m.get(uid).is_some_and(|e| e.done))
    }

    /// Forgets pod `uid` (its worker is gone: a new manifest version starts afresh).
    pub fn forget(&self, uid: &str) {
        if let Ok(mut m) = self.by_uid.lock() {
            m.remove(uid);
        }
    }

    /// Waits until every pod of `uids` ended or `timeout` passed; returns those not ended.
    pub async fn wait_done(&self, uids: &[String], timeout: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            let left: Vec<String> = uids.iter().filter(|u| !self.is_done(u)).cloned().collect();
            if left.is_empty() || tokio::time::Instant::now() >= deadline {
                return left;
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// Marks the node as shutting down (new pods are refused from now on).
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether the node is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Resolves when a request or a completion happens (workers select on it).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// The node's pressure conditions as admission sees them (set by the eviction manager).
#[derive(Default)]
pub struct Pressure {
    /// MemoryPressure: BestEffort pods are not admitted.
    pub memory: AtomicBool,
    /// DiskPressure: no pod is admitted (critical ones excepted).
    pub disk: AtomicBool,
    /// PIDPressure: no pod is admitted (critical ones excepted).
    pub pid: AtomicBool,
}

impl Pressure {
    /// Why a new pod of QoS class `qos` would be refused now (the kubelet's eviction admission):
    /// None when it may start. `critical` pods are always admitted.
    pub fn refusal(&self, qos: &str, critical: bool) -> Option<String> {
        if critical {
            return None;
        }
        let mut conditions = Vec::new();
        if self.memory.load(Ordering::Relaxed) {
            conditions.push("MemoryPressure");
        }
        if self.disk.load(Ordering::Relaxed) {
            conditions.push("DiskPressure");
        }
        if self.pid.load(Ordering::Relaxed) {
            conditions.push("PIDPressure");
        }
        let only_memory = conditions == ["MemoryPressure"];
        if conditions.is_empty() || (only_memory && qos != "BestEffort") {
            return None;
        }
        Some(format!(
            "The node had condition: [{}]. ",
            conditions.join(", ")
        ))
    }
}

/// The priority from which pods are critical (the `system-cluster-critical` class's).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The `system-node-critical` class's priority.
const SYSTEM_NODE_CRITICAL_PRIORITY: i32 = 2_000_001_000;

/// Whether a pod is critical: the system-node-critical / system-cluster-critical class or a
/// priority at least theirs. The kubelet's `IsCriticalPod` also counts every static pod, which
/// here would be every pod (all come from files) and leave nothing to evict.
pub fn is_critical(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let spec = pod.spec.as_ref();
    let class = spec.and_then(|s| s.priority_class_name.as_deref());
    matches!(
        class,
        Some("system-node-critical") | Some("system-cluster-critical")
    ) || spec
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// A pod's priority (from `spec.priority`, or its system priority class; 0 otherwise).
pub fn priority(pod: &k8s_openapi::api::core::v1::Pod) -> i32 {
    let spec = pod.spec.as_ref();
    if let Some(p) = spec.and_then(|s| s.priority) {
        return p;
    }
    match spec.and_then(|s| s.priority_class_name.as_deref()) {
        Some("system-node-critical") => SYSTEM_NODE_CRITICAL_PRIORITY,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_under_pressure() {
        let p = Pressure::default();
        assert_eq!(p.refusal("BestEffort", false), None);
        p.memory.store(true, Ordering::Relaxed);
        assert!(p.refusal("BestEffort", false).is_some());
        assert_eq!(p.refusal("Burstable", false), None);
        assert_eq!(p.refusal("BestEffort", true), None);
        p.disk.store(true, Ordering::Relaxed);
        assert!(
            p.refusal("Guaranteed", false)
                .is_some_and(|m| m.contains("DiskPressure"))
        );
        // PIDPressure alone refuses every QoS class (critical pods excepted).
        let p = Pressure::default();
        p.pid.store(true, Ordering::Relaxed);
        for qos in ["Guaranteed", "Burstable", "BestEffort"] {
            assert_eq!(
                p.refusal(qos, false).as_deref(),
                Some("The node had condition: [PIDPressure]. "),
                "{qos}"
            );
        }
        assert_eq!(p.refusal("Guaranteed", true), None);
    }

    #[tokio::test]
    async fn requests_are_kept_once_and_waited_for() {
        let t = Terminations::default();
        let first = Termination {
            reason: "Evicted".into(),
            message: "a".into(),
            grace_secs: Some(0),
        };
        t.request("u1", first.clone());
        t.request(
            "u1",
            Termination {
                reason: "Terminated".into(),
                message: "b".into(),
                grace_secs: None,
            },
        );
        assert_eq!(t.requested("u1"), Some(first));
        let left = t
            .wait_done(&["u1".to_string()], Duration::from_millis(20))
            .await;
        assert_eq!(left, vec!["u1".to_string()]);
        t.mark_done("u1");
        assert!(
            t.wait_done(&["u1".to_string()], Duration::from_secs(1))
                .await
                .is_empty()
        );
        t.forget("u1");
        assert!(!t.is_requested("u1"));
    }
}
