//! Registering the Node with the API server, as the kubelet does before anything else: create
//! it with its labels, taints and full status, or adopt the Node that exists (an admin's, with
//! `register_node = false`, or this node's own from an earlier run) and reconcile the labels
//! the kubelet owns. Retried with back-off until the API server answers; pods keep running
//! meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::status::NodeStatus;
use crate::agent::cluster::{self, Cluster};

/// The labels the kubelet sets on its Node and keeps right on an existing one.
pub const OWNED_LABELS: [&str; 5] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Registers (or adopts) the Node, retrying until it is done; records the Node's UID.
pub async fn register(cluster: Arc<Cluster>, status: Arc<NodeStatus>, create: bool) {
    let api: Api<Node> = Api::all(cluster.client());
    let mut failures = 0u32;
    loop {
        match attempt(&api, &cluster, &status, create).await {
            Ok(uid) => {
                tracing::info!(node = %cluster.node_name, uid = %uid, adopted = !create, "node registered with the API server");
                cluster.set_node_uid(uid);
                return;
            }
            Err(e) => {
                failures += 1;
                cluster.log_failure("register the node", &e);
                tokio::time::sleep(cluster::retry_delay(failures)).await;
            }
        }
    }
}

async fn attempt(
    api: &Api<Node>,
    cluster: &Cluster,
    status: &NodeStatus,
    create: bool,
) -> Result<String, kube::Error> {
    let node = status.compute().await;
    if create {
        match api.create(&PostParams::default(), &node).await {
            Ok(made) => return Ok(made.metadata.uid.unwrap_or_default()),
            Err(e) if cluster::status_code(&e) == Some(409) => {}
            Err(e) => return Err(e),
        }
    }
    let existing = api.get(&cluster.node_name).await?;
    reconcile(api, &node, &existing).await?;
    Ok(existing.metadata.uid.unwrap_or_default())
}

/// Sets the owned labels that differ on the existing Node.
async fn reconcile(api: &Api<Node>, wanted: &Node, existing: &Node) -> Result<(), kube::Error> {
    let want = wanted.metadata.labels.clone().unwrap_or_default();
    let have = existing.metadata.labels.clone().unwrap_or_default();
    let changed: BTreeMap<&str, &String> = OWNED_LABELS
        .iter()
        .filter_map(|k| want.get(*k).map(|v| (*k, v)))
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let name = existing.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({"metadata": {"labels": changed}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}
