//! Pods from the API server: a list, then a watch, of the pods bound to this node (resumed from
//! the last resourceVersion; listed again when the API server answers 410 Gone), handed to the
//! pod manager as the kubelet's API source. While the API server is away the last set stands,
//! so running pods keep running.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use sha2::{Digest, Sha256};

use super::manifest::{DesiredPod, key_of};
use crate::agent::cluster::{self, Cluster};
use crate::agent::pods::manager::{PodManager, Source};

/// Seconds one watch request lasts before it is made again (the API server's own limit is
/// longer; a fresh request now and then keeps proxies and idle timeouts out of the way).
const WATCH_SECS: u32 = 290;

/// Lists and watches this node's pods forever.
pub async fn run(cluster: Arc<Cluster>, pods: Arc<PodManager>) {
    let selector = format!("spec.nodeName={}", cluster.node_name);
    let mut failures = 0u32;
    // Pods are admitted against the registered Node: none before it is.
    while !pods.node_known() {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    loop {
        // The client of the moment (renewed credentials), for the list and each watch.
        let api: Api<Pod> = Api::all(cluster.client());
        let list = match api.list(&ListParams::default().fields(&selector)).await {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                cluster.log_failure("list the node's pods", &e);
                tokio::time::sleep(cluster::retry_delay(failures)).await;
                continue;
            }
        };
        failures = 0;
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        // By UID, each hashed once when it arrives (not again at every other pod's event).
        let mut known: HashMap<String, DesiredPod> = list
            .items
            .into_iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, desired(p))))
            .collect();
        tracing::debug!(pods = known.len(), resource_version = %rv, "listed the node's pods");
        publish(&pods, &known);
        // Watch from there until the API server says the version is gone.
        loop {
            let params = WatchParams::default()
                .fields(&selector)
                .timeout(WATCH_SECS)
                .disable_bookmarks();
            let api: Api<Pod> = Api::all(cluster.client());
            let stream = match api.watch(&params, &rv).await {
                Ok(s) => s,
                Err(e) if cluster::status_code(&e) == Some(410) => break,
                Err(e) => {
                    failures += 1;
                    cluster.log_failure("watch the node's pods", &e);
                    tokio::time::sleep(cluster::retry_delay(failures)).await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            let mut gone = false;
            while let Some(item) = stream.next().await {
                let changed = match item {
                    Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => {
                        failures = 0;
                        note_version(&mut rv, &p);
                        match p.metadata.uid.clone() {
                            Some(uid) => {
                                known.insert(uid, desired(p));
                                true
                            }
                            None => false,
                        }
                    }
                    Ok(WatchEvent::Deleted(p)) => {
                        note_version(&mut rv, &p);
                        p.metadata
                            .uid
                            .as_ref()
                            .is_some_and(|uid| known.remove(uid).is_some())
                    }
                    Ok(WatchEvent::Bookmark(b)) => {
                        rv = b.metadata.resource_version;
                        false
                    }
                    Ok(WatchEvent::Error(e)) if e.code == 410 => {
                        gone = true;
                        break;
                    }
                    Ok(WatchEvent::Error(e)) => {
                        tracing::warn!(code = e.code, message = %e.message, "the pod watch ended with an error");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the pod watch broke off");
                        break;
                    }
                };
                if changed {
                    publish(&pods, &known);
                }
            }
            if gone {
                tracing::debug!("pod watch: resource version gone, listing again");
                break;
            }
        }
    }
}

/// Hands the pods to the pod manager: mirror pods (this node's static pods, shown in the API
/// server) apart from the pods to run.
fn publish(pods: &Arc<PodManager>, known: &HashMap<String, DesiredPod>) {
    let mut mirrors = BTreeMap::new();
    let mut to_run = BTreeMap::new();
    for d in known.values() {
        if is_mirror(&d.pod) {
            mirrors.insert(key_of(&d.pod), d.pod.clone());
        } else {
            to_run.insert(key_of(&d.pod), d.clone());
        }
    }
    pods.set_mirrors(mirrors);
    pods.set(Source::Api, to_run);
}

/// Whether `pod` is a mirror pod (the API server's copy of a node's static pod).
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(crate::agent::pods::mirror::MIRROR_ANNOTATION))
}

fn note_version(rv: &mut String, pod: &Pod) {
    if let Some(v) = &pod.metadata.resource_version {
        rv.clone_from(v);
    }
}

/// A pod as the pod manager takes it, hashed on its spec (a change of spec makes it again),
/// leaving out the fields that change without a new sandbox: activeDeadlineSeconds (the
/// running worker enforces the new one) and tolerations (read by no one on the node).
fn desired(pod: Pod) -> DesiredPod {
    let mut hashed = pod.spec.clone();
    if let Some(s) = hashed.as_mut() {
        s.active_deadline_seconds = None;
        s.tolerations = None;
    }
    let spec = serde_json::to_vec(&hashed).unwrap_or_default();
    DesiredPod {
        file: PathBuf::new(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        hash: hex::encode(&Sha256::digest(&spec)[..8]),
        pod,
        unknown_fields: Vec::new(),
    }
}
