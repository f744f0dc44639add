//! Mirror pods: each static pod (from a manifest file) shown in the API server as a pod bound
//! to this node, annotated `kubernetes.io/config.mirror` with the static pod's hash and owned
//! by the Node, as the kubelet makes them. Made when missing (also after someone deletes one),
//! made again when the manifest changes, deleted when the manifest goes.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::manager::PodManager;
use crate::agent::cluster::{self, Cluster};
use crate::agent::sources::manifest::DesiredPod;

/// The annotation that marks a mirror pod (its value: the static pod's hash).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Keeps the mirror pods in line with the static pods, forever.
pub async fn run(cluster: Arc<Cluster>, pods: Arc<PodManager>) {
    let mut failures = 0u32;
    loop {
        // Mirror pods are owned by the Node: wait for its registration.
        if cluster.node_uid().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        let (statics, mirrors) = pods.static_and_mirrors();
        let mut ok = true;
        for (key, d) in &statics {
            let current = mirrors.get(key);
            let fresh = current.is_some_and(|m| {
                m.metadata.deletion_timestamp.is_none()
                    && annotation(m, MIRROR_ANNOTATION) == Some(d.hash.as_str())
            });
            if fresh {
                continue;
            }
            let result = match current {
                // Stale (another manifest), or being deleted (the API server waits for the node
                // to finish): deleted at once, made again on the next round.
                Some(m) => delete(&cluster, m).await,
                None => create(&cluster, d).await,
            };
            if let Err(e) = result {
                cluster.log_failure("keep a mirror pod", &e);
                ok = false;
            }
        }
        for (key, m) in &mirrors {
            if !statics.contains_key(key)
                && let Err(e) = delete(&cluster, m).await
            {
                cluster.log_failure("delete a mirror pod", &e);
                ok = false;
            }
        }
        if ok {
            failures = 0;
            pods.mirrors_changed().await;
        } else {
            failures += 1;
            tokio::time::sleep(cluster::retry_delay(failures)).await;
        }
    }
}

fn annotation<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

/// The mirror of static pod `d`: its metadata and spec, bound to the node, owned by the Node.
fn mirror_of(cluster: &Cluster, d: &DesiredPod) -> Pod {
    let mut annotations = d.pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(MIRROR_ANNOTATION.into(), d.hash.clone());
    annotations.insert("kubernetes.io/config.hash".into(), d.hash.clone());
    annotations.insert("kubernetes.io/config.source".into(), "file".into());
    let mut spec = d.pod.spec.clone().unwrap_or_default();
    spec.node_name = Some(cluster.node_name.clone());
    Pod {
        metadata: ObjectMeta {
            name: d.pod.metadata.name.clone(),
            namespace: d.pod.metadata.namespace.clone(),
            labels: d.pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: cluster.node_uid().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: cluster.node_name.clone(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

async fn create(cluster: &Cluster, d: &DesiredPod) -> Result<(), kube::Error> {
    let ns = d.pod.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<Pod> = Api::namespaced(cluster.client(), ns);
    match api
        .create(&PostParams::default(), &mirror_of(cluster, d))
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %format!("{ns}/{}", d.pod.metadata.name.as_deref().unwrap_or_default()), "mirror pod created");
            Ok(())
        }
        // A pod of that name exists (the watch will show it): decided on the next round.
        Err(e) if cluster::status_code(&e) == Some(409) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn delete(cluster: &Cluster, m: &Pod) -> Result<(), kube::Error> {
    let ns = m.metadata.namespace.as_deref().unwrap_or("default");
    let name = m.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(cluster.client(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: m.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if matches!(cluster::status_code(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(e),
    }
}
