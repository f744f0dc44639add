//! The pods the agent runs, from all its sources (manifest files, the API server): one worker
//! per pod, started when a source asks for it and stopped when none does any more (an API pod
//! being deleted within its deletion grace period, then deleted for good), and sandboxes of
//! pods no source asks for removed once every source has said what it wants.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::watch;

use super::admission::{self, NodeView, SysctlAllowlist};
use super::worker::{Desire, PodWorker, same_for_worker};
use crate::agent::AgentContext;
use crate::agent::cluster::events::EventType;
use crate::agent::cluster::{self, Cluster};
use crate::agent::node::status::NodeStatus;
use crate::agent::runtime::labels;
use crate::agent::runtime::resources::parse_quantity;
use crate::agent::sources::manifest::{DesiredPod, PodKey};

/// Where a pod comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A manifest file (a static pod).
    File,
    /// The API server (a pod bound to this node).
    Api,
}

struct Running {
    uid: String,
    hash: String,
    source: Source,
    desire: watch::Sender<Desire>,
    /// The pod as its source has it now: changes that keep the pod's hash (labels,
    /// annotations, activeDeadlineSeconds) reach the running worker through it.
    pod: watch::Sender<Pod>,
    /// The pod is being deleted in the API server: finish the deletion once the worker ends.
    deleting: Option<Pod>,
}

#[derive(Default)]
struct State {
    sets: HashMap<Source, BTreeMap<PodKey, DesiredPod>>,
    workers: HashMap<PodKey, Running>,
    orphans_removed: bool,
    /// The mirror pods the API server holds for this node, by key.
    mirrors: BTreeMap<PodKey, Pod>,
    /// Pods admission refused (they stay Failed), by key.
    refused: BTreeMap<PodKey, Refused>,
}

/// A pod admission refused.
struct Refused {
    uid: String,
    /// Its manifest's hash: a static pod whose file changed is admitted again.
    hash: String,
    source: Source,
}

/// The pod set and its workers.
pub struct PodManager {
    ctx: Arc<AgentContext>,
    cluster: Option<Arc<Cluster>>,
    /// The node's status (labels, allocatable) for admission.
    node: Arc<NodeStatus>,
    /// The sysctls pods may set.
    sysctls: SysctlAllowlist,
    state: Mutex<State>,
    /// Wakes the mirror pod task when static pods or mirror pods change.
    mirrors_changed: tokio::sync::Notify,
    /// Counts changes of where pod status goes (new pods, new mirror pods).
    targets: watch::Sender<u64>,
}

impl PodManager {
    /// A manager for the sources the agent has: files, and the API server with `cluster`.
    pub fn new(
        ctx: Arc<AgentContext>,
        cluster: Option<Arc<Cluster>>,
        node: Arc<NodeStatus>,
    ) -> Arc<Self> {
        let sysctls = SysctlAllowlist::for_this_kernel(&ctx.config.allowed_unsafe_sysctls)
            .unwrap_or_else(|e| {
                // The configuration was validated: only the safe sysctls are left here.
                tracing::error!(error = %e, "agent.allowed_unsafe_sysctls ignored");
                SysctlAllowlist::for_this_kernel(&[]).unwrap_or_default()
            });
        Arc::new(Self {
            ctx,
            cluster,
            node,
            sysctls,
            state: Mutex::new(State::default()),
            mirrors_changed: tokio::sync::Notify::new(),
            targets: watch::channel(0).0,
        })
    }

    /// The API server's mirror pods of this node now.
    /// (Any other pod's event also lands here: only a change of what the mirror pod task and
    /// the status targets read — a mirror's UID, hash or deletion — wakes them.)
    pub fn set_mirrors(&self, mirrors: BTreeMap<PodKey, Pod>) {
        let seen =
            |m: &BTreeMap<PodKey, Pod>| -> Vec<(PodKey, Option<String>, Option<String>, bool)> {
                m.iter()
                    .map(|(k, p)| {
                        let hash = p
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(super::mirror::MIRROR_ANNOTATION).cloned());
                        (k.clone(), p.metadata.uid.clone(), hash, being_deleted(p))
                    })
                    .collect()
            };
        let changed = match self.state.lock() {
            Ok(mut st) => {
                let changed = seen(&st.mirrors) != seen(&mirrors);
                st.mirrors = mirrors;
                changed
            }
            Err(_) => false,
        };
        if changed {
            self.mirrors_changed.notify_one();
            self.targets.send_modify(|n| *n += 1);
        }
    }

    /// The static pods and the mirror pods, for the mirror pod task.
    pub fn static_and_mirrors(&self) -> (BTreeMap<PodKey, DesiredPod>, BTreeMap<PodKey, Pod>) {
        self.state
            .lock()
            .map(|st| {
                (
                    st.sets.get(&Source::File).cloned().unwrap_or_default(),
                    st.mirrors.clone(),
                )
            })
            .unwrap_or_default()
    }

    /// Resolves when static pods or mirror pods changed.
    pub async fn mirrors_changed(&self) {
        self.mirrors_changed.notified().await;
    }

    /// `source` now asks for `pods` (all it asks for).
    pub fn set(self: &Arc<Self>, source: Source, pods: BTreeMap<PodKey, DesiredPod>) {
        let static_changed = match self.state.lock() {
            Ok(mut st) => {
                let changed = source == Source::File
                    && st.sets.get(&source).is_none_or(|old| {
                        old.len() != pods.len()
                            || old
                                .iter()
                                .zip(pods.iter())
                                .any(|((k1, a), (k2, b))| k1 != k2 || a.hash != b.hash)
                    });
                st.sets.insert(source, pods);
                changed
            }
            Err(_) => false,
        };
        if static_changed {
            self.mirrors_changed.notify_one();
        }
        self.reconcile();
    }

    /// A receiver that sees each change of [`PodManager::status_targets`].
    pub fn subscribe_targets(&self) -> watch::Receiver<u64> {
        self.targets.subscribe()
    }

    /// Where the status of each running pod goes in the API server, by the pod's UID: the
    /// same UID for the API server's pods, the mirror pod's for a static pod that has one.
    pub fn status_targets(&self) -> HashMap<String, String> {
        self.state
            .lock()
            .map(|st| {
                // A refused static pod's status goes to its mirror pod, when it has one.
                let refused = st.refused.iter().filter_map(|(key, r)| match r.source {
                    Source::Api => Some((r.uid.clone(), r.uid.clone())),
                    Source::File => st
                        .mirrors
                        .get(key)
                        .filter(|m| m.metadata.deletion_timestamp.is_none())
                        .and_then(|m| m.metadata.uid.clone())
                        .map(|mirror| (r.uid.clone(), mirror)),
                });
                st.workers
                    .iter()
                    .filter_map(|(key, w)| match w.source {
                        Source::Api => Some((w.uid.clone(), w.uid.clone())),
                        Source::File => st
                            .mirrors
                            .get(key)
                            .filter(|m| m.metadata.deletion_timestamp.is_none())
                            .and_then(|m| m.metadata.uid.clone())
                            .map(|mirror| (w.uid.clone(), mirror)),
                    })
                    .chain(refused)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn reconcile(self: &Arc<Self>) {
        let Ok(mut guard) = self.state.lock() else {
            return;
        };
        let State {
            sets,
            workers,
            orphans_removed,
            refused,
            ..
        } = &mut *guard;
        // Files win over the API server for a pod both name.
        let mut union: BTreeMap<&PodKey, (Source, &DesiredPod)> = BTreeMap::new();
        for source in [Source::Api, Source::File] {
            for (k, d) in sets.get(&source).into_iter().flatten() {
                union.insert(k, (source, d));
            }
        }
        let all_reported = sets.contains_key(&Source::File)
            && (self.cluster.is_none() || sets.contains_key(&Source::Api));
        if all_reported && !*orphans_removed {
            *orphans_removed = true;
            // A pod the sysctl allowlist refuses gets no worker: a sandbox it has from before
            // goes with the orphans.
            let uids: HashSet<String> = union
                .values()
                .filter(|(_, d)| admission::admit_sysctls(&d.pod, &self.sysctls).is_ok())
                .map(|(_, d)| d.uid.clone())
                .collect();
            let ctx = self.ctx.clone();
            tokio::spawn(async move { remove_orphans(&ctx, &uids).await });
        }
        for (key, w) in workers.iter_mut() {
            let current = union.get(key).filter(|(_, d)| d.uid == w.uid);
            let wanted = current.filter(|(_, d)| d.hash == w.hash && !being_deleted(&d.pod));
            if let Some((_, d)) = wanted {
                w.pod.send_if_modified(|p| {
                    let changed = !same_for_worker(p, &d.pod);
                    if changed {
                        p.clone_from(&d.pod);
                    }
                    changed
                });
            }
            if wanted.is_some() || *w.desire.borrow() != Desire::Run {
                continue;
            }
            let deleting = current
                .filter(|(s, d)| *s == Source::Api && being_deleted(&d.pod))
                .map(|(_, d)| d.pod.clone());
            let grace = deleting
                .as_ref()
                .and_then(|p| p.metadata.deletion_grace_period_seconds);
            tracing::info!(pod = %format!("{}/{}", key.0, key.1), deleting = deleting.is_some(), "pod no longer wanted: stopping it");
            w.deleting = deleting;
            let _ = w.desire.send(Desire::Stop { grace_secs: grace });
        }
        // Refused pods no source has any more are forgotten, as are static pods whose manifest
        // changed (admitted again below); deleted API pods are finished.
        refused.retain(|key, r| {
            let current = union.get(key).filter(|(_, d)| d.uid == r.uid);
            if current.is_some_and(|(s, d)| {
                !being_deleted(&d.pod) && (*s == Source::Api || d.hash == r.hash)
            }) {
                return true;
            }
            self.ctx.pods.remove(key);
            if let (Some(cluster), Some((_, d))) = (&self.cluster, current) {
                let (cluster, pod) = (cluster.clone(), d.pod.clone());
                tokio::spawn(async move { finish_deletion(&cluster, &pod).await });
            }
            false
        });
        // Devices go back once no worker runs the pod that held them and no source wants it
        // run (a restarted agent waits until every source has said what it wants).
        if all_reported {
            let wanted = union
                .values()
                .filter(|(_, d)| !being_deleted(&d.pod) && !finished(&d.pod))
                .map(|(_, d)| d.uid.as_str());
            let holders: HashSet<&str> = workers
                .values()
                .map(|w| w.uid.as_str())
                .chain(wanted)
                .collect();
            self.ctx.devices.retain_pods(&holders);
        }
        let mut starts: Vec<(&PodKey, Source, &DesiredPod)> = union
            .iter()
            .filter(|(k, _)| !workers.contains_key(**k) && !refused.contains_key(**k))
            .filter(|(_, (_, d))| !being_deleted(&d.pod) && !finished(&d.pod))
            .map(|(k, (s, d))| (*k, *s, *d))
            .collect();
        if starts.is_empty() {
            return;
        }
        // Admitted in the order they were made, as the kubelet admits them, beside the pods
        // already running.
        starts.sort_by_key(|(_, _, d)| d.pod.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let view = starts
            .iter()
            .any(|(_, s, _)| *s == Source::Api)
            .then(|| self.node_view());
        let mut admitted: Vec<&Pod> = workers
            .keys()
            .filter_map(|k| union.get(k).map(|(_, d)| &d.pod))
            .collect();
        for (key, source, d) in starts {
            // Every pod passes the sysctl allowlist; API pods then the node's checks.
            // Devices last, as the kubelet's device manager admits after the other checks.
            let verdict = admission::admit_sysctls(&d.pod, &self.sysctls)
                .and_then(|()| match (source, &view) {
                    (Source::Api, Some(view)) => admission::admit(&d.pod, &admitted, view),
                    _ => Ok(()),
                })
                .and_then(|()| {
                    self.ctx
                        .devices
                        .admit(&d.uid, &d.pod)
                        .map_err(|u| admission::Refusal {
                            reason: crate::agent::devices::UNEXPECTED_ADMISSION_ERROR.into(),
                            message: u.message,
                        })
                });
            if let Err(r) = verdict {
                tracing::warn!(pod = %format!("{}/{}", key.0, key.1), reason = %r.reason, message = %r.message, "pod refused at admission");
                // A Warning event with the refusal's reason, as the kubelet's rejectPod.
                if let Some(events) = &self.ctx.events {
                    events.pod(
                        &d.pod,
                        None,
                        EventType::Warning,
                        &r.reason,
                        r.message.clone(),
                    );
                }
                let mut pod = d.pod.clone();
                pod.status = Some(PodStatus {
                    phase: Some("Failed".into()),
                    reason: Some(r.reason),
                    message: Some(r.message),
                    ..Default::default()
                });
                self.ctx.pods.insert(key.clone(), pod);
                refused.insert(
                    key.clone(),
                    Refused {
                        uid: d.uid.clone(),
                        hash: d.hash.clone(),
                        source,
                    },
                );
                self.targets.send_modify(|n| *n += 1);
                continue;
            }
            admitted.push(&d.pod);
            let (desire, rx) = watch::channel(Desire::Run);
            let (pod, updates) = watch::channel(d.pod.clone());
            let worker = tokio::spawn(PodWorker::new(d.clone(), self.ctx.clone()).run(rx, updates));
            let (me, done_key, uid) = (self.clone(), key.clone(), d.uid.clone());
            // A worker that panics ends too: it is forgotten and its pod started again.
            tokio::spawn(async move {
                let last = match worker.await {
                    Ok(last) => last,
                    Err(e) => {
                        tracing::error!(pod = %format!("{}/{}", done_key.0, done_key.1), error = %e, "pod worker failed");
                        None
                    }
                };
                me.worker_ended(done_key, uid, last).await;
            });
            workers.insert(
                key.clone(),
                Running {
                    uid: d.uid.clone(),
                    hash: d.hash.clone(),
                    source,
                    desire,
                    pod,
                    deleting: None,
                },
            );
            self.targets.send_modify(|n| *n += 1);
        }
    }

    /// A worker ended (with the pod's final status `last`): forget it, finish an API deletion
    /// (the final status first, so that the pod's last state shows its containers stopped), and
    /// start what is wanted now.
    async fn worker_ended(self: Arc<Self>, key: PodKey, uid: String, last: Option<PodStatus>) {
        let deleting = match self.state.lock() {
            Ok(mut st) => match st.workers.get(&key) {
                Some(w) if w.uid == uid => st.workers.remove(&key).and_then(|w| w.deleting),
                _ => None,
            },
            Err(_) => None,
        };
        if let (Some(pod), Some(cluster)) = (deleting, &self.cluster) {
            if let (Some(status), Some(uid)) = (&last, pod.metadata.uid.as_deref())
                && let Err(e) = super::status_manager::send(cluster, &pod, uid, status).await
            {
                tracing::debug!(uid, error = %e, "final pod status not sent");
            }
            finish_deletion(cluster, &pod).await;
        }
        self.reconcile();
    }
}

impl PodManager {
    /// Whether the node is registered and its status computed (admission needs both).
    pub fn node_known(&self) -> bool {
        self.node.current().is_some()
            && self.cluster.as_ref().is_none_or(|c| c.node_uid().is_some())
    }

    /// The node as admission sees it: its labels, taints and allocatable as the API server
    /// has them (others' labels, taints and extended resources included), or as computed
    /// here until the node watch has read the Node.
    fn node_view(&self) -> NodeView {
        let node = self.node.api_node().or_else(|| self.node.current());
        let status = node.as_ref().and_then(|n| n.status.as_ref());
        let allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| {
                a.iter()
                    .filter_map(|(k, q)| {
                        let v = parse_quantity(&q.0)?;
                        Some((k.clone(), if k == "cpu" { v * 1000.0 } else { v }))
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeView {
            name: self.ctx.node.name.clone(),
            labels: node
                .as_ref()
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default(),
            taints: node
                .as_ref()
                .and_then(|n| n.spec.as_ref())
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            allocatable,
        }
    }
}

/// Whether the API server is deleting the pod.
fn being_deleted(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether the pod ended for good (its API status says so): it is not started again.
fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Deletes the pod for good (grace 0, only this UID), as the kubelet does once its containers
/// are stopped; retried with back-off while the API server fails, not when the pod is gone.
async fn finish_deletion(cluster: &Cluster, pod: &Pod) {
    let (Some(ns), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return;
    };
    let api: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), ns);
    let params = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let mut failures = 0u32;
    loop {
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), uid, "pod deleted from the API server");
                return;
            }
            // Gone already, or another pod of that name now (the precondition failed).
            Err(e) if matches!(cluster::status_code(&e), Some(404 | 409)) => return,
            Err(e) => {
                failures += 1;
                cluster.log_failure("delete a terminated pod", &e);
                if failures >= 10 {
                    return;
                }
                tokio::time::sleep(cluster::retry_delay(failures)).await;
            }
        }
    }
}

/// Removes sandboxes this agent made for pods no source asks for any more (removed while
/// berthd was down). Sandboxes it did not make are never touched.
async fn remove_orphans(ctx: &AgentContext, uids: &HashSet<String>) {
    let mut rt = ctx.client.runtime();
    let items = match rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [(labels::MANAGED_BY.to_string(), labels::AGENT.to_string())]
                    .into(),
                ..Default::default()
            }),
        })
        .await
    {
        Ok(r) => r.into_inner().items,
        Err(e) => {
            tracing::warn!(error = %e.message(), "agent: ListPodSandbox failed");
            return;
        }
    };
    for sb in items {
        let uid = sb
            .labels
            .get(labels::POD_UID)
            .map(String::as_str)
            .unwrap_or_default();
        if uids.contains(uid) {
            continue;
        }
        tracing::info!(sandbox = %sb.id, uid, "removing a pod no source asks for");
        if let Ok(list) = rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: sb.id.clone(),
                    ..Default::default()
                }),
            })
            .await
        {
            for c in list.into_inner().containers {
                let grace = c
                    .annotations
                    .get(labels::POD_GRACE)
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(30);
                if c.state == cri::ContainerState::ContainerRunning as i32 {
                    let _ = rt
                        .stop_container(cri::StopContainerRequest {
                            container_id: c.id,
                            timeout: grace,
                        })
                        .await;
                }
            }
        }
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await;
        // Its volumes too (a Memory emptyDir's tmpfs stays mounted otherwise), as a worker does
        // when its pod goes; only for a uid that names one directory under pods_dir.
        if is_plain_name(uid) {
            crate::agent::volumes::cleanup(&ctx.pods_dir.join(uid));
        }
    }
}

/// Whether `name` is one normal path component (not empty, `.`, `..`, nor holding a `/`).
fn is_plain_name(name: &str) -> bool {
    let mut parts = std::path::Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_uids_name_a_pod_directory() {
        assert!(is_plain_name("0b5c6f0e-1234-4c1a-9c1e-5f7d1c2b3a4d"));
        for bad in ["", ".", "..", "a/b", "/abs", "../up", "a/"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn deleted_and_finished_pods_are_not_started() {
        let mut pod = Pod::default();
        assert!(!being_deleted(&pod) && !finished(&pod));
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert!(finished(&pod));
        pod.metadata.deletion_timestamp = Some(crate::agent::pods::status::now());
        assert!(being_deleted(&pod));
    }
}
