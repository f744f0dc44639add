//! Pod status back to the API server: a strategic-merge PATCH of `pods/<name>/status` each time
//! the status a worker publishes changes (a burst of changes goes as one), with the pod's UID
//! in the patch so a pod made again under the same name is never written over; a static pod's
//! status goes to its mirror pod. It never reads pods/status (the node authorizer forbids it):
//! what was sent last is kept here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};

use super::manager::PodManager;
use crate::agent::AgentContext;
use crate::agent::cluster::{self, Cluster};

/// How long a burst of status changes may gather before it is sent.
const COALESCE: Duration = Duration::from_millis(10);

/// Sends status changes forever.
pub async fn run(cluster: Arc<Cluster>, ctx: Arc<AgentContext>, pods: Arc<PodManager>) {
    let mut changes = ctx.pods.subscribe();
    let mut targets_changed = pods.subscribe_targets();
    let mut sent: HashMap<String, PodStatus> = HashMap::new();
    let mut failures = 0u32;
    loop {
        let targets = pods.status_targets();
        sent.retain(|target, _| targets.values().any(|t| t == target));
        let mut failed = false;
        for pod in ctx.pods.list() {
            let Some(target) = pod.metadata.uid.as_ref().and_then(|u| targets.get(u)) else {
                continue;
            };
            let uid = target.clone();
            let status = pod.status.clone().unwrap_or_default();
            if sent.get(&uid) == Some(&status) {
                continue;
            }
            match send(&cluster, &pod, &uid, &status).await {
                Ok(()) => {
                    sent.insert(uid, status);
                }
                // The pod is gone, or another pod has its name now: nothing to send to.
                Err(e) if matches!(cluster::status_code(&e), Some(404 | 409 | 422)) => {
                    tracing::debug!(uid = %uid, error = %e, "pod status not sent: the pod is gone");
                    sent.insert(uid, status);
                }
                Err(e) => {
                    cluster.log_failure("patch a pod's status", &e);
                    failed = true;
                }
            }
        }
        if failed {
            failures += 1;
            tokio::time::sleep(cluster::retry_delay(failures)).await;
            continue;
        }
        failures = 0;
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            r = targets_changed.changed() => if r.is_err() { return },
        }
        tokio::time::sleep(COALESCE).await;
        changes.mark_unchanged();
        targets_changed.mark_unchanged();
    }
}

/// PATCHes `status` onto `pod` (of UID `uid`, the precondition) in the API server.
pub async fn send(
    cluster: &Cluster,
    pod: &Pod,
    uid: &str,
    status: &PodStatus,
) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(cluster.client(), ns);
    let patch = serde_json::json!({"metadata": {"uid": uid}, "status": status});
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(drop)
}
