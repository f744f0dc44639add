//! Per-key exponential back-off as the kubelet keeps it: the first failure is retried at once,
//! then waits start at the base and double to the cap; an entry idle for the reset period is
//! forgotten (a container that ran cleanly that long starts over).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Back-off parameters (the kubelet's by default).
#[derive(Debug, Clone, Copy)]
pub struct BackoffPolicy {
    /// First wait.
    pub base: Duration,
    /// Largest wait.
    pub max: Duration,
    /// An entry not renewed for this long starts over at the base.
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    renewed: Instant,
}

/// Back-off state per key (a container name, an image).
#[derive(Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// An empty back-off table.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            entries: HashMap::new(),
        }
    }

    /// If `key` failed at `failed_at` and must still wait at `now`: until when.
    pub fn waiting_until(&self, key: &str, failed_at: Instant, now: Instant) -> Option<Instant> {
        let e = self.entries.get(key)?;
        if now.saturating_duration_since(e.renewed) >= self.policy.reset_after {
            return None;
        }
        let until = failed_at + e.delay;
        (now < until).then_some(until)
    }

    /// Records a retry of `key` at `now`: the next wait doubles (or starts at the base when the
    /// key is new or was quiet for the reset period).
    pub fn next(&mut self, key: &str, now: Instant) {
        let delay = match self.entries.get(key) {
            Some(e) if now.saturating_duration_since(e.renewed) < self.policy.reset_after => {
                (e.delay * 2).min(self.policy.max)
            }
            _ => self.policy.base,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                renewed: now,
            },
        );
    }

    /// The current wait of `key` (zero when none).
    pub fn delay(&self, key: &str) -> Duration {
        self.entries.get(key).map(|e| e.delay).unwrap_or_default()
    }

    /// Forgets `key`.
    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let mut b = Backoff::new(BackoffPolicy::default());
        let t0 = Instant::now();
        // First failure: no wait, the entry starts at the base.
        assert!(b.waiting_until("c", t0, t0).is_none());
        b.next("c", t0);
        assert_eq!(b.delay("c"), Duration::from_secs(10));
        let t1 = t0 + Duration::from_secs(1);
        assert!(
            b.waiting_until("c", t1, t1 + Duration::from_secs(5))
                .is_some()
        );
        assert!(
            b.waiting_until("c", t1, t1 + Duration::from_secs(11))
                .is_none()
        );
        let mut t = t1;
        for _ in 0..10 {
            t += Duration::from_secs(1);
            b.next("c", t);
        }
        assert_eq!(b.delay("c"), Duration::from_secs(300));
        // Quiet for 10 min: starts over.
        let later = t + Duration::from_secs(700);
        assert!(b.waiting_until("c", later, later).is_none());
        b.next("c", later);
        assert_eq!(b.delay("c"), Duration::from_secs(10));
        b.reset("c");
        assert_eq!(b.delay("c"), Duration::ZERO);
    }
}
