//! The eviction manager: watches the node's eviction signals against hard and soft thresholds,
//! sets the pressure conditions and evicts pods in the kubelet's order.

pub mod local;
pub mod policy;
pub mod signals;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::agent::AgentContext;

use crate::agent::pods::terminate::{self, Termination};
use policy::{
    Candidate, Threshold, Tracker, Verdict, grace_secs, message, rank, thresholds, to_reclaim,
};
use signals::{Condition, Observation, Observed};

/// How long the manager waits for an evicted pod to end (the kubelet's podCleanupTimeout).
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Evictions kept in the report.
const KEPT_EVICTIONS: usize = 20;

/// A threshold as the report shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThresholdReport {
    /// `hard` or `soft`.
    pub kind: &'static str,
    /// As configured.
    pub value: String,
    /// The amount it stands for now.
    pub quantity: u64,
    /// Crossed now.
    pub met: bool,
    /// Crossed for at least its grace period (evictions due).
    pub grace_period_met: bool,
}

/// A signal as the report shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalReport {
    /// `memory.available`, ...
    pub signal: &'static str,
    /// Available now.
    pub available: u64,
    /// Capacity.
    pub capacity: u64,
    /// Its thresholds.
    pub thresholds: Vec<ThresholdReport>,
}

/// An eviction done.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRecord {
    /// `namespace/name`.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// The signal reclaimed.
    pub signal: &'static str,
    /// The message given to the pod.
    pub message: String,
    /// Grace period given.
    pub grace_secs: i64,
}

/// The eviction manager's latest observations and decisions.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionReport {
    /// Checks done.
    pub checks: u64,
    /// Signals read at the last check.
    pub signals: Vec<SignalReport>,
    /// Pressure conditions on (`MemoryPressure`, ...).
    pub conditions: Vec<&'static str>,
    /// The path whose filesystem is nodefs.
    pub nodefs: Option<std::path::PathBuf>,
    /// The imagefs mountpoint.
    pub imagefs: Option<std::path::PathBuf>,
    /// The latest evictions, oldest first.
    pub evictions: Vec<EvictionRecord>,
}

/// The report shared with the node status and the endpoint.
#[derive(Default)]
pub struct Shared {
    report: Mutex<EvictionReport>,
}

/// The eviction manager's latest report for the agent `ctx`.
pub fn report(ctx: &Arc<AgentContext>) -> EvictionReport {
    ctx.eviction
        .report
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default()
}

fn signal_reports(thresholds: &[Threshold], observed: &Observed, v: &Verdict) -> Vec<SignalReport> {
    observed
        .signals
        .iter()
        .map(|(s, o)| SignalReport {
            signal: s.name(),
            available: o.available,
            capacity: o.capacity,
            thresholds: thresholds
                .iter()
                .enumerate()
                .filter(|(_, t)| t.signal == *s)
                .map(|(i, t)| ThresholdReport {
                    kind: if t.is_hard() { "hard" } else { "soft" },
                    value: t.text.clone(),
                    quantity: t.quantity(o.capacity),
                    met: v.met.contains(&i),
                    grace_period_met: v.actionable.contains(&i),
                })
                .collect(),
        })
        .collect()
}

/// The manager's loop state.
struct Manager {
    ctx: Arc<AgentContext>,
    shared: Arc<Shared>,
    thresholds: Vec<Threshold>,
    transition: Duration,
    tracker: Tracker,
}

impl Manager {
    /// Where the signals are read now (the imagefs mountpoint asked from the runtime).
    async fn sources(&self) -> signals::Sources {
        let imagefs = match crate::agent::gc::images::image_fs_mountpoint(&self.ctx).await {
            Ok(m) => Some(std::path::PathBuf::from(m)),
            Err(e) => {
                tracing::debug!(error = %e, "eviction: no image filesystem from CRI; no imagefs signals");
                None
            }
        };
        signals::Sources {
            nodefs: vec![self.ctx.pods_dir.clone(), self.ctx.pod_log_dir.clone()],
            imagefs,
            memory_capacity: self.ctx.node.memory_bytes,
        }
    }

    /// Reads every signal now (off the async threads); nothing observed when the reading task
    /// failed.
    async fn observe(&self) -> Observed {
        let sources = self.sources().await;
        tokio::task::spawn_blocking(move || signals::observe(&sources))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "eviction: reading the signals failed");
                Observed::default()
            })
    }

    /// Asks for pod `uid` (`pod`: namespace/name) to end as evicted for `signal` with `message`
    /// and `grace_secs`, and records that in the report (the latest [`KEPT_EVICTIONS`] kept).
    fn record_eviction(
        &self,
        pod: String,
        uid: &str,
        signal: &'static str,
        message: String,
        grace_secs: i64,
    ) {
        self.ctx.terminations.request(
            uid,
            Termination {
                reason: "Evicted".into(),
                message: message.clone(),
                grace_secs: Some(grace_secs),
            },
        );
        crate::agent::metrics::agent()
            .evictions
            .get_or_create(&[("signal", signal.to_string())])
            .inc();
        if let Ok(mut r) = self.shared.report.lock() {
            r.evictions.push(EvictionRecord {
                pod,
                uid: uid.to_string(),
                signal,
                message,
                grace_secs,
            });
            let extra = r.evictions.len().saturating_sub(KEPT_EVICTIONS);
            r.evictions.drain(..extra);
        }
    }

    /// Sets the admission flags and logs conditions turning on or off.
    fn set_pressure(&self, conditions: &BTreeSet<Condition>) {
        let p = &self.ctx.pressure;
        for (c, flag) in [
            (Condition::Memory, &p.memory),
            (Condition::Disk, &p.disk),
            (Condition::Pid, &p.pid),
        ] {
            let on = conditions.contains(&c);
            if flag.swap(on, Ordering::Relaxed) != on {
                tracing::info!(
                    condition = c.name(),
                    status = on,
                    "eviction: node condition changed"
                );
            }
        }
    }

    /// One check: observe, decide, publish; evicts at most one pod, whose UID it returns.
    async fn check(&mut self) -> Option<String> {
        let observed = self.observe().await;
        let v = self
            .tracker
            .step(&self.thresholds, &observed, self.transition, Instant::now());
        self.set_pressure(&v.conditions);
        if let Ok(mut r) = self.shared.report.lock() {
            r.checks += 1;
            r.signals = signal_reports(&self.thresholds, &observed, &v);
            r.conditions = v.conditions.iter().map(|c| c.name()).collect();
            r.nodefs = observed.nodefs.clone();
            r.imagefs = observed.imagefs.clone();
        }
        if let Some(uid) = self.enforce_local_storage_limits().await {
            return Some(uid);
        }
        let t = to_reclaim(&self.thresholds, &v.actionable)?.clone();
        let mut obs = observed.signals.get(&t.signal).copied()?;
        if t.signal.condition() == Condition::Disk
            && crate::agent::gc::reclaim_disk(&self.ctx).await > 0
        {
            // Freed without evicting anyone: look again before choosing a victim.
            let again = self.observe().await;
            match again.signals.get(&t.signal).copied() {
                Some(o) if !t.met_by(&o) => {
                    tracing::info!(
                        signal = t.signal.name(),
                        available = o.available,
                        "eviction: node-level reclaim relieved the pressure; no pod evicted"
                    );
                    return None;
                }
                Some(o) => obs = o,
                None => {}
            }
        }
        tracing::info!(signal = t.signal.name(), threshold = %t.text, available = obs.available, "eviction: threshold met, attempting to reclaim {}", t.signal.resource());
        self.evict_one(&t, &obs, observed.dedicated_imagefs).await
    }

    /// Evicts (grace 0) every pod over an emptyDir sizeLimit or an ephemeral-storage limit;
    /// returns the first one's UID.
    async fn enforce_local_storage_limits(&self) -> Option<String> {
        let pods: Vec<Pod> = self
            .ctx
            .pods
            .list()
            .into_iter()
            .filter(|p| is_active(p, &self.ctx) && local::any_limits(std::slice::from_ref(p)))
            .collect();
        if pods.is_empty() {
            return None;
        }
        let usage = signals::pod_usage(&self.ctx, &pods).await;
        let pods_dir = self.ctx.pods_dir.clone();
        let checked = tokio::task::spawn_blocking(move || {
            pods.into_iter()
                .filter_map(|p| {
                    let uid = p.metadata.uid.clone()?;
                    let dirs = local::empty_dir_usage(&p, &pods_dir.join(&uid));
                    let u = usage.get(&uid).cloned().unwrap_or_default();
                    local::exceeded(&p, &u, &dirs).map(|e| (pod_ref(&p), e))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut first = None;
        for (pod, e) in checked {
            tracing::warn!(pod = %pod, message = %e.message, "eviction: local storage limit exceeded, evicting pod");
            self.record_eviction(pod, &e.uid, "ephemeral-storage", e.message, 0);
            first.get_or_insert(e.uid);
        }
        first
    }

    /// Evicts the first non-critical pod in the ranking for `t`.
    async fn evict_one(&self, t: &Threshold, obs: &Observation, dedicated: bool) -> Option<String> {
        let pods: Vec<Pod> = self
            .ctx
            .pods
            .list()
            .into_iter()
            .filter(|p| is_active(p, &self.ctx))
            .collect();
        if pods.is_empty() {
            tracing::debug!(
                signal = t.signal.name(),
                "eviction: threshold met, but no pods are active to evict"
            );
            return None;
        }
        let mut usage = signals::pod_usage(&self.ctx, &pods).await;
        let mut ranked: Vec<Candidate> = pods
            .into_iter()
            .map(|pod| {
                let u = pod.metadata.uid.as_ref().and_then(|uid| usage.remove(uid));
                Candidate { pod, usage: u }
            })
            .collect();
        rank(t.signal, dedicated, &mut ranked);
        let Some(c) = ranked.iter().find(|c| !terminate::is_critical(&c.pod)) else {
            tracing::debug!(
                signal = t.signal.name(),
                "eviction: unable to evict any pod (only critical pods run)"
            );
            return None;
        };
        let uid = c.pod.metadata.uid.clone()?;
        let pod = pod_ref(&c.pod);
        let msg = message(t, obs, &c.pod, c.usage.as_ref());
        let grace = grace_secs(
            t,
            &c.pod,
            self.ctx.config.eviction_max_pod_grace_period_secs,
        );
        tracing::warn!(pod = %pod, signal = t.signal.name(), grace_secs = grace, message = %msg, "eviction: evicting pod");
        self.record_eviction(pod, &uid, t.signal.name(), msg, grace);
        Some(uid)
    }
}

/// `namespace/name` of a pod, as logs and reports name it.
pub(crate) fn pod_ref(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether a pod may be evicted: it has a UID, has not ended and is not already being ended.
fn is_active(p: &Pod, ctx: &AgentContext) -> bool {
    let ended = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Failed" || ph == "Succeeded");
    let Some(uid) = p.metadata.uid.as_deref() else {
        return false;
    };
    !ended && !ctx.terminations.is_requested(uid)
}

/// Checks the signals every monitoring period, forever; after an eviction it waits for the pod
/// to end (at most 30 s) and checks again at once, as the kubelet does, so that pressure a
/// single eviction did not relieve is acted on without another period's wait.
pub async fn run(ctx: Arc<AgentContext>) {
    let cfg = ctx.config.clone();
    let period = Duration::from_secs_f64(cfg.eviction_monitoring_period_secs.max(0.05));
    let mut m = Manager {
        shared: ctx.eviction.clone(),
        thresholds: thresholds(&cfg),
        transition: Duration::from_secs_f64(cfg.eviction_pressure_transition_period_secs.max(0.0)),
        tracker: Tracker::default(),
        ctx,
    };
    loop {
        if let Some(uid) = m.check().await {
            let left = m
                .ctx
                .terminations
                .wait_done(std::slice::from_ref(&uid), POD_CLEANUP_TIMEOUT)
                .await;
            if !left.is_empty() {
                tracing::warn!(uid = %uid, "eviction: timed out waiting for the evicted pod to end");
            }
            continue;
        }
        tokio::time::sleep(period).await;
    }
}
