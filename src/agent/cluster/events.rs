//! The kubelet's events, sent to the API server as client-go's recorder sends them: on pods
//! (Pulling, Pulled, Created, Started, Killing, BackOff, Unhealthy, Failed, Evicted) and on the
//! node (Starting, NodeReady, NodeNotReady). The same event again within ten minutes raises the
//! count of the first (a PATCH) instead of making a new object; each object's events are
//! rate-limited (a burst of 25, then one per five minutes), so a crash loop never floods the API
//! server; and a bounded queue stands between: an absent API server never slows a pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;

use super::Cluster;
use crate::agent::pods::status;

/// Events waiting to be sent at most (newer ones are dropped beyond it, with a log line).
const QUEUE: usize = 1000;
/// Events an object may have at once before the rate limit applies.
const BURST: f64 = 25.0;
/// Time for the rate limit to allow one more event of an object.
const REFILL: Duration = Duration::from_secs(300);
/// How long a sent event counts as the same event again.
const AGGREGATE_FOR: Duration = Duration::from_secs(600);

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

struct Pending {
    object: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
}

/// Where the agent's parts send events.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Pending>,
    node: String,
}

impl Recorder {
    /// A recorder whose events `cluster` sends (the sending task is started here).
    pub fn start(cluster: Arc<Cluster>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let node = cluster.node_name.clone();
        tokio::spawn(run(cluster, rx));
        Self { tx, node }
    }

    fn send(&self, p: Pending) {
        if let Err(mpsc::error::TrySendError::Full(p)) = self.tx.try_send(p) {
            tracing::debug!(reason = %p.reason, "event queue full: event dropped");
        }
    }

    /// An event on `pod` (on its container `container` when given).
    pub fn pod(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: EventType,
        reason: &str,
        message: String,
    ) {
        self.send(Pending {
            object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: pod.metadata.namespace.clone(),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
                field_path: container.map(|c| format!("spec.containers{{{c}}}")),
                ..Default::default()
            },
            kind,
            reason: reason.to_string(),
            message,
        });
    }

    /// An event on the node (the kubelet names the node's UID with its name).
    pub fn node(&self, kind: EventType, reason: &str, message: String) {
        self.send(Pending {
            object: ObjectReference {
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid: Some(self.node.clone()),
                ..Default::default()
            },
            kind,
            reason: reason.to_string(),
            message,
        });
    }
}

/// One object's rate limit: a token bucket.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        let refilled = now.duration_since(self.at).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A sent event that the same one again adds to.
struct Sent {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

type Key = (String, Option<String>, EventType, String, String);

async fn run(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<Pending>) {
    let mut buckets: HashMap<String, Bucket> = HashMap::new();
    let mut sent: HashMap<Key, Sent> = HashMap::new();
    while let Some(p) = rx.recv().await {
        let now = Instant::now();
        let uid = p.object.uid.clone().unwrap_or_default();
        let bucket = buckets.entry(uid.clone()).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        if !bucket.take(now) {
            continue;
        }
        sent.retain(|_, s| now.duration_since(s.at) < AGGREGATE_FOR);
        if buckets.len() > 10_000 {
            buckets.retain(|_, b| now.duration_since(b.at) < REFILL * 25);
        }
        let key = (
            uid,
            p.object.field_path.clone(),
            p.kind,
            p.reason.clone(),
            p.message.clone(),
        );
        let result = match sent.get_mut(&key) {
            Some(s) => {
                s.count += 1;
                s.at = now;
                let patch = serde_json::json!({"count": s.count, "lastTimestamp": status::now()});
                Api::<Event>::namespaced(cluster.client(), &s.namespace)
                    .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            None => {
                let namespace = p
                    .object
                    .namespace
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "default".into());
                let name = format!(
                    "{}.{:x}",
                    p.object.name.as_deref().unwrap_or("object"),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or(0)
                );
                let time = status::now();
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                    involved_object: p.object.clone(),
                    reason: Some(p.reason.clone()),
                    message: Some(p.message.clone()),
                    type_: Some(p.kind.as_str().into()),
                    source: Some(EventSource {
                        component: Some("kubelet".into()),
                        host: Some(cluster.node_name.clone()),
                    }),
                    first_timestamp: Some(time.clone()),
                    last_timestamp: Some(time.clone()),
                    event_time: None::<MicroTime>,
                    count: Some(1),
                    reporting_component: Some("kubelet".into()),
                    reporting_instance: Some(cluster.node_name.clone()),
                    ..Default::default()
                };
                let made = Api::<Event>::namespaced(cluster.client(), &namespace)
                    .create(&PostParams::default(), &event)
                    .await;
                made.map(|_| {
                    sent.insert(
                        key,
                        Sent {
                            namespace,
                            name,
                            count: 1,
                            at: now,
                        },
                    );
                })
            }
        };
        if let Err(e) = result {
            tracing::debug!(reason = %p.reason, error = %e, "event not sent");
        }
    }
}
