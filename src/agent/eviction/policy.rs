//! Eviction policy, as pure functions: thresholds and their soft-grace and transition state,
//! the kubelet's ranking of pods per signal, eviction messages and grace periods.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::signals::{Condition, Observation, Observed, PodUsage, Signal};
use crate::agent::config::{AgentConfig, ThresholdValue, threshold_value};
use crate::agent::pods::terminate;

/// Grace period of a pod evicted for a hard threshold (the kubelet's
/// immediateEvictionGracePeriodSeconds).
const IMMEDIATE_GRACE_SECS: i64 = 1;

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
    use crate::agent::runtime::resources::get;
    c.resources
        .as_ref()
        .and_then(|r| get(&r.requests, resource).or_else(|| get(&r.limits, resource)))
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
            crate::agent::eviction::signals::ContainerUsage {
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
        // Memory before disk, and the hard memory threshold before the soft one.
        assert_eq!(to_reclaim(&all, &[0, 1, 2]), Some(&all[2]));
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
