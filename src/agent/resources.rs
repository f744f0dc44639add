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

fn get(map: &Option<BTreeMap<String, Quantity>>, key: &str) -> Option<f64> {
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

/// CRI resources of a container: CPU shares/quota from requests/limits, memory limit, OOM score.
pub fn linux_resources(
    c: &Container,
    qos: &str,
    memory_capacity: f64,
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
    cri::LinuxContainerResources {
        cpu_period: if quota > 0 { period } else { 0 },
        cpu_quota: quota,
        cpu_shares: shares,
        memory_limit_in_bytes: a.memory_limit.map(|m| m as i64).unwrap_or(0),
        oom_score_adj: oom_score_adj(qos, a.memory_request, memory_capacity),
        ..Default::default()
    }
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
}
