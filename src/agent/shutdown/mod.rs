//! Graceful node shutdown: when the node is going down, ends regular pods first and critical
//! (or higher-priority) pods last, each group within its share of the shutdown grace period.

pub mod logind;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tokio::sync::watch;

use crate::agent::AgentContext;
use crate::agent::config::AgentConfig;
use crate::agent::pods::terminate::{self, Termination};

/// The pod status reason of pods ended by a node shutdown.
pub const REASON: &str = "Terminated";
/// Their status message.
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Slack on top of a group's period before its stragglers are reported as not ended.
const WAIT_SLACK: Duration = Duration::from_secs(5);

/// One group of pods ended together: those with a priority from `min_priority` up to the next
/// group's, given at most `grace_secs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownGroup {
    /// Lowest priority of the group (critical pods: the system-critical priority).
    pub min_priority: i32,
    /// Seconds the group's pods get (their own grace period when shorter).
    pub grace_secs: i64,
}

/// What a shutdown did, group by group (lowest priority first).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownReport {
    /// Groups in the order they were ended.
    pub groups: Vec<GroupReport>,
    /// Milliseconds the whole shutdown took.
    pub elapsed_ms: u64,
}

/// One group's outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupReport {
    /// The group.
    #[serde(flatten)]
    pub group: ShutdownGroup,
    /// Its pods as `namespace/name`.
    pub pods: Vec<String>,
    /// Milliseconds from the start of the shutdown until the group's pods had ended.
    pub ended_after_ms: u64,
    /// Pods that had not ended within the group's period (plus slack).
    pub not_ended: Vec<String>,
}

/// Why a shutdown was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// Graceful node shutdown is off in the configuration.
    #[error(
        "graceful node shutdown is off: set agent.shutdown_grace_period_secs (and optionally \
         agent.shutdown_grace_period_critical_pods_secs or agent.shutdown_grace_period_by_pod_priority)"
    )]
    Disabled,
    /// Another shutdown runs or ran.
    #[error("the node is already shutting down")]
    InProgress,
}

/// The groups the configuration asks for, lowest priority first (empty: the feature is off).
pub fn groups(cfg: &AgentConfig) -> Vec<ShutdownGroup> {
    if !cfg.shutdown_grace_period_by_pod_priority.is_empty() {
        let mut g: Vec<ShutdownGroup> = cfg
            .shutdown_grace_period_by_pod_priority
            .iter()
            .map(|p| ShutdownGroup {
                min_priority: p.priority,
                grace_secs: p.shutdown_grace_period_seconds.max(0),
            })
            .collect();
        g.sort_by_key(|g| g.min_priority);
        return g;
    }
    if cfg.shutdown_grace_period_secs <= 0.0 {
        return Vec::new();
    }
    let critical = cfg.shutdown_grace_period_critical_pods_secs;
    vec![
        ShutdownGroup {
            min_priority: i32::MIN,
            grace_secs: (cfg.shutdown_grace_period_secs - critical).floor() as i64,
        },
        ShutdownGroup {
            min_priority: terminate::SYSTEM_CRITICAL_PRIORITY,
            grace_secs: critical.floor() as i64,
        },
    ]
}

/// Which group (index into `groups`) a pod belongs to.
pub fn group_of(groups: &[ShutdownGroup], by_priority: bool, pod: &Pod) -> usize {
    let priority = if by_priority {
        terminate::priority(pod)
    } else if terminate::is_critical(pod) {
        terminate::SYSTEM_CRITICAL_PRIORITY
    } else {
        0
    };
    groups
        .iter()
        .rposition(|g| g.min_priority <= priority)
        .unwrap_or(0)
}

/// Whether the node's one shutdown began and whether it has finished.
struct Progress {
    started: AtomicBool,
    finished: watch::Sender<bool>,
}

impl Progress {
    /// Nothing began yet.
    fn new() -> Self {
        Self {
            started: AtomicBool::new(false),
            finished: watch::Sender::new(false),
        }
    }

    /// Claims the shutdown: `None` when one already began. The guard marks it finished when it
    /// is dropped, also when the shutdown's future is dropped half-way, so waiters never hang.
    fn begin(&self) -> Option<FinishGuard<'_>> {
        if self.started.swap(true, Ordering::SeqCst) {
            return None;
        }
        Some(FinishGuard(&self.finished))
    }

    /// Resolves once the shutdown that began has finished (at once when it already has).
    async fn wait_finished(&self) {
        let mut finished = self.finished.subscribe();
        // The sender lives in `self`, so the wait cannot fail while it is borrowed.
        let _ = finished.wait_for(|f| *f).await;
    }
}

/// Held while a shutdown runs; marks it finished when dropped.
struct FinishGuard<'a>(&'a watch::Sender<bool>);

impl Drop for FinishGuard<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// The node shutdown manager.
pub struct ShutdownManager {
    ctx: Arc<AgentContext>,
    progress: Progress,
}

impl ShutdownManager {
    /// A manager for the agent's pods.
    pub fn new(ctx: Arc<AgentContext>) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            progress: Progress::new(),
        })
    }

    /// Resolves once the shutdown that began (from `berthctl node shutdown` or logind) has
    /// ended every group; at once when it already has. Call it after `shutdown` answered
    /// `InProgress`: before any shutdown began it waits for one to begin and finish.
    pub async fn wait_finished(&self) {
        self.progress.wait_finished().await;
    }

    /// Ends every pod, group by group, and returns what happened. New pods are refused from
    /// the start; pods stay Failed (reason Terminated) until the node is gone or berthd starts
    /// again.
    pub async fn shutdown(&self) -> Result<ShutdownReport, ShutdownError> {
        let cfg = &self.ctx.config;
        let groups = groups(cfg);
        if groups.is_empty() {
            return Err(ShutdownError::Disabled);
        }
        let Some(_finished) = self.progress.begin() else {
            return Err(ShutdownError::InProgress);
        };
        self.ctx.terminations.set_shutting_down();
        let by_priority = !cfg.shutdown_grace_period_by_pod_priority.is_empty();
        let begun = Instant::now();
        tracing::info!(groups = groups.len(), "node shutdown: ending pods");
        let mut members: Vec<Vec<Pod>> = vec![Vec::new(); groups.len()];
        for pod in self.ctx.pods.list() {
            members[group_of(&groups, by_priority, &pod)].push(pod);
        }
        let mut reports = Vec::new();
        for (group, pods) in groups.into_iter().zip(members) {
            reports.push(self.end_group(group, &pods, begun).await);
        }
        let report = ShutdownReport {
            groups: reports,
            elapsed_ms: begun.elapsed().as_millis() as u64,
        };
        tracing::info!(
            elapsed_ms = report.elapsed_ms,
            "node shutdown: all pods ended"
        );
        Ok(report)
    }

    async fn end_group(&self, group: ShutdownGroup, pods: &[Pod], begun: Instant) -> GroupReport {
        let mut uids = Vec::new();
        let mut names = Vec::new();
        for pod in pods {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let own = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            self.ctx.terminations.request(
                &uid,
                Termination {
                    reason: REASON.into(),
                    message: MESSAGE.into(),
                    grace_secs: Some(own.clamp(0, group.grace_secs)),
                },
            );
            names.push(crate::agent::eviction::pod_ref(pod));
            uids.push(uid);
        }
        if !names.is_empty() {
            tracing::info!(min_priority = group.min_priority, grace = group.grace_secs, pods = ?names, "node shutdown: ending a group of pods");
        }
        let period = Duration::from_secs(group.grace_secs.max(0) as u64) + WAIT_SLACK;
        let left = self.ctx.terminations.wait_done(&uids, period).await;
        let not_ended = names
            .iter()
            .zip(&uids)
            .filter(|(_, u)| left.contains(u))
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>();
        if !not_ended.is_empty() {
            tracing::warn!(pods = ?not_ended, "node shutdown: pods not ended within their period");
        }
        GroupReport {
            group,
            pods: names,
            ended_after_ms: begun.elapsed().as_millis() as u64,
            not_ended,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::config::ShutdownGraceByPriority;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(priority: Option<i32>, class: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                priority,
                priority_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn regular_then_critical_split() {
        let cfg = AgentConfig {
            shutdown_grace_period_secs: 30.0,
            shutdown_grace_period_critical_pods_secs: 10.0,
            ..Default::default()
        };
        let g = groups(&cfg);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].grace_secs, g[1].grace_secs), (20, 10));
        assert_eq!(group_of(&g, false, &pod(None, None)), 0);
        assert_eq!(group_of(&g, false, &pod(Some(1000), None)), 0);
        assert_eq!(
            group_of(&g, false, &pod(None, Some("system-node-critical"))),
            1
        );
        assert!(groups(&AgentConfig::default()).is_empty());
    }

    #[test]
    fn by_priority_ranges() {
        let cfg = AgentConfig {
            shutdown_grace_period_by_pod_priority: vec![
                ShutdownGraceByPriority {
                    priority: 100000,
                    shutdown_grace_period_seconds: 5,
                },
                ShutdownGraceByPriority {
                    priority: 0,
                    shutdown_grace_period_seconds: 20,
                },
                ShutdownGraceByPriority {
                    priority: 10000,
                    shutdown_grace_period_seconds: 10,
                },
            ],
            ..Default::default()
        };
        let g = groups(&cfg);
        let order: Vec<i32> = g.iter().map(|g| g.min_priority).collect();
        assert_eq!(order, vec![0, 10000, 100000]);
        assert_eq!(group_of(&g, true, &pod(Some(5), None)), 0);
        assert_eq!(group_of(&g, true, &pod(Some(10000), None)), 1);
        assert_eq!(group_of(&g, true, &pod(Some(200000), None)), 2);
        // Below the lowest range: the lowest group.
        assert_eq!(group_of(&g, true, &pod(Some(-5), None)), 0);
    }

    #[tokio::test]
    async fn waiting_for_a_running_shutdown_returns_when_it_ends() {
        let progress = Arc::new(Progress::new());
        let guard = progress.begin();
        assert!(guard.is_some());
        // A second shutdown is refused (the manager's InProgress) ...
        assert!(progress.begin().is_none());
        // ... and waiting for the first does not return while it runs ...
        let waiter = tokio::spawn({
            let progress = progress.clone();
            async move { progress.wait_finished().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished());
        // ... but as soon as it ends.
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait returns once the shutdown ended")
            .expect("the waiter did not panic");
        // Later waits return at once; the shutdown still cannot run twice.
        tokio::time::timeout(Duration::from_millis(100), progress.wait_finished())
            .await
            .expect("an ended shutdown is not waited for");
        assert!(progress.begin().is_none());
    }
}
