//! Disk usage measured at most once per interval: walking directory trees on every stats
//! request would cost far more than the answer is worth (the kubelet and containerd measure
//! disks every 10 s or more too).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a measurement is reused.
pub const DISK_TTL: Duration = Duration::from_secs(10);

/// Bytes and inodes.
pub type Usage = (u64, u64);

/// Measurements (bytes and inodes, or what `V` says) by key (a directory, a snapshot), each
/// reused for [`DISK_TTL`].
#[derive(Debug)]
pub struct DiskCache<K, V = Usage> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K, V> Default for DiskCache<K, V> {
    fn default() -> Self {
        Self::with_ttl(DISK_TTL)
    }
}

impl<K, V> DiskCache<K, V> {
    /// A cache whose measurements live `ttl`.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets every measurement (the next request measures again).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (Instant, V)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<K: Eq + Hash + Clone, V: Clone> DiskCache<K, V> {
    /// The usage of `key`, measured by `measure` when none younger than the TTL is kept.
    /// `measure` runs without the lock held (walks of different keys go on in parallel).
    pub fn usage(&self, key: &K, measure: impl FnOnce() -> V) -> V {
        let now = Instant::now();
        if let Some((at, used)) = self.lock().get(key)
            && now.duration_since(*at) < self.ttl
        {
            return used.clone();
        }
        let used = measure();
        let mut entries = self.lock();
        // Keys that are no longer asked for (pods, containers that are gone) fall out.
        let keep = self.ttl * 6;
        entries.retain(|_, (at, _)| now.duration_since(*at) < keep);
        entries.insert(key.clone(), (now, used.clone()));
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_is_reused_until_it_is_old_or_cleared() {
        let cache = DiskCache::with_ttl(Duration::from_millis(200));
        let mut walks = 0;
        let mut measure = |v| {
            walks += 1;
            (v, 1)
        };
        assert_eq!(cache.usage(&"a", || measure(10)), (10, 1));
        assert_eq!(cache.usage(&"a", || measure(20)), (10, 1), "reused");
        assert_eq!(cache.usage(&"b", || measure(30)), (30, 1), "per key");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(cache.usage(&"a", || measure(40)), (40, 1), "measured again");
        cache.clear();
        assert_eq!(cache.usage(&"a", || measure(50)), (50, 1), "cleared");
        assert_eq!(walks, 4);
    }
}
