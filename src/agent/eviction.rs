//! The eviction manager: watches the node's eviction signals against hard and soft thresholds,
//! sets the pressure conditions and evicts pods in the kubelet's order.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::AgentContext;
use super::config::{AgentConfig, ThresholdValue, threshold_value};
use super::eviction_local as local;
use super::eviction_signals::{
    self as signals, Condition, Observation, Observed, PodUsage, Signal,
};
use super::terminate::{self, Termination};

/// How long the manager waits for an evicted pod to end (the kubelet's podCleanupTimeout).
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Grace period of a pod evicted for a hard threshold (the kubelet's
/// immediateEvictionGracePeriodSeconds).
const IMMEDIATE_GRACE_SECS: i64 = 1;
/// Evictions kept in the report.
const KEPT_EVICTIONS: usize = 20;

/// A configured threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// Its signal.
    pub signal: Signal,
    /// The configured value (quantity or percentage of capacity).
    pub value: ThresholdValue,
    /// The configured text (`100Mi`, `10%`).
    pub text: String,
    /// Grace period: None for a hard threshold.
    pub grace: Option<Duration>,
}

impl Threshold {
    /// Whether it is a hard threshold.
    pub fn is_hard(&self) -> bool {
        self.grace.is_none()
    }

    /// The amount it stands for, given the signal's capacity.
    pub fn quantity(&self, capacity: u64) -> u64 {
        self.value.amount(capacity)
    }

    /// Whether `obs` crosses it (available below the amount).
    pub fn met_by(&self, obs: &Observation) -> bool {
        obs.available < self.quantity(obs.capacity)
    }
}

/// The thresholds of the configuration: hard ones, then soft ones with their grace periods.
pub fn thresholds(cfg: &AgentConfig) -> Vec<Threshold> {
    let hard = cfg.eviction_hard.iter().map(|(k, v)| (k, v, None));
    let soft = cfg.eviction_soft.iter().map(|(k, v)| {
        let grace = cfg
            .eviction_soft_grace_period_secs
            .get(k)
            .copied()
            .unwrap_or(0.0);
        (k, v, Some(Duration::from_secs_f64(grace.max(0.0))))
    });
    hard.chain(soft)
        .filter_map(|(signal, text, grace)| {
            let parsed = Signal::parse(signal).zip(threshold_value(text).ok());
            if parsed.is_none() {
                tracing::warn!(signal = %signal, value = %text, "eviction: threshold ignored");
            }
            let (signal, value) = parsed?;
            Some(Threshold {
                signal,
                value,
                text: text.clone(),
                grace,
            })
        })
        .collect()
}

/// What one check decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Indexes of the thresholds crossed now (grace periods aside).
    pub met: Vec<usize>,
    /// Indexes of those crossed for at least their grace period: evictions are due.
    pub actionable: Vec<usize>,
    /// The pressure conditions on (crossed now, or within the transition period).
    pub conditions: BTreeSet<Condition>,
}

/// The state kept between checks: when each threshold was first seen crossed (without a break)
/// and when each condition was last seen.
#[derive(Debug, Default)]
pub struct Tracker {
    first_met: HashMap<usize, Instant>,
    condition_seen: HashMap<Condition, Instant>,
}

impl Tracker {
    /// One check at `now` (passed in, so tests can run a clock of their own).
    pub fn step(
        &mut self,
        thresholds: &[Threshold],
        observed: &Observed,
        transition: Duration,
        now: Instant,
    ) -> Verdict {
        let met: Vec<usize> = thresholds
            .iter()
            .enumerate()
            .filter(|(_, t)| observed.signals.get(&t.signal).is_some_and(|o| t.met_by(o)))
            .map(|(i, _)| i)
            .collect();
        self.first_met.retain(|i, _| met.contains(i));
        for &i in &met {
            self.first_met.entry(i).or_insert(now);
            self.condition_seen
                .insert(thresholds[i].signal.condition(), now);
        }
        let actionable = met
            .iter()
            .copied()
            .filter(|i| {
                let grace = thresholds[*i].grace.unwrap_or(Duration::ZERO);
                self.first_met
                    .get(i)
                    .is_some_and(|first| now.saturating_duration_since(*first) >= grace)
            })
            .collect();
        // A condition seen now is on; one seen within the transition period stays on.
        let conditions = self
            .condition_seen
            .iter()
            .filter(|(_, seen)| **seen == now || now.saturating_duration_since(**seen) < transition)
            .map(|(c, _)| *c)
            .collect();
        Verdict {
            met,
            actionable,
            conditions,
        }
    }
}

/// The threshold to reclaim for first among `actionable`: memory first (the kubelet's order),
/// then by signal, a hard threshold before a soft one.
pub fn to_reclaim<'a>(thresholds: &'a [Threshold], actionable: &[usize]) -> Option<&'a Threshold> {
    actionable
        .iter()
        .filter_map(|i| thresholds.get(*i))
        .min_by_key(|t| (t.signal, !t.is_hard()))
}

/// A request of a container for `resource` (bytes), defaulting to its limit as the API server
/// does; 0 when none.
fn container_request(c: &k8s_openapi::api::core::v1::Container, resource: &str) -> u64 {
    let r = c.resources.as_ref();
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        m.and_then(|m| m.get(resource))
            .and_then(|q| super::resources::parse_quantity(&q.0))
    };
    get(r.and_then(|r| r.requests.as_ref()))
        .or_else(|| get(r.and_then(|r| r.limits.as_ref())))
        .map_or(0, |v| v.max(0.0) as u64)
}

/// A pod's request of `resource`: its containers' sum, or its largest init container's when larger.
pub fn pod_request(pod: &Pod, resource: &str) -> u64 {
    let Some(spec) = &pod.spec else { return 0 };
    let sum: u64 = spec
        .containers
        .iter()
        .map(|c| container_request(c, resource))
        .sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_request(c, resource))
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// A pod's usage of what `signal` measures (None: no stats). With a dedicated imagefs, nodefs
/// counts logs and pod directories and imagefs the writable layers; on one filesystem, all.
pub fn usage_of(signal: Signal, dedicated_imagefs: bool, u: &PodUsage) -> u64 {
    let pick = |(bytes, inodes): (u64, u64)| {
        if signal.is_bytes() { bytes } else { inodes }
    };
    let node = pick(u.logs) + pick(u.volumes);
    let image = pick(u.rootfs);
    match signal {
        Signal::MemoryAvailable => u.memory.unwrap_or(0),
        Signal::PidAvailable => u.processes,
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree if dedicated_imagefs => node,
        Signal::ImageFsAvailable | Signal::ImageFsInodesFree if dedicated_imagefs => image,
        _ => node + image,
    }
}

/// A pod to rank with its usage.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The pod.
    pub pod: Pod,
    /// Its usage (None: the runtime had no stats for it).
    pub usage: Option<PodUsage>,
}

/// Orders `pods` for eviction under `signal`, the first to evict first (the kubelet's ranking):
/// memory and disk: pods using more than they request, then lower priority, then larger usage
/// above request; pids: lower priority, then more processes. Pods without stats come first.
pub fn rank(signal: Signal, dedicated_imagefs: bool, pods: &mut [Candidate]) {
    let request_of = |pod: &Pod| match signal.resource() {
        "memory" | "ephemeral-storage" => pod_request(pod, signal.resource()),
        _ => 0,
    };
    pods.sort_by_cached_key(|c| {
        let found = c.usage.is_some();
        let usage = c
            .usage
            .as_ref()
            .map_or(0, |u| usage_of(signal, dedicated_imagefs, u));
        let request = request_of(&c.pod);
        let priority = terminate::priority(&c.pod);
        let exceeds = !found || usage > request;
        let above = i128::from(usage) - i128::from(request);
        match signal {
            Signal::PidAvailable => (found, false, priority, std::cmp::Reverse(i128::from(usage))),
            _ => (found, !exceeds, priority, std::cmp::Reverse(above)),
        }
    });
}

/// A quantity of bytes as Kubernetes prints one (`100Mi`, `1536Ki`, `1000`).
pub fn format_bytes(v: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    if v == 0 {
        return "0".into();
    }
    for (i, s) in SUFFIXES.iter().enumerate() {
        let unit = 1u64 << (10 * (6 - i));
        if v.is_multiple_of(unit) {
            return format!("{}{s}", v / unit);
        }
    }
    v.to_string()
}

/// A count as Kubernetes prints one (`5k`, `1234`).
pub fn format_count(v: u64) -> String {
    const SUFFIXES: [(&str, u64); 6] = [
        ("E", 1_000_000_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("T", 1_000_000_000_000),
        ("G", 1_000_000_000),
        ("M", 1_000_000),
        ("k", 1_000),
    ];
    if v == 0 {
        return "0".into();
    }
    SUFFIXES
        .iter()
        .find(|(_, unit)| v.is_multiple_of(*unit))
        .map_or_else(|| v.to_string(), |(s, unit)| format!("{}{s}", v / unit))
}

fn format_amount(signal: Signal, v: u64) -> String {
    if signal.is_bytes() {
        format_bytes(v)
    } else {
        format_count(v)
    }
}

/// The eviction message (the kubelet's wording): the resource, the threshold and what was left,
/// then each container using more than it requests of memory or ephemeral storage.
pub fn message(t: &Threshold, obs: &Observation, pod: &Pod, usage: Option<&PodUsage>) -> String {
    let resource = t.signal.resource();
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. ",
        format_amount(t.signal, t.quantity(obs.capacity)),
        format_amount(t.signal, obs.available)
    );
    let (Some(usage), Some(spec)) = (usage, &pod.spec) else {
        return m;
    };
    if !t.signal.is_bytes() {
        return m;
    }
    for c in &spec.containers {
        let Some(cu) = usage.containers.get(&c.name) else {
            continue;
        };
        let used = match resource {
            "memory" => cu.memory.unwrap_or(0),
            _ => cu.rootfs + cu.logs,
        };
        let request = container_request(c, resource);
        if used > request {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                format_bytes(used),
                format_bytes(request)
            ));
        }
    }
    m
}

/// The grace period of an eviction: 1 s for a hard threshold; for a soft one the pod's own,
/// capped at `eviction_max_pod_grace_period_secs`.
pub fn grace_secs(t: &Threshold, pod: &Pod, max_pod_grace: i64) -> i64 {
    if t.is_hard() {
        return IMMEDIATE_GRACE_SECS;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    own.min(max_pod_grace).max(0)
}

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
        let imagefs = match self
            .ctx
            .client
            .images()
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await
        {
            Ok(r) => r
                .into_inner()
                .image_filesystems
                .into_iter()
                .find_map(|f| f.fs_id.map(|id| id.mountpoint))
                .filter(|m| !m.is_empty())
                .map(std::path::PathBuf::from),
            Err(e) => {
                tracing::debug!(error = %e.message(), "eviction: CRI ImageFsInfo failed; no imagefs signals");
                None
            }
        };
        signals::Sources {
            nodefs: vec![self.ctx.pods_dir.clone(), self.ctx.pod_log_dir.clone()],
            imagefs,
            memory_capacity: self.ctx.node.memory_bytes,
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
        let sources = self.sources().await;
        let observed = tokio::task::spawn_blocking(move || signals::observe(&sources))
            .await
            .unwrap_or_default();
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
        if t.signal.condition() == Condition::Disk && super::gc::reclaim_disk(&self.ctx).await > 0 {
            // Freed without evicting anyone: look again before choosing a victim.
            let sources = self.sources().await;
            let again = tokio::task::spawn_blocking(move || signals::observe(&sources))
                .await
                .unwrap_or_default();
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
            self.ctx.terminations.request(
                &e.uid,
                Termination {
                    reason: "Evicted".into(),
                    message: e.message.clone(),
                    grace_secs: Some(0),
                },
            );
            if let Ok(mut r) = self.shared.report.lock() {
                r.evictions.push(EvictionRecord {
                    pod,
                    uid: e.uid.clone(),
                    signal: "ephemeral-storage",
                    message: e.message,
                    grace_secs: 0,
                });
                let extra = r.evictions.len().saturating_sub(KEPT_EVICTIONS);
                r.evictions.drain(..extra);
            }
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
        self.ctx.terminations.request(
            &uid,
            Termination {
                reason: "Evicted".into(),
                message: msg.clone(),
                grace_secs: Some(grace),
            },
        );
        if let Ok(mut r) = self.shared.report.lock() {
            r.evictions.push(EvictionRecord {
                pod,
                uid: uid.clone(),
                signal: t.signal.name(),
                message: msg,
                grace_secs: grace,
            });
            let extra = r.evictions.len().saturating_sub(KEPT_EVICTIONS);
            r.evictions.drain(..extra);
        }
        Some(uid)
    }
}

fn pod_ref(p: &Pod) -> String {
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
/// to end (at most 30 s) before the next period.
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
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>, requests: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {
                "priority": priority,
                "terminationGracePeriodSeconds": 20,
                "containers": [{"name": "main", "image": "i", "resources": {"requests": requests}}]
            }
        }))
        .expect("pod")
    }

    fn usage(memory: u64, disk: u64, processes: u64) -> PodUsage {
        let mut u = PodUsage {
            memory: Some(memory),
            logs: (disk, 1),
            processes,
            ..Default::default()
        };
        u.containers.insert(
            "main".into(),
            signals::ContainerUsage {
                memory: Some(memory),
                rootfs: 0,
                logs: disk,
            },
        );
        u
    }

    fn names(c: &[Candidate]) -> Vec<String> {
        c.iter()
            .map(|c| c.pod.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn threshold(signal: Signal, text: &str, grace: Option<u64>) -> Threshold {
        Threshold {
            signal,
            value: threshold_value(text).expect("value"),
            text: text.into(),
            grace: grace.map(Duration::from_secs),
        }
    }

    fn observed(signal: Signal, available: u64, capacity: u64) -> Observed {
        let mut o = Observed::default();
        o.signals.insert(
            signal,
            Observation {
                available,
                capacity,
            },
        );
        o
    }

    #[test]
    fn memory_ranking_is_over_request_then_priority_then_usage_above_request() {
        let mi = 1u64 << 20;
        let mut c = vec![
            // Within its request: last, though its priority is the lowest.
            Candidate {
                pod: pod("within", Some(-10), serde_json::json!({"memory": "100Mi"})),
                usage: Some(usage(50 * mi, 0, 1)),
            },
            Candidate {
                pod: pod("high", Some(100), serde_json::json!({})),
                usage: Some(usage(500 * mi, 0, 1)),
            },
            Candidate {
                pod: pod("small", None, serde_json::json!({"memory": "10Mi"})),
                usage: Some(usage(20 * mi, 0, 1)),
            },
            Candidate {
                pod: pod("big", None, serde_json::json!({})),
                usage: Some(usage(30 * mi, 0, 1)),
            },
            Candidate {
                pod: pod("nostats", Some(1000), serde_json::json!({})),
                usage: None,
            },
        ];
        rank(Signal::MemoryAvailable, false, &mut c);
        assert_eq!(names(&c), ["nostats", "big", "small", "high", "within"]);
    }

    #[test]
    fn disk_ranking_uses_ephemeral_storage_and_pid_ranking_uses_processes() {
        let mut c = vec![
            Candidate {
                pod: pod(
                    "burstable",
                    None,
                    serde_json::json!({"ephemeral-storage": "1Gi"}),
                ),
                usage: Some(usage(0, 5 << 20, 9)),
            },
            Candidate {
                pod: pod("besteffort", None, serde_json::json!({})),
                usage: Some(usage(0, 4096, 2)),
            },
        ];
        rank(Signal::NodeFsAvailable, false, &mut c);
        assert_eq!(names(&c), ["besteffort", "burstable"]);
        rank(Signal::PidAvailable, false, &mut c);
        assert_eq!(names(&c), ["burstable", "besteffort"]);
        // With a dedicated imagefs, imagefs counts writable layers only (none here): nobody
        // exceeds, and usage above request puts the pod without a request first.
        rank(Signal::ImageFsAvailable, true, &mut c);
        assert_eq!(names(&c), ["besteffort", "burstable"]);
    }

    #[test]
    fn hard_thresholds_act_at_once_soft_ones_after_their_grace_period() {
        let ts = vec![
            threshold(Signal::MemoryAvailable, "100Mi", None),
            threshold(Signal::NodeFsAvailable, "10%", Some(30)),
        ];
        let transition = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut tr = Tracker::default();
        // Memory crossed: condition and eviction at once.
        let v = tr.step(
            &ts,
            &observed(Signal::MemoryAvailable, 50 << 20, 1 << 30),
            transition,
            t0,
        );
        assert_eq!(v.met, [0]);
        assert_eq!(v.actionable, [0]);
        assert!(v.conditions.contains(&Condition::Memory));
        // nodefs crossed (9 % left): the condition at once, evictions only after 30 s.
        let low = observed(Signal::NodeFsAvailable, 9, 100);
        let v = tr.step(&ts, &low, transition, t0 + Duration::from_secs(1));
        assert_eq!((v.met.clone(), v.actionable.clone()), (vec![1], vec![]));
        assert!(v.conditions.contains(&Condition::Disk));
        let v = tr.step(&ts, &low, transition, t0 + Duration::from_secs(30));
        assert!(v.actionable.is_empty());
        let v = tr.step(&ts, &low, transition, t0 + Duration::from_secs(31));
        assert_eq!(v.actionable, [1]);
        // A break starts the grace period over.
        let ok = observed(Signal::NodeFsAvailable, 50, 100);
        tr.step(&ts, &ok, transition, t0 + Duration::from_secs(32));
        let v = tr.step(&ts, &low, transition, t0 + Duration::from_secs(40));
        assert!(v.actionable.is_empty());
    }

    #[test]
    fn conditions_stay_on_for_the_transition_period() {
        let ts = vec![threshold(Signal::PidAvailable, "100", None)];
        let transition = Duration::from_secs(300);
        let t0 = Instant::now();
        let mut tr = Tracker::default();
        let v = tr.step(
            &ts,
            &observed(Signal::PidAvailable, 10, 1000),
            transition,
            t0,
        );
        assert!(v.conditions.contains(&Condition::Pid));
        let fine = observed(Signal::PidAvailable, 900, 1000);
        let v = tr.step(&ts, &fine, transition, t0 + Duration::from_secs(299));
        assert!(v.conditions.contains(&Condition::Pid) && v.met.is_empty());
        let v = tr.step(&ts, &fine, transition, t0 + Duration::from_secs(300));
        assert!(v.conditions.is_empty());
        // A zero transition period still shows a condition while its threshold is crossed.
        let mut tr = Tracker::default();
        let v = tr.step(
            &ts,
            &observed(Signal::PidAvailable, 10, 1000),
            Duration::ZERO,
            t0,
        );
        assert!(v.conditions.contains(&Condition::Pid));
        // A signal that could not be read crosses nothing.
        let v = tr.step(
            &ts,
            &Observed::default(),
            Duration::ZERO,
            t0 + Duration::from_secs(1),
        );
        assert!(v.met.is_empty() && v.conditions.is_empty());
    }

    #[test]
    fn threshold_amounts_order_and_grace() {
        let cfg = AgentConfig::default();
        let ts = thresholds(&cfg);
        let mem = ts
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .expect("memory threshold");
        assert_eq!(mem.quantity(1 << 40), 100 << 20);
        let nodefs = threshold(Signal::NodeFsAvailable, "10%", None);
        assert_eq!(nodefs.quantity(1000), 100);
        assert!(nodefs.met_by(&Observation {
            available: 99,
            capacity: 1000
        }));
        assert!(!nodefs.met_by(&Observation {
            available: 100,
            capacity: 1000
        }));
        let soft_mem = threshold(Signal::MemoryAvailable, "1Gi", Some(10));
        let hard_disk = threshold(Signal::NodeFsAvailable, "1Gi", None);
        let hard_mem = threshold(Signal::MemoryAvailable, "1Gi", None);
        let all = vec![hard_disk, soft_mem.clone(), hard_mem];
        assert_eq!(
            to_reclaim(&all, &[0, 1, 2]).map(|t| t.is_hard()),
            Some(true)
        );
        assert_eq!(to_reclaim(&all, &[0, 1]), Some(&soft_mem));
        let p = pod("p", None, serde_json::json!({}));
        assert_eq!(grace_secs(&all[0], &p, 10), 1);
        assert_eq!(grace_secs(&soft_mem, &p, 10), 10);
        assert_eq!(grace_secs(&soft_mem, &p, 60), 20);
    }

    #[test]
    fn messages_name_the_resource_and_the_containers_over_request() {
        let t = threshold(Signal::MemoryAvailable, "100Mi", None);
        let obs = Observation {
            available: 50 << 20,
            capacity: 1 << 30,
        };
        let p = pod("p", None, serde_json::json!({}));
        assert_eq!(
            message(&t, &obs, &p, Some(&usage(20 << 20, 0, 1))),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container main was using 20Mi, request is 0, has larger consumption of memory. "
        );
        let t = threshold(Signal::NodeFsInodesFree, "5%", None);
        let obs = Observation {
            available: 1234,
            capacity: 100_000,
        };
        assert_eq!(
            message(&t, &obs, &p, None),
            "The node was low on resource: inodes. Threshold quantity: 5k, available: 1234. "
        );
        assert_eq!(format_bytes(1536 << 10), "1536Ki");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
    }
}
