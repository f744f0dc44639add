//! The agent's view of the runtime (the kubelet's PLEG idea): one snapshot of the agent's
//! sandboxes and all containers that pod workers read instead of asking CRI each.
//!
//! The snapshot follows the runtime's container events (GetContainerEvents): each event (a
//! burst is taken as one) brings a fresh relist and wakes the workers of the pods it touched,
//! so a container's exit reaches its worker in milliseconds. A full relist also runs every
//! [`SAFETY_RELIST`] as a safety net. A runtime without the events stream is relisted every
//! sync period instead. A worker that lists its own pod's containers (after acting on them)
//! records that list, so the snapshot counts as current for that pod from then on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use k8s_cri::v1 as cri;
use tokio::sync::Notify;

use super::labels;
use crate::client::CriClient;

/// How often the whole runtime is relisted while events flow.
pub const SAFETY_RELIST: Duration = Duration::from_secs(300);

/// What one relist saw.
#[derive(Default, Clone)]
pub struct Snapshot {
    /// When the listing began (None: no successful relist yet).
    pub taken_at: Option<Instant>,
    /// The agent's sandboxes by id.
    pub sandboxes: HashMap<String, cri::PodSandbox>,
    /// Containers by sandbox id.
    pub containers: HashMap<String, Vec<cri::Container>>,
    /// When a worker last listed a sandbox's containers itself (that list is in `containers`).
    pub observed: HashMap<String, Instant>,
}

impl Snapshot {
    /// Whether this snapshot began after `t` (so it shows everything done before `t`).
    pub fn newer_than(&self, t: Instant) -> bool {
        self.taken_at.is_some_and(|at| at > t)
    }

    /// Whether the containers of `sandbox` here show everything done to them before `t`.
    pub fn fresh_for(&self, sandbox: &str, t: Instant) -> bool {
        self.newer_than(t) || self.observed.get(sandbox).is_some_and(|at| *at > t)
    }
}

/// The latest snapshot, and the wake-ups of the workers waiting for their pod to change.
#[derive(Default)]
pub struct Relist {
    latest: RwLock<Arc<Snapshot>>,
    wakers: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Relist {
    /// The latest snapshot.
    pub fn get(&self) -> Arc<Snapshot> {
        self.latest.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Notified when an event about sandbox `id`'s containers has been relisted.
    pub fn waker(&self, id: &str) -> Arc<Notify> {
        self.wakers
            .lock()
            .map(|mut w| w.entry(id.to_string()).or_default().clone())
            .unwrap_or_default()
    }

    /// Forgets sandbox `id`'s waker (the sandbox is gone).
    pub fn forget(&self, id: &str) {
        if let Ok(mut w) = self.wakers.lock() {
            w.remove(id);
        }
    }

    /// A worker listed sandbox `id`'s containers itself, beginning at `began`.
    pub fn record(&self, id: &str, began: Instant, containers: Vec<cri::Container>) {
        if let Ok(mut latest) = self.latest.write() {
            let mut next = Snapshot::clone(&latest);
            next.containers.insert(id.to_string(), containers);
            next.observed.insert(id.to_string(), began);
            *latest = Arc::new(next);
        }
    }

    fn publish(&self, taken_at: Instant, lists: Lists) {
        let (sandboxes, containers) = lists;
        if let Ok(mut l) = self.latest.write() {
            // A worker's own list that began after this relist stays the newer word.
            let mut observed = l.observed.clone();
            observed.retain(|_, at| *at > taken_at);
            let mut containers = containers;
            for id in observed.keys() {
                if let Some(own) = l.containers.get(id) {
                    containers.insert(id.clone(), own.clone());
                }
            }
            *l = Arc::new(Snapshot {
                taken_at: Some(taken_at),
                sandboxes,
                containers,
                observed,
            });
        }
    }

    /// Relists once; true when it succeeded.
    async fn relist(&self, client: &CriClient) -> bool {
        let taken_at = Instant::now();
        match list(client).await {
            Ok(lists) => {
                self.publish(taken_at, lists);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "agent relist failed");
                false
            }
        }
    }

    fn wake(&self, sandboxes: &HashSet<String>) {
        if let Ok(w) = self.wakers.lock() {
            for id in sandboxes {
                if let Some(n) = w.get(id) {
                    n.notify_one();
                }
            }
        }
    }

    /// Follows the runtime's events (relisting every `period` where it has none), forever.
    pub async fn run(self: Arc<Self>, client: CriClient, period: Duration) {
        loop {
            let subscribed = client
                .runtime()
                .get_container_events(cri::GetEventsRequest {})
                .await;
            // Subscribed first, then listed: nothing that happens in between is missed.
            self.relist(&client).await;
            let mut events = match subscribed {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    if e.code() != tonic::Code::Unimplemented {
                        tracing::debug!(error = %e.message(), "container events unavailable: relisting");
                    }
                    tokio::time::sleep(period).await;
                    continue;
                }
            };
            let mut next_safety = tokio::time::Instant::now() + SAFETY_RELIST;
            loop {
                let first = tokio::select! {
                    m = events.message() => m,
                    () = tokio::time::sleep_until(next_safety) => {
                        self.relist(&client).await;
                        next_safety = tokio::time::Instant::now() + SAFETY_RELIST;
                        continue;
                    }
                };
                let Ok(Some(first)) = first else {
                    tracing::debug!("container events stream ended: subscribing again");
                    break;
                };
                // A burst counts as one change: take what has arrived already, relist once.
                let mut touched = HashSet::new();
                let mut note = |e: &cri::ContainerEventResponse| {
                    if let Some(s) = &e.pod_sandbox_status {
                        touched.insert(s.id.clone());
                    }
                    // A sandbox's own event names it as the container (also once it is gone).
                    touched.insert(e.container_id.clone());
                };
                note(&first);
                let mut ended = false;
                while let Some(more) = events.message().now_or_never() {
                    match more {
                        Ok(Some(e)) => note(&e),
                        _ => {
                            ended = true;
                            break;
                        }
                    }
                }
                self.relist(&client).await;
                self.wake(&touched);
                if ended {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

type Lists = (
    HashMap<String, cri::PodSandbox>,
    HashMap<String, Vec<cri::Container>>,
);

async fn list(client: &CriClient) -> Result<Lists, tonic::Status> {
    let mut rt = client.runtime();
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [(labels::MANAGED_BY.to_string(), labels::AGENT.to_string())]
                    .into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .items
        .into_iter()
        .map(|s| (s.id.clone(), s))
        .collect();
    let mut containers: HashMap<String, Vec<cri::Container>> = HashMap::new();
    for c in rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers
    {
        containers
            .entry(c.pod_sandbox_id.clone())
            .or_default()
            .push(c);
    }
    Ok((sandboxes, containers))
}
