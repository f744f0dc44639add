//! The node's own Node object as the API server has it, kept current by a list and a watch of
//! that one object (as the kubelet's node informer): the labels, taints and allocatable others
//! set on it (an admin's label, a controller's taint, a device plugin's or a test's extended
//! resource) are what pod admission checks and what the node status keeps.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, WatchParams};

use super::status::NodeStatus;
use crate::agent::cluster::{self, Cluster, objects};

/// Seconds one watch request lasts before it is made again.
const WATCH_SECS: u32 = 290;

/// Lists and watches the node's Node forever, handing each version to `status`.
pub async fn run(cluster: Arc<Cluster>, status: Arc<NodeStatus>) {
    let selector = format!("metadata.name={}", cluster.node_name);
    let mut failures = 0u32;
    loop {
        let api: Api<Node> = Api::all(cluster.client());
        let list = match api.list(&ListParams::default().fields(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                cluster.log_failure("list the node", &e);
                tokio::time::sleep(cluster::retry_delay(failures)).await;
                continue;
            }
        };
        failures = 0;
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        status.set_api_node(list.items.into_iter().next());
        loop {
            let params = WatchParams::default().fields(&selector).timeout(WATCH_SECS);
            let api: Api<Node> = Api::all(cluster.client());
            let publish = |n: Option<Node>| status.set_api_node(n);
            match objects::watch_one(&api, &params, &mut rv, publish).await {
                Ok(true) => break,
                Ok(false) => failures = 0,
                Err(e) => {
                    failures += 1;
                    cluster.log_failure("watch the node", &e);
                    tokio::time::sleep(cluster::retry_delay(failures)).await;
                }
            }
        }
    }
}
