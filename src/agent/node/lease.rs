//! The node's Lease in `kube-node-lease`: made with an owner reference to the Node, renewed
//! every quarter of its duration from the last Lease the API server returned, read again after
//! a conflict, and retried from 200 ms doubling to 7 s while renewals fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};

use crate::agent::cluster::{self, Cluster};
use crate::agent::pods::status;

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// Renews the node's Lease forever, counting renewals in `renewals`.
pub async fn run(cluster: Arc<Cluster>, duration: Duration, renewals: Arc<AtomicU64>) {
    let mut latest: Option<Lease> = None;
    let mut failures = 0u32;
    loop {
        // The client of the moment: renewed credentials take effect at the next renewal.
        let api: Api<Lease> = Api::namespaced(cluster.client(), NAMESPACE);
        match renew(&api, &cluster, duration, latest.take()).await {
            Ok(lease) => {
                latest = Some(lease);
                failures = 0;
                renewals.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(duration / 4).await;
            }
            Err(e) => {
                failures += 1;
                cluster.log_failure("renew the node lease", &e);
                tokio::time::sleep(cluster::retry_delay(failures)).await;
            }
        }
    }
}

/// One renewal: an update of `latest` when there is one, else a read, else a creation.
async fn renew(
    api: &Api<Lease>,
    cluster: &Cluster,
    duration: Duration,
    latest: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let name = cluster.node_name.as_str();
    let base = match latest {
        Some(l) => Some(l),
        None => api.get_opt(name).await?,
    };
    let Some(mut lease) = base else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(NAMESPACE.to_string()),
                owner_references: owner(cluster).map(|o| vec![o]),
                ..Default::default()
            },
            spec: Some(spec(cluster, duration)),
        };
        return api.create(&PostParams::default(), &lease).await;
    };
    lease.spec = Some(spec(cluster, duration));
    if lease
        .metadata
        .owner_references
        .as_ref()
        .is_none_or(|o| o.is_empty())
    {
        lease.metadata.owner_references = owner(cluster).map(|o| vec![o]);
    }
    api.replace(name, &PostParams::default(), &lease).await
}

fn spec(cluster: &Cluster, duration: Duration) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(cluster.node_name.clone()),
        lease_duration_seconds: Some(duration.as_secs().max(1) as i32),
        renew_time: Some(MicroTime(status::now().0)),
        ..Default::default()
    }
}

/// The Node as the Lease's owner (the Lease goes when the Node is deleted).
fn owner(cluster: &Cluster) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: cluster.node_name.clone(),
        uid: cluster.node_uid()?.to_string(),
        ..Default::default()
    })
}
