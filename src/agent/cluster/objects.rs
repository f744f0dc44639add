//! The configMaps and secrets the node's pods use, kept current by a watch each (a list, then
//! a watch, of that one object by `metadata.name`, as the kubelet's watch-based manager does
//! and as the node authorizer allows): a pod reads them from here, so an idle node sends no
//! GET per pod and refresh. A watch nobody read for ten minutes is stopped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::{Cluster, retry_delay, status_code};

/// The keys of a configMap or secret (values as bytes); None when it does not exist.
pub type Keys = Option<BTreeMap<String, Vec<u8>>>;

/// An object's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    /// The kind as the kubelet's messages name it (`configmap`, `secret`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// How long a first read waits for its watch's first answer.
const FIRST_READ: Duration = Duration::from_secs(10);
/// How long a watch nobody reads lives on.
const IDLE: Duration = Duration::from_secs(600);

/// Refusals (403) in a row after which a watch ends: the node authorizer lags a pod's binding
/// by a moment, and refuses for good once no pod of the node names the object.
const FORBIDDEN_TRIES: u32 = 3;

type ObjectKey = (Kind, String, String);

struct Entry {
    value: watch::Receiver<Option<Keys>>,
    last_read: Instant,
    task: tokio::task::JoinHandle<()>,
}

/// The watched objects.
#[derive(Default)]
pub struct ObjectCache {
    entries: Mutex<HashMap<ObjectKey, Entry>>,
}

impl ObjectCache {
    /// The keys of object `name` of `kind` in `ns` (None: it does not exist), from its watch
    /// (started now if there is none; the first read waits for its first answer).
    pub async fn get(
        &self,
        cluster: &Arc<Cluster>,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Keys, String> {
        let key = (kind, ns.to_string(), name.to_string());
        let mut rx = {
            let Ok(mut entries) = self.entries.lock() else {
                return Err("the object cache is unusable".into());
            };
            let now = Instant::now();
            entries.retain(|_, e| {
                // A watch the API server refused (403) has ended: a read starts a new one.
                let keep = now.duration_since(e.last_read) < IDLE && !e.task.is_finished();
                if !keep {
                    e.task.abort();
                }
                keep
            });
            let entry = entries.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = watch::channel(None);
                let task = tokio::spawn(follow(cluster.clone(), key.clone(), tx));
                Entry {
                    value: rx,
                    last_read: now,
                    task,
                }
            });
            entry.last_read = now;
            entry.value.clone()
        };
        let first = tokio::time::timeout(FIRST_READ, rx.wait_for(Option::is_some)).await;
        match first {
            Ok(Ok(v)) => Ok(v.clone().flatten()),
            Ok(Err(_)) => Err(format!(
                "{} {name:?}: the API server does not let this node read it (forbidden)",
                kind.name()
            )),
            Err(_) => Err(format!(
                "{} {name:?}: no answer from the API server in {FIRST_READ:?}",
                kind.name()
            )),
        }
    }
}

/// Lists then watches one object forever, publishing its keys.
async fn follow(cluster: Arc<Cluster>, key: ObjectKey, tx: watch::Sender<Option<Keys>>) {
    let (kind, ns, name) = key;
    let what = format!("{} {ns}/{name}", kind.name());
    match kind {
        Kind::ConfigMap => {
            follow_one::<ConfigMap>(&cluster, &ns, &name, &what, &tx, config_map_keys).await;
        }
        Kind::Secret => {
            follow_one::<Secret>(&cluster, &ns, &name, &what, &tx, secret_keys).await;
        }
    }
}

/// [`follow`] for one kind of object; ends when the API server forbids the node to read it
/// (the node authorizer does once no pod of the node names it), not to ask again forever.
async fn follow_one<K>(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    what: &str,
    tx: &watch::Sender<Option<Keys>>,
    keys_of: fn(K) -> BTreeMap<String, Vec<u8>>,
) where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let selector = format!("metadata.name={name}");
    let mut failures = 0u32;
    loop {
        // The client of the moment (renewed credentials), for the list and each watch.
        let api = Api::<K>::namespaced(cluster.client(), ns);
        let mut rv = match api.list(&ListParams::default().fields(&selector)).await {
            Ok(l) => {
                failures = 0;
                tx.send_replace(Some(l.items.into_iter().next().map(keys_of)));
                l.metadata.resource_version.unwrap_or_default()
            }
            Err(e) if status_code(&e) == Some(403) && failures + 1 >= FORBIDDEN_TRIES => {
                tracing::info!(object = %what, "the API server forbids this node to read it: not watched");
                return;
            }
            Err(e) => {
                failures += 1;
                cluster.log_failure(&format!("read {what}"), &e);
                tokio::time::sleep(retry_delay(failures)).await;
                continue;
            }
        };
        // Watch until the version is gone (then list again).
        let params = WatchParams::default().fields(&selector).timeout(290);
        loop {
            let api = Api::<K>::namespaced(cluster.client(), ns);
            let publish = |o: Option<K>| {
                tx.send_replace(Some(o.map(keys_of)));
            };
            match watch_one(&api, &params, &mut rv, publish).await {
                Ok(true) => break,
                Ok(false) => failures = 0,
                Err(e) if status_code(&e) == Some(403) && failures + 1 >= FORBIDDEN_TRIES => {
                    tracing::info!(object = %what, "the API server forbids this node to watch it: not watched");
                    return;
                }
                Err(e) => {
                    failures += 1;
                    cluster.log_failure(&format!("watch {what}"), &e);
                    tokio::time::sleep(retry_delay(failures)).await;
                }
            }
        }
    }
}

/// One watch request from `rv` of the objects `params` select: hands each version to
/// `publish` (None: deleted); Ok(true) when the version is gone (list again).
pub async fn watch_one<K>(
    api: &Api<K>,
    params: &WatchParams,
    rv: &mut String,
    mut publish: impl FnMut(Option<K>),
) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let stream = match api.watch(params, rv).await {
        Ok(s) => s,
        Err(e) if status_code(&e) == Some(410) => return Ok(true),
        Err(e) => return Err(e),
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                if let Some(v) = o.meta().resource_version.clone() {
                    *rv = v;
                }
                publish(Some(o));
            }
            Ok(WatchEvent::Deleted(o)) => {
                if let Some(v) = o.meta().resource_version.clone() {
                    *rv = v;
                }
                publish(None);
            }
            Ok(WatchEvent::Bookmark(b)) => *rv = b.metadata.resource_version,
            Ok(WatchEvent::Error(e)) if e.code == 410 => return Ok(true),
            Ok(WatchEvent::Error(_)) | Err(_) => return Ok(false),
        }
    }
    Ok(false)
}

fn config_map_keys(cm: ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.unwrap_or_default() {
        keys.insert(k, v.0);
    }
    keys
}

fn secret_keys(s: Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}
