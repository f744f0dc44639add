//! Per-sandbox gates that keep container creation and pod stop/removal apart: a
//! CreateContainer holds its sandbox's gate shared from the sandbox check until its record is
//! saved with a shim, StopPodSandbox and RemovePodSandbox hold it exclusively while they list
//! and end the pod's containers, so no container is made in a pod that is being stopped or
//! removed (where nobody would ever stop or remove it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Held by a container creation: the sandbox cannot be stopped or removed meanwhile.
pub type SandboxMember = OwnedRwLockReadGuard<()>;
/// Held by a stop or removal of a sandbox: no container is created in it meanwhile.
pub type SandboxExclusive = OwnedRwLockWriteGuard<()>;

/// One gate per sandbox id, made on first use and dropped with the sandbox.
#[derive(Default)]
pub struct SandboxGates {
    gates: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

impl SandboxGates {
    fn gate(&self, id: &str) -> Arc<RwLock<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(id.to_string()).or_default().clone()
    }

    /// Shared hold on sandbox `id` (its full id), waiting for a stop or removal in progress.
    pub async fn member(&self, id: &str) -> SandboxMember {
        self.gate(id).read_owned().await
    }

    /// Exclusive hold on sandbox `id` (its full id), waiting for creations in progress.
    pub async fn exclusive(&self, id: &str) -> SandboxExclusive {
        self.gate(id).write_owned().await
    }

    /// Forgets the gate of a removed sandbox; whoever still waits on it finds the sandbox gone.
    pub fn forget(&self, id: &str) {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.remove(id);
    }

    /// How many gates are kept (one per sandbox that was used since start).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.gates.lock().map(|g| g.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_removal_waits_for_creations_and_creations_wait_for_a_removal() {
        let gates = Arc::new(SandboxGates::default());
        let member = gates.member("pod").await;
        let second = gates.member("pod").await;
        let g = gates.clone();
        let removal = tokio::spawn(async move {
            let _held = g.exclusive("pod").await;
            g.forget("pod");
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!removal.is_finished(), "the removal did not wait");
        drop(member);
        drop(second);
        removal.await.expect("removal");
        assert_eq!(gates.len(), 0);

        let held = gates.exclusive("other").await;
        let g = gates.clone();
        let creation = tokio::spawn(async move { drop(g.member("other").await) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!creation.is_finished(), "the creation did not wait");
        drop(held);
        creation.await.expect("creation");
    }
}
