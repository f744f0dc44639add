//! The manifest source: rescans the manifest directory and starts, stops and replaces pod workers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::manifest::{self, DesiredPod, PodKey};
use crate::agent::AgentContext;
use crate::agent::pods::worker::PodWorker;
use crate::agent::runtime::labels;

struct Running {
    uid: String,
    hash: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Rescans `dir` every `period` forever, keeping one worker per desired pod.
pub async fn run(ctx: Arc<AgentContext>, dir: PathBuf, period: Duration) {
    let mut workers: HashMap<PodKey, Running> = HashMap::new();
    let mut desired: BTreeMap<PodKey, DesiredPod> = BTreeMap::new();
    let mut last_errors = BTreeMap::new();
    let mut first = true;
    let mut cache = manifest::ParseCache::default();
    let wake = Arc::new(tokio::sync::Notify::new());
    super::watch::spawn(dir.clone(), wake.clone());
    loop {
        let d = dir.clone();
        let owners: BTreeMap<PodKey, PathBuf> = desired
            .iter()
            .map(|(k, v)| (k.clone(), v.file.clone()))
            .collect();
        let mut parsed = std::mem::take(&mut cache);
        let scan = match tokio::task::spawn_blocking(move || {
            let scan = manifest::scan(&d, &owners, &mut parsed);
            (scan, parsed)
        })
        .await
        {
            Ok((s, parsed)) => {
                cache = parsed;
                s
            }
            Err(e) => {
                tracing::error!(error = %e, "manifest scan panicked");
                tokio::time::sleep(period).await;
                continue;
            }
        };
        if scan.errors != last_errors {
            for (file, why) in &scan.errors {
                if last_errors.get(file) != Some(why) {
                    tracing::warn!(file = %file.display(), error = %why, "manifest refused");
                }
            }
            last_errors = scan.errors.clone();
        }
        // A file that stops parsing (say, half-written by an editor) keeps its earlier pods.
        let mut next = scan.pods;
        for (key, old) in &desired {
            if scan.errors.contains_key(&old.file) && !next.contains_key(key) {
                next.insert(key.clone(), old.clone());
            }
        }
        desired = next;
        ctx.pods.set_errors(scan.errors);
        let mut warnings: BTreeMap<PathBuf, String> = BTreeMap::new();
        for d in desired.values().filter(|d| !d.unknown_fields.is_empty()) {
            let line = format!(
                "pod {}: unknown fields ignored: {}",
                manifest::key_of(&d.pod).1,
                d.unknown_fields.join(", ")
            );
            warnings
                .entry(d.file.clone())
                .and_modify(|w| {
                    w.push_str("; ");
                    w.push_str(&line);
                })
                .or_insert(line);
        }
        ctx.pods.set_warnings(warnings);
        if first {
            first = false;
            remove_orphans(&ctx, &desired).await;
        }
        workers.retain(|_, w| !w.task.is_finished());
        for (key, w) in &workers {
            let same = desired
                .get(key)
                .is_some_and(|d| d.uid == w.uid && d.hash == w.hash);
            if !same && !*w.stop.borrow() {
                tracing::info!(pod = %format!("{}/{}", key.0, key.1), "manifest removed or changed: stopping pod");
                let _ = w.stop.send(true);
            }
        }
        for (key, d) in &desired {
            if workers.contains_key(key) {
                continue;
            }
            let (stop, rx) = watch::channel(false);
            let worker = PodWorker::new(d.clone(), ctx.clone());
            let task = tokio::spawn(worker.run(rx));
            workers.insert(
                key.clone(),
                Running {
                    uid: d.uid.clone(),
                    hash: d.hash.clone(),
                    stop,
                    task,
                },
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wake.notified() => {
                // Let a burst of events (an editor's save) settle into one rescan.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Removes sandboxes this agent made for pods no manifest asks for any more (removed while
/// berthd was down). Sandboxes it did not make are never touched.
async fn remove_orphans(ctx: &AgentContext, desired: &BTreeMap<PodKey, DesiredPod>) {
    let uids: HashSet<&str> = desired.values().map(|d| d.uid.as_str()).collect();
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
        tracing::info!(sandbox = %sb.id, uid, "removing a pod whose manifest is gone");
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
}
