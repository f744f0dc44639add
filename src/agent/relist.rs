//! One relist of the runtime per period for all pods (the kubelet's PLEG idea): a snapshot of
//! the agent's sandboxes and all containers that pod workers read instead of asking CRI each.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use super::labels;
use crate::client::CriClient;

/// What one relist saw.
#[derive(Default)]
pub struct Snapshot {
    /// When the listing began (None: no successful relist yet).
    pub taken_at: Option<Instant>,
    /// The agent's sandboxes by id.
    pub sandboxes: HashMap<String, cri::PodSandbox>,
    /// Containers by sandbox id.
    pub containers: HashMap<String, Vec<cri::Container>>,
}

impl Snapshot {
    /// Whether this snapshot began after `t` (so it shows everything done before `t`).
    pub fn newer_than(&self, t: Instant) -> bool {
        self.taken_at.is_some_and(|at| at > t)
    }
}

/// The latest snapshot.
#[derive(Default)]
pub struct Relist {
    latest: RwLock<Arc<Snapshot>>,
}

impl Relist {
    /// The latest snapshot.
    pub fn get(&self) -> Arc<Snapshot> {
        self.latest.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Relists every `period`, forever.
    pub async fn run(self: Arc<Self>, client: CriClient, period: Duration) {
        loop {
            let taken_at = Instant::now();
            match list(&client).await {
                Ok((sandboxes, containers)) => {
                    let snap = Snapshot {
                        taken_at: Some(taken_at),
                        sandboxes,
                        containers,
                    };
                    if let Ok(mut l) = self.latest.write() {
                        *l = Arc::new(snap);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "agent relist failed"),
            }
            tokio::time::sleep(period).await;
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
