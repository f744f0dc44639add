//! The kubelet's admission of a pod from the API server before it runs: its node name, node
//! selector and required node affinity against the Node's labels, NoExecute taints it does not
//! tolerate, host ports already taken, and requests that do not fit what is allocatable beside
//! the pods already admitted. A refused pod ends Failed with the kubelet's reason and message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint};

use crate::agent::runtime::resources::parse_quantity;

/// What admission knows of the node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Allocatable cpu (millicores), memory and ephemeral-storage (bytes), and pods.
    pub allocatable: BTreeMap<String, f64>,
}

/// Why a pod was refused: the kubelet's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub message: String,
}

fn refusal(predicate: &str, why: &str) -> Refusal {
    Refusal {
        reason: predicate.to_string(),
        message: format!("Predicate {predicate} failed: {why}"),
    }
}

/// Admits `pod` on `node` beside `others` (the pods admitted before it), or says why not.
pub fn admit(pod: &Pod, others: &[&Pod], node: &NodeView) -> Result<(), Refusal> {
    let spec = pod.spec.clone().unwrap_or_default();
    for (resource, unit) in [("cpu", 1000.0), ("memory", 1.0), ("ephemeral-storage", 1.0)] {
        let requested = requests(pod, resource) * unit;
        if requested <= 0.0 {
            continue;
        }
        let used: f64 = others.iter().map(|p| requests(p, resource) * unit).sum();
        let capacity = node.allocatable.get(resource).copied().unwrap_or(f64::MAX);
        if used + requested > capacity {
            return Err(Refusal {
                reason: format!("OutOf{resource}"),
                message: format!(
                    "Node didn't have enough resource: {resource}, requested: {}, used: {}, capacity: {}",
                    requested as i64, used as i64, capacity as i64
                ),
            });
        }
    }
    if let Some(&pods) = node.allocatable.get("pods")
        && (others.len() + 1) as f64 > pods
    {
        return Err(Refusal {
            reason: "OutOfpods".into(),
            message: format!(
                "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                others.len(),
                pods as i64
            ),
        });
    }
    if !matches_node(pod, node) {
        return Err(refusal(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name)
    {
        return Err(refusal(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    let taken: Vec<(String, String, i32)> = others.iter().flat_map(|p| host_ports(p)).collect();
    for (proto, ip, port) in host_ports(pod) {
        let clash = taken.iter().any(|(p2, ip2, port2)| {
            *p2 == proto && *port2 == port && (ip == "0.0.0.0" || *ip2 == "0.0.0.0" || *ip2 == ip)
        });
        if clash {
            return Err(refusal(
                "NodePorts",
                "node(s) didn't have free ports for the requested pod ports",
            ));
        }
    }
    if let Some(t) = untolerated_no_execute(pod, &node.taints) {
        return Err(Refusal {
            reason: "TaintToleration".into(),
            message: format!(
                "Predicate TaintToleration failed: node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or_default()
            ),
        });
    }
    Ok(())
}

/// The pod's request of `resource` (cpu in cores, others in bytes): the larger of its
/// containers' sum and its largest init container, plus its overhead.
pub fn requests(pod: &Pod, resource: &str) -> f64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0.0;
    };
    let of = |r: &Option<k8s_openapi::api::core::v1::ResourceRequirements>| {
        r.as_ref()
            .and_then(|r| {
                r.requests
                    .as_ref()
                    .and_then(|q| q.get(resource))
                    .or_else(|| r.limits.as_ref().and_then(|q| q.get(resource)))
            })
            .and_then(|q| parse_quantity(&q.0))
            .unwrap_or(0.0)
    };
    let sum: f64 = spec.containers.iter().map(|c| of(&c.resources)).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| of(&c.resources))
        .fold(0.0, f64::max);
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get(resource))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0.0);
    sum.max(init) + overhead
}

/// The pod's host ports: protocol, host IP (0.0.0.0 for any) and port.
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            Some((
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.host_ip
                    .clone()
                    .filter(|i| !i.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                port,
            ))
        })
        .collect()
}

/// Whether the pod's nodeSelector and required node affinity match the node.
fn matches_node(pod: &Pod, node: &NodeView) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice());
    let affinity_ok = match terms {
        None => true,
        Some(terms) => terms.iter().any(|t| term_matches(t, node)),
    };
    selector_ok && affinity_ok
}

fn term_matches(t: &NodeSelectorTerm, node: &NodeView) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing.
        return false;
    }
    let name_labels: BTreeMap<String, String> =
        [("metadata.name".to_string(), node.name.clone())].into();
    exprs.iter().all(|r| requirement(r, &node.labels))
        && fields.iter().all(|r| requirement(r, &name_labels))
}

fn requirement(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// A NoExecute taint of the node the pod does not tolerate (the only effect the kubelet
/// checks: NoSchedule is the scheduler's, and a pod bound by name has chosen the node).
fn untolerated_no_execute<'a>(pod: &Pod, taints: &'a [Taint]) -> Option<&'a Taint> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    taints.iter().filter(|t| t.effect == "NoExecute").find(|t| {
        !tolerations.iter().any(|tol| {
            let effect_ok = tol
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == t.effect);
            let key_ok = tol.key.as_deref().is_none_or(|k| k.is_empty())
                || tol.key.as_deref() == Some(t.key.as_str());
            let value_ok = match tol.operator.as_deref() {
                Some("Exists") => true,
                _ => {
                    tol.value.as_deref().unwrap_or_default()
                        == t.value.as_deref().unwrap_or_default()
                }
            };
            effect_ok && key_ok && value_ok
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    fn node() -> NodeView {
        NodeView {
            name: "n1".into(),
            labels: [
                ("zone".to_string(), "a".to_string()),
                ("gen".to_string(), "5".to_string()),
            ]
            .into(),
            taints: vec![Taint {
                key: "maint".into(),
                value: Some("yes".into()),
                effect: "NoExecute".into(),
                time_added: None,
            }],
            allocatable: [
                ("cpu".to_string(), 2000.0),
                ("memory".to_string(), 1e9),
                ("pods".to_string(), 3.0),
            ]
            .into(),
        }
    }

    const TOLERATE: &str = "maint";

    fn with_toleration(mut spec: serde_json::Value) -> serde_json::Value {
        spec["tolerations"] = serde_json::json!([{"key": TOLERATE, "operator": "Exists"}]);
        spec
    }

    #[test]
    fn refusals_carry_the_kubelets_reasons() {
        let n = node();
        let c =
            |cpu: &str| serde_json::json!({"name": "c", "resources": {"requests": {"cpu": cpu}}});
        let ok = pod(with_toleration(
            serde_json::json!({"containers": [c("500m")]}),
        ));
        assert_eq!(admit(&ok, &[], &n), Ok(()));
        let big = pod(with_toleration(
            serde_json::json!({"containers": [c("1800m")]}),
        ));
        let err = admit(&big, &[&ok], &n).expect_err("cpu");
        assert_eq!(err.reason, "OutOfcpu");
        assert!(
            err.message
                .contains("requested: 1800, used: 500, capacity: 2000"),
            "{}",
            err.message
        );
        assert_eq!(
            admit(&ok, &[&ok, &ok, &ok], &n).expect_err("pods").reason,
            "OutOfpods"
        );
        let sel = pod(with_toleration(
            serde_json::json!({"containers": [c("1m")], "nodeSelector": {"zone": "b"}}),
        ));
        assert_eq!(
            admit(&sel, &[], &n).expect_err("selector").reason,
            "NodeAffinity"
        );
        let aff = pod(with_toleration(
            serde_json::json!({"containers": [c("1m")], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["7"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]}}}}),
        ));
        assert_eq!(admit(&aff, &[], &n), Ok(()));
        let other = pod(with_toleration(
            serde_json::json!({"containers": [c("1m")], "nodeName": "n2"}),
        ));
        assert_eq!(admit(&other, &[], &n).expect_err("name").reason, "NodeName");
        let port = |ip: &str| {
            pod(with_toleration(
                serde_json::json!({"containers": [{"name": "c",
            "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]}]}),
            ))
        };
        assert_eq!(
            admit(&port(""), &[&port("10.0.0.1")], &n)
                .expect_err("port")
                .reason,
            "NodePorts"
        );
        assert_eq!(admit(&port("10.0.0.2"), &[&port("10.0.0.1")], &n), Ok(()));
        let untolerant = pod(serde_json::json!({"containers": [c("1m")]}));
        let err = admit(&untolerant, &[], &n).expect_err("taint");
        assert_eq!(err.reason, "TaintToleration");
        assert!(err.message.contains("maint"), "{}", err.message);
    }
}
