//! The pods and manifest errors the agent publishes (read by the status endpoint).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Pod;

use crate::agent::sources::manifest::PodKey;

/// Published pods by `namespace/name`, and the manifest files refused with why.
#[derive(Default)]
pub struct PodRegistry {
    pods: RwLock<BTreeMap<PodKey, Pod>>,
    errors: RwLock<BTreeMap<PathBuf, String>>,
    warnings: RwLock<BTreeMap<PathBuf, String>>,
}

impl PodRegistry {
    /// Publishes a pod's latest state.
    pub fn insert(&self, key: PodKey, pod: Pod) {
        if let Ok(mut m) = self.pods.write() {
            m.insert(key, pod);
        }
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
