//! The manifest source: rescans the manifest directory (woken by inotify) and hands the pods
//! its files ask for to the pod manager.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::manifest::{self, DesiredPod, PodKey};
use crate::agent::AgentContext;
use crate::agent::pods::manager::{PodManager, Source};

/// Rescans `dir` every `period` forever, handing the pods it asks for to `pods`.
pub async fn run(ctx: Arc<AgentContext>, pods: Arc<PodManager>, dir: PathBuf, period: Duration) {
    let mut desired: BTreeMap<PodKey, DesiredPod> = BTreeMap::new();
    let mut last_errors = BTreeMap::new();
    let mut cache = manifest::ParseCache::default();
    let wake = Arc::new(tokio::sync::Notify::new());
    crate::agent::dir_watch::spawn(dir.clone(), wake.clone(), "manifest");
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
        let wanted = match &ctx.cluster {
            // In a cluster a static pod's name carries the node's, as the kubelet names them
            // (mirror pods of several nodes share a namespace).
            Some(cluster) => desired
                .values()
                .map(|d| {
                    let mut d = d.clone();
                    let name = d.pod.metadata.name.clone().unwrap_or_default();
                    d.pod.metadata.name = Some(format!("{name}-{}", cluster.node_name));
                    (manifest::key_of(&d.pod), d)
                })
                .collect(),
            None => desired.clone(),
        };
        pods.set(Source::File, wanted);
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wake.notified() => {
                // Let a burst of events (an editor's save) settle into one rescan.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
