//! Stopping a pod worker's containers and sandbox: preStop hooks within the grace period, ending a
//! pod before its manifest does (eviction, node shutdown), terminating it when it goes.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;

use super::PodWorker;
use crate::agent::volumes::downward::find_container;

impl PodWorker {
    /// Runs the container's preStop hook (if any) within `grace` seconds, then stops it with
    /// what is left of the grace period.
    pub(super) async fn stop_with_hook(&self, c: Option<&Container>, id: &str, grace: i64) {
        let started = Instant::now();
        if let Some(c) = c {
            self.event(
                Some(&c.name),
                crate::agent::cluster::events::EventType::Normal,
                "Killing",
                format!("Stopping container {}", c.name),
            );
        }
        if let Some(c) = c
            && let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        {
            let budget = Duration::from_secs(grace.max(0) as u64);
            if let Err(e) = crate::agent::pods::hooks::run(h, &self.target(c, id), budget).await {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "preStop hook failed");
            }
        }
        let left = grace - started.elapsed().as_secs() as i64;
        // The kubelet gives at least 2 s after a hook that used the whole period.
        let timeout = if left < 2 && started.elapsed() > Duration::from_millis(100) {
            2
        } else {
            left.max(0)
        };
        if let Err(e) = self
            .ctx
            .client
            .runtime()
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
        {
            tracing::warn!(pod = %self.pod_ref(), container = id, error = %e.message(), "StopContainer failed");
        }
    }

    /// Stops the sandbox `id` (its network and pause process), logging a failure.
    async fn stop_sandbox(&self, id: &str) {
        if let Err(e) = self
            .ctx
            .client
            .runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            tracing::warn!(sandbox = id, error = %e.message(), "StopPodSandbox failed");
        }
    }

    /// Stops the sandbox's containers within the pod's grace period, then stops and removes
    /// the sandbox.
    pub(super) async fn remove_sandbox(&self, id: &str, grace_secs: Option<i64>) {
        let grace = grace_secs.map_or_else(|| self.grace(), |g| g.max(0));
        self.stop_containers(id, grace).await;
        self.stop_sandbox(id).await;
        if let Err(e) = self
            .ctx
            .client
            .runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            tracing::warn!(sandbox = id, error = %e.message(), "RemovePodSandbox failed");
        }
        self.ctx.relist.forget(id);
    }

    /// Stops the sandbox's running containers at once, each after its preStop hook, within
    /// `grace` seconds.
    pub(super) async fn stop_containers(&self, id: &str, grace: i64) {
        let mut rt = self.ctx.client.runtime();
        if let Ok(list) = rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: id.to_string(),
                    ..Default::default()
                }),
            })
            .await
        {
            let stops = list
                .into_inner()
                .containers
                .into_iter()
                .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
                .map(|c| {
                    let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                    let container = find_container(self.pod(), name).ok();
                    async move {
                        self.stop_with_hook(container, &c.id, grace).await;
                    }
                });
            futures_util::future::join_all(stops).await;
        }
    }

    /// Ends the pod for good before its manifest does (eviction, node shutdown): stops its
    /// containers within `grace_secs` (the pod's own period when None), running preStop hooks,
    /// then its sandbox (kept, as the kubelet keeps an evicted pod's, until the manifest goes),
    /// unmounts its Memory emptyDirs, and leaves the pod Failed with `reason` and `message`.
    pub(super) async fn end(&mut self, reason: &str, message: &str, grace_secs: Option<i64>) {
        tracing::info!(pod = %self.pod_ref(), reason, message, "ending pod");
        if reason == "Evicted" {
            self.event(
                None,
                crate::agent::cluster::events::EventType::Warning,
                "Evicted",
                message.to_string(),
            );
        }
        self.drop_all_probes();
        if let Some((id, _)) = self.sandbox.clone() {
            let grace = grace_secs.unwrap_or_else(|| self.grace()).max(0);
            self.stop_containers(&id, grace).await;
            self.stop_sandbox(&id).await;
            self.last_action = Instant::now();
            if let Err(e) = self.observe().await {
                tracing::debug!(pod = %self.pod_ref(), error = %e, "observing an ended pod");
            }
        }
        // Free a Memory emptyDir's pages now (a pod evicted for memory), not when the manifest
        // goes; the pod's directory stays until then.
        crate::agent::volumes::unmount_memory_volumes(&self.ctx.pods_dir.join(&self.desired.uid));
        self.volumes = None;
        for t in self.tracks.values_mut() {
            t.waiting = None;
        }
        self.ended = Some((reason.to_string(), message.to_string()));
        self.publish();
        self.ctx.terminations.mark_done(&self.desired.uid);
    }

    /// Stops the containers within `grace_secs` (None: the pod's grace period), notes their
    /// last states (the pod's final status shows every container terminated), then stops and
    /// removes the sandbox.
    pub(super) async fn terminate(&mut self, grace_secs: Option<i64>) {
        self.drop_all_probes();
        if let Some((id, _)) = self.sandbox.clone() {
            let grace = grace_secs.map_or_else(|| self.grace(), |g| g.max(0));
            self.stop_containers(&id, grace).await;
            self.last_action = Instant::now();
            if let Err(e) = self.observe().await {
                tracing::debug!(pod = %self.pod_ref(), error = %e, "observing a terminated pod");
            }
            for t in self.tracks.values_mut() {
                t.waiting = None;
            }
            self.sandbox = None;
            self.remove_sandbox(&id, Some(0)).await;
        }
    }
}
