//! The pods and manifest errors the agent publishes (read by the status endpoint).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::agent::sources::manifest::PodKey;

/// Published pods by `namespace/name`, and the manifest files refused with why.
pub struct PodRegistry {
    pods: RwLock<BTreeMap<PodKey, Pod>>,
    errors: RwLock<BTreeMap<PathBuf, String>>,
    warnings: RwLock<BTreeMap<PathBuf, String>>,
    /// Counts publications that changed a pod's status (what the status manager waits on).
    changes: watch::Sender<u64>,
}

impl Default for PodRegistry {
    fn default() -> Self {
        Self {
            pods: Default::default(),
            errors: Default::default(),
            warnings: Default::default(),
            changes: watch::channel(0).0,
        }
    }
}

impl PodRegistry {
    /// Publishes a pod's latest state.
    pub fn insert(&self, key: PodKey, pod: Pod) {
        let changed = match self.pods.write() {
            Ok(mut m) => {
                let changed = m.get(&key).is_none_or(|old| old.status != pod.status);
                m.insert(key, pod);
                changed
            }
            Err(_) => false,
        };
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// A receiver that sees each change of a published pod's status.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Forgets a pod.
    pub fn remove(&self, key: &PodKey) {
        if let Ok(mut m) = self.pods.write() {
            m.remove(key);
        }
    }

    /// Every published pod, by namespace and name.
    pub fn list(&self) -> Vec<Pod> {
        self.pods
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One pod.
    pub fn get(&self, key: &PodKey) -> Option<Pod> {
        self.pods.read().ok().and_then(|m| m.get(key).cloned())
    }

    /// Replaces the manifest errors.
    pub fn set_errors(&self, errors: BTreeMap<PathBuf, String>) {
        if let Ok(mut e) = self.errors.write() {
            *e = errors;
        }
    }

    /// Replaces the manifest warnings (files taken with fields ignored).
    pub fn set_warnings(&self, warnings: BTreeMap<PathBuf, String>) {
        if let Ok(mut w) = self.warnings.write() {
            *w = warnings;
        }
    }

    /// The manifest warnings.
    pub fn warnings(&self) -> BTreeMap<PathBuf, String> {
        self.warnings.read().map(|w| w.clone()).unwrap_or_default()
    }

    /// The manifest errors.
    pub fn errors(&self) -> BTreeMap<PathBuf, String> {
        self.errors.read().map(|e| e.clone()).unwrap_or_default()
    }
}
