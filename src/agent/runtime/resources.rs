//! Resource quantities, QoS class and the CRI resources of a container.

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Parses a Kubernetes quantity (`100m`, `1.5`, `128Mi`, `1G`, `1e3`) into a number of base units.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 15] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (s, mult) in suffixes {
        if let Some(num) = q.strip_suffix(s) {
            return num.parse::<f64>().ok().map(|n| n * mult);
        }
    }
    q.parse::<f64>().ok().filter(|n| n.is_finite())
}

/// The quantity `key` of a requests or limits map, parsed (None when absent or malformed).
pub(crate) fn get(map: &Option<BTreeMap<String, Quantity>>, key: &str) -> Option<f64> {
    map.as_ref()?.get(key).and_then(|q| parse_quantity(&q.0))
}

/// A container's requests (defaulting to its limits, as the API server does) and limits.
pub struct Amounts {
    /// CPU request in cores.
    pub cpu_request: Option<f64>,
    /// Memory request in bytes.
    pub memory_request: Option<f64>,
    /// CPU limit in cores.
    pub cpu_limit: Option<f64>,
    /// Memory limit in bytes.
    pub memory_limit: Option<f64>,
}

/// The amounts a container asks for.
pub fn amounts(c: &Container) -> Amounts {
    let r = c.resources.clone().unwrap_or_default();
    let cpu_limit = get(&r.limits, "cpu");
    let memory_limit = get(&r.limits, "memory");
    Amounts {
        cpu_request: get(&r.requests, "cpu").or(cpu_limit),
        memory_request: get(&r.requests, "memory").or(memory_limit),
        cpu_limit,
        memory_limit,
    }
}

/// The pod's QoS class: Guaranteed, Burstable or BestEffort.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        let a = amounts(c);
        if a.cpu_request.is_some()
            || a.memory_request.is_some()
            || a.cpu_limit.is_some()
            || a.memory_limit.is_some()
        {
            any = true;
        }
        let full = a.cpu_limit.is_some()
            && a.memory_limit.is_some()
            && a.cpu_request == a.cpu_limit
            && a.memory_request == a.memory_limit;
        if !full {
            guaranteed = false;
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// oom_score_adj as the design says: -997 Guaranteed, 1000 BestEffort, Burstable in [3, 999]
/// by the share of the machine's memory the container requests.
pub fn oom_score_adj(qos: &str, memory_request: Option<f64>, memory_capacity: f64) -> i64 {
    match qos {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            let req = memory_request.unwrap_or(0.0);
            let adj = if memory_capacity > 0.0 {
                1000 - ((1000.0 * req) / memory_capacity) as i64
            } else {
                1000
            };
            adj.clamp(3, 999)
        }
    }
}

/// How containers may use the node's swap (the kubelet's `memorySwap.swapBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapBehavior {
    /// No container swaps.
    NoSwap,
    /// Burstable containers swap in proportion to their memory request.
    LimitedSwap,
}

impl SwapBehavior {
    /// The behaviour named in the config (`NoSwap` for anything but `LimitedSwap`).
    pub fn from_name(name: &str) -> Self {
        if name == "LimitedSwap" {
            Self::LimitedSwap
        } else {
            Self::NoSwap
        }
    }
}

/// The node's swap as container configs need it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeSwap {
    /// The configured behaviour.
    pub behavior: SwapBehavior,
    /// `SwapTotal` of the node in bytes.
    pub swap_capacity: u64,
    /// Whether the memory cgroup can limit swap (v1 `memory.memsw.*`, v2 `memory.swap.max`).
    pub controller: bool,
    /// Whether the node runs the unified cgroup v2 hierarchy only.
    pub cgroup_v2: bool,
}

/// The node's swap facts with the configured behaviour (read once, at agent start).
pub fn detect_node_swap(behavior: SwapBehavior) -> NodeSwap {
    node_swap_facts(behavior)
}

fn node_swap_facts(behavior: SwapBehavior) -> NodeSwap {
    let swap_capacity = proc_meminfo_bytes("SwapTotal").unwrap_or(0);
    NodeSwap {
        behavior,
        swap_capacity,
        controller: swap_controller_available(),
        cgroup_v2: cgroup_v2_unified(),
    }
}

/// A `/proc/meminfo` field (`SwapTotal:  1024 kB`) in bytes (None when absent, malformed or
/// too large for a u64).
pub fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// A field of this machine's `/proc/meminfo` in bytes (None when unreadable or absent).
pub fn proc_meminfo_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_bytes(&text, field)
}

/// Whether `/sys/fs/cgroup` is the unified cgroup v2 hierarchy (not v1 or hybrid).
fn cgroup_v2_unified() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Whether the memory cgroup of this node limits swap, as the kubelet checks it.
fn swap_controller_available() -> bool {
    let root = std::path::Path::new("/sys/fs/cgroup");
    if cgroup_v2_unified() {
        // cgroup v2: the root has no memory.swap.max; look at our own cgroup.
        std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| unified_cgroup(&t))
            .is_some_and(|p| root.join(p).join("memory.swap.max").exists())
    } else {
        root.join("memory/memory.memsw.limit_in_bytes").exists()
    }
}

/// The cgroup v2 path (`0::/a/b` → `a/b`) in `/proc/self/cgroup` text.
pub fn unified_cgroup(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().trim_start_matches('/').to_string())
}

/// The cgroup v2 file that bounds a container's swap (its value: bytes of swap, not memory+swap).
pub const SWAP_MAX_FILE: &str = "memory.swap.max";

/// What one container gets under the node's swap behaviour, as the kubelet decides it:
/// `LimitedSwap` only on cgroup v2 (v1 cannot bound swap apart from memory), never for a
/// critical pod, and only for Burstable containers that ask for memory and request less than
/// their limit; `NoSwap` for everything else.
pub fn container_swap_behavior(
    swap: &NodeSwap,
    critical: bool,
    qos: &str,
    memory_request: Option<f64>,
    memory_limit: Option<f64>,
) -> SwapBehavior {
    let asks_for_memory =
        memory_request.is_some_and(|r| r > 0.0) || memory_limit.is_some_and(|l| l > 0.0);
    let request_is_limit = memory_request.unwrap_or(0.0) == memory_limit.unwrap_or(0.0);
    if swap.behavior != SwapBehavior::LimitedSwap
        || !swap.controller
        || !swap.cgroup_v2
        || critical
        || qos != "Burstable"
        || !asks_for_memory
        || request_is_limit
    {
        return SwapBehavior::NoSwap;
    }
    SwapBehavior::LimitedSwap
}

/// Swap (bytes) a `LimitedSwap` container may use: `request / capacity × node swap`; `None`
/// when the request exceeds the node's memory or the capacity is unknown (no swap then).
pub fn swap_allowance(
    memory_request: f64,
    memory_capacity: f64,
    swap_capacity: u64,
) -> Option<i64> {
    if memory_capacity <= 0.0 || memory_request > memory_capacity {
        return None;
    }
    Some((memory_request.max(0.0) / memory_capacity * swap_capacity as f64) as i64)
}

/// Sets the swap fields of `r` (whose memory limit is already set) for container `c`: nothing
/// where the memory cgroup cannot limit swap; with `NoSwap`, memory+swap at the memory limit
/// on cgroup v1 (unset without a limit: there is nothing to bound it by) and
/// `memory.swap.max = 0` on v2; with `LimitedSwap` (v2 only), `memory.swap.max` = the
/// container's share of the node's swap.
pub fn apply_swap(
    r: &mut cri::LinuxContainerResources,
    c: &Container,
    critical: bool,
    qos: &str,
    memory_capacity: f64,
    swap: &NodeSwap,
) {
    if !swap.controller {
        return;
    }
    let a = amounts(c);
    let behavior = container_swap_behavior(swap, critical, qos, a.memory_request, a.memory_limit);
    let swap_bytes = match behavior {
        SwapBehavior::LimitedSwap => swap_allowance(
            a.memory_request.unwrap_or(0.0),
            memory_capacity,
            swap.swap_capacity,
        )
        .unwrap_or(0),
        SwapBehavior::NoSwap => 0,
    };
    if swap.cgroup_v2 {
        r.unified
            .insert(SWAP_MAX_FILE.to_string(), swap_bytes.to_string());
    } else if r.memory_limit_in_bytes > 0 {
        r.memory_swap_limit_in_bytes = r.memory_limit_in_bytes;
    }
}

/// CRI resources of a container: CPU shares/quota from requests/limits, memory and swap
/// limits, OOM score.
pub fn linux_resources(
    c: &Container,
    critical: bool,
    qos: &str,
    memory_capacity: f64,
    swap: &NodeSwap,
    oom_group: bool,
) -> cri::LinuxContainerResources {
    let a = amounts(c);
    let period = 100_000i64;
    let shares = match a.cpu_request {
        Some(cpu) => ((cpu * 1024.0) as i64).max(2),
        None => 2,
    };
    let quota = a
        .cpu_limit
        .map(|cpu| ((cpu * period as f64) as i64).max(1000))
        .unwrap_or(0);
    let mut r = cri::LinuxContainerResources {
        cpu_period: if quota > 0 { period } else { 0 },
        cpu_quota: quota,
        cpu_shares: shares,
        memory_limit_in_bytes: a.memory_limit.map(|m| m as i64).unwrap_or(0),
        oom_score_adj: oom_score_adj(qos, a.memory_request, memory_capacity),
        ..Default::default()
    };
    apply_swap(&mut r, c, critical, qos, memory_capacity, swap);
    if oom_group {
        // An OOM kill ends the whole container, not one of its processes, as the kubelet
        // asks on cgroup v2 since 1.32.
        r.unified
            .insert("memory.oom.group".to_string(), "1".to_string());
    }
    r
}

/// Whether `name` is an extended resource: one outside the `kubernetes.io` domain, with a
/// domain (`example.com/dongle`), not a quota's `requests.` name.
pub fn is_extended_resource(name: &str) -> bool {
    let Some((domain, _)) = name.split_once('/') else {
        return false;
    };
    let native = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    !native && !name.starts_with("requests.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100m"), Some(0.1));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("128Mi"), Some(128.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("x"), None);
    }

    #[test]
    fn qos_and_oom() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "a", "image": "i"}]
        }))
        .expect("spec");
        assert_eq!(qos_class(&spec), "BestEffort");
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "a", "image": "i",
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]
        }))
        .expect("spec");
        assert_eq!(qos_class(&spec), "Guaranteed");
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "a", "image": "i",
                "resources": {"requests": {"memory": "1Gi"}}}]
        }))
        .expect("spec");
        assert_eq!(qos_class(&spec), "Burstable");
        assert_eq!(oom_score_adj("Burstable", Some(0.0), 100.0), 999);
        assert_eq!(oom_score_adj("Burstable", Some(100.0), 100.0), 3);
        assert_eq!(oom_score_adj("Burstable", Some(50.0), 100.0), 500);
    }

    fn container(resources: serde_json::Value) -> Container {
        serde_json::from_value(serde_json::json!({
            "name": "c", "image": "i", "resources": resources
        }))
        .expect("container")
    }

    const GI: i64 = 1 << 30;

    fn node(behavior: SwapBehavior, cgroup_v2: bool) -> NodeSwap {
        NodeSwap {
            behavior,
            swap_capacity: 4 << 30,
            controller: true,
            cgroup_v2,
        }
    }

    /// The swap settings of a container alone in its pod, on a 16 GiB node: its QoS class,
    /// `memory_swap_limit_in_bytes` and the v2 `memory.swap.max` it asks for.
    fn swap_of(
        resources: serde_json::Value,
        critical: bool,
        swap: &NodeSwap,
    ) -> (&'static str, i64, Option<String>) {
        let c = container(resources);
        let spec = PodSpec {
            containers: vec![c.clone()],
            ..Default::default()
        };
        let qos = qos_class(&spec);
        let r = linux_resources(&c, critical, qos, (16 * GI) as f64, swap, false);
        (
            qos,
            r.memory_swap_limit_in_bytes,
            r.unified.get(SWAP_MAX_FILE).cloned(),
        )
    }

    fn guaranteed() -> serde_json::Value {
        serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}})
    }

    /// 2 GiB of the node's 16 requested, 3 GiB limit.
    fn burstable() -> serde_json::Value {
        serde_json::json!({"requests": {"memory": "2Gi"}, "limits": {"memory": "3Gi"}})
    }

    #[test]
    fn no_swap_on_v1_caps_memory_plus_swap_at_the_memory_limit() {
        let no = node(SwapBehavior::NoSwap, false);
        assert_eq!(swap_of(guaranteed(), false, &no), ("Guaranteed", GI, None));
        assert_eq!(
            swap_of(burstable(), false, &no),
            ("Burstable", 3 * GI, None)
        );
        // Without a memory limit there is nothing to cap memory+swap by (BestEffort has none).
        assert_eq!(
            swap_of(serde_json::json!({}), false, &no),
            ("BestEffort", 0, None)
        );
        let request_only = serde_json::json!({"requests": {"memory": "1Gi"}});
        assert_eq!(swap_of(request_only, false, &no), ("Burstable", 0, None));
    }

    #[test]
    fn no_swap_on_v2_sets_swap_max_to_zero_for_every_container() {
        let no = node(SwapBehavior::NoSwap, true);
        let zero = Some("0".to_string());
        assert_eq!(
            swap_of(guaranteed(), false, &no),
            ("Guaranteed", 0, zero.clone())
        );
        assert_eq!(
            swap_of(burstable(), false, &no),
            ("Burstable", 0, zero.clone())
        );
        assert_eq!(
            swap_of(serde_json::json!({}), false, &no),
            ("BestEffort", 0, zero)
        );
    }

    #[test]
    fn limited_swap_gives_burstable_containers_their_share_on_v2_only() {
        let limited = node(SwapBehavior::LimitedSwap, true);
        // 2 GiB of 16: an eighth of the node's 4 GiB of swap.
        let share = Some((GI / 2).to_string());
        assert_eq!(
            swap_of(burstable(), false, &limited),
            ("Burstable", 0, share)
        );
        let zero = Some("0".to_string());
        assert_eq!(swap_of(guaranteed(), false, &limited).2, zero);
        assert_eq!(swap_of(serde_json::json!({}), false, &limited).2, zero);
        // Critical pods never swap.
        assert_eq!(swap_of(burstable(), true, &limited).2, zero);
        // A memory request equal to the limit (or defaulted to it): nothing to swap.
        let cpu_only = serde_json::json!({"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}});
        assert_eq!(swap_of(cpu_only, false, &limited).2, zero);
        // A request above the node's memory: no swap rather than more than the node has.
        let huge =
            serde_json::json!({"requests": {"memory": "32Gi"}, "limits": {"memory": "64Gi"}});
        assert_eq!(swap_of(huge, false, &limited).2, zero);

        // cgroup v1 cannot bound swap apart from memory: LimitedSwap falls back to NoSwap.
        let v1 = node(SwapBehavior::LimitedSwap, false);
        assert_eq!(
            swap_of(burstable(), false, &v1),
            ("Burstable", 3 * GI, None)
        );

        // A cgroup that cannot limit swap gets no swap setting at all.
        let no_controller = NodeSwap {
            controller: false,
            ..limited
        };
        assert_eq!(
            swap_of(burstable(), false, &no_controller),
            ("Burstable", 0, None)
        );
        assert_eq!(
            container_swap_behavior(&no_controller, false, "Burstable", Some(1.0), Some(2.0)),
            SwapBehavior::NoSwap
        );
        assert_eq!(
            container_swap_behavior(&limited, false, "Burstable", Some(1.0), None),
            SwapBehavior::LimitedSwap
        );
        assert_eq!(
            swap_allowance(GI as f64, (16 * GI) as f64, 4 << 30),
            Some(GI / 4)
        );
        assert_eq!(swap_allowance(GI as f64, 0.0, 4 << 30), None);
    }

    #[test]
    fn reads_swap_facts() {
        let meminfo = "MemTotal:       16384 kB\nSwapTotal:       2048 kB\nSwapFree: 0 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "SwapTotal"), Some(2048 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "Swap"), None);
        assert_eq!(
            meminfo_bytes("MemTotal: 18446744073709551615 kB\n", "MemTotal"),
            None,
            "a size beyond u64 is refused, not wrapped"
        );
        assert_eq!(
            unified_cgroup("0::/system.slice/berthd.service\n").as_deref(),
            Some("system.slice/berthd.service")
        );
        assert_eq!(unified_cgroup("4:memory:/x\n"), None);
        assert_eq!(
            SwapBehavior::from_name("LimitedSwap"),
            SwapBehavior::LimitedSwap
        );
        assert_eq!(SwapBehavior::from_name("NoSwap"), SwapBehavior::NoSwap);
    }
}
