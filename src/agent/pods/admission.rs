//! The kubelet's admission of a pod from the API server before it runs: its node name, node
//! selector and required node affinity against the Node's labels, NoExecute taints it does not
//! tolerate, host ports already taken, and requests that do not fit what is allocatable beside
//! the pods already admitted. A refused pod ends Failed with the kubelet's reason and message.
//!
//! Every pod, static ones included, also passes the kubelet's sysctl allowlist first: each of
//! `spec.securityContext.sysctls` must be one of the kubelet's safe sysctls or match
//! `agent.allowed_unsafe_sysctls`, and must not belong to a namespace the pod shares with the
//! host (a `net.*` sysctl with hostNetwork, an IPC one with hostIPC).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint};

use crate::agent::runtime::resources::{is_extended_resource, parse_quantity};

/// What admission knows of the node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Allocatable cpu (millicores), memory and ephemeral-storage (bytes), pods, and the
    /// node's extended resources.
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
    // The node's extended resources are checked too; one the node does not have is left to
    // whatever scheduled the pod (a scheduler extender's), as the kubelet does.
    let extended = node
        .allocatable
        .keys()
        .filter(|k| is_extended_resource(k))
        .map(|k| (k.as_str(), 1.0));
    let resources = [("cpu", 1000.0), ("memory", 1.0), ("ephemeral-storage", 1.0)];
    for (resource, unit) in resources.into_iter().chain(extended) {
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

/// The kubelet's reason for a pod refused for its sysctls.
pub const SYSCTL_FORBIDDEN: &str = "SysctlForbidden";

/// The kubelet's safe sysctls: namespaced, and without effect on other pods of the node. Each
/// with the kernel release (major, minor) from which the kernel namespaces it.
const SAFE_SYSCTLS: [(&str, (u32, u32)); 12] = [
    ("kernel.shm_rmid_forced", (0, 0)),
    ("net.ipv4.ip_local_port_range", (0, 0)),
    ("net.ipv4.tcp_syncookies", (0, 0)),
    ("net.ipv4.ping_group_range", (0, 0)),
    ("net.ipv4.ip_unprivileged_port_start", (0, 0)),
    ("net.ipv4.ip_local_reserved_ports", (3, 16)),
    ("net.ipv4.tcp_keepalive_time", (4, 5)),
    ("net.ipv4.tcp_fin_timeout", (4, 6)),
    ("net.ipv4.tcp_keepalive_intvl", (4, 5)),
    ("net.ipv4.tcp_keepalive_probes", (4, 5)),
    ("net.ipv4.tcp_rmem", (4, 15)),
    ("net.ipv4.tcp_wmem", (4, 15)),
];

/// Longest sysctl name or pattern the API accepts.
const SYSCTL_MAX_LENGTH: usize = 253;

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlNamespace {
    /// The IPC namespace (`kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`).
    Ipc,
    /// The network namespace (`net.*`).
    Net,
}

impl fmt::Display for SysctlNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipc => "ipc",
            Self::Net => "net",
        })
    }
}

/// The namespace of the sysctl (or sysctl prefix) `name` in dotted form, if the kernel
/// namespaces it.
pub fn sysctl_namespace(name: &str) -> Option<SysctlNamespace> {
    if name == "kernel.sem"
        || ["kernel.shm", "kernel.msg", "fs.mqueue."]
            .iter()
            .any(|p| name.starts_with(p))
    {
        Some(SysctlNamespace::Ipc)
    } else if name.starts_with("net.") {
        Some(SysctlNamespace::Net)
    } else {
        None
    }
}

/// `name` in dotted form: a name whose first separator is `/` (`net/ipv4/tcp_rmem`) has its
/// slashes and dots swapped, as the kubelet reads it (a dot inside a segment, such as an
/// interface `eth0.100`, becomes a slash).
pub fn dotted_sysctl(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// Whether `name` is a sysctl name as the API accepts it: segments of lower-case letters,
/// digits, `-` and `_` that start and end with a letter or digit, separated by `.` or `/`;
/// with `pattern`, a trailing `*` is allowed too.
fn valid_sysctl(name: &str, pattern: bool) -> bool {
    let body = match name.strip_suffix('*') {
        Some(b) if pattern => b,
        _ => name,
    };
    let segment_ok = |s: &str| {
        let b = s.as_bytes();
        match (b.first(), b.last()) {
            (Some(f), Some(l)) => {
                (f.is_ascii_lowercase() || f.is_ascii_digit())
                    && (l.is_ascii_lowercase() || l.is_ascii_digit())
                    && b.iter().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_')
                    })
            }
            _ => false,
        }
    };
    if name.len() > SYSCTL_MAX_LENGTH || body.is_empty() {
        return false;
    }
    // A pattern's prefix may end on a separator (`net.ipv4.*`).
    let body = if pattern && body.len() < name.len() {
        body.strip_suffix(['.', '/']).unwrap_or(body)
    } else {
        body
    };
    body.split(['.', '/']).all(segment_ok)
}

/// The sysctls a pod may set: the kubelet's safe ones and the node's allowed unsafe ones,
/// names and prefixes, each with its namespace.
#[derive(Debug, Clone, Default)]
pub struct SysctlAllowlist {
    names: BTreeMap<String, SysctlNamespace>,
    prefixes: Vec<(String, SysctlNamespace)>,
}

impl SysctlAllowlist {
    /// The safe sysctls the running kernel namespaces, and `allowed_unsafe`.
    pub fn for_this_kernel(allowed_unsafe: &[String]) -> Result<Self, String> {
        Self::new(allowed_unsafe, kernel_release())
    }

    /// The safe sysctls `kernel` (major, minor; None: unknown) namespaces, and
    /// `allowed_unsafe`: names or prefixes ending in `*`, in dotted or slash form, each of a
    /// namespaced sysctl.
    pub fn new(allowed_unsafe: &[String], kernel: Option<(u32, u32)>) -> Result<Self, String> {
        let mut list = Self::default();
        for (name, since) in SAFE_SYSCTLS {
            let available = since == (0, 0) || kernel.is_some_and(|k| k >= since);
            if let (true, Some(ns)) = (available, sysctl_namespace(name)) {
                list.names.insert(name.to_string(), ns);
            }
        }
        for pattern in allowed_unsafe {
            if !valid_sysctl(pattern, true) {
                return Err(format!(
                    "sysctl {pattern:?} must have at most {SYSCTL_MAX_LENGTH} characters, be segments of a-z, 0-9, '-' and '_' separated by '.' or '/', and may end in '*'"
                ));
            }
            let dotted = dotted_sysctl(pattern);
            match dotted.strip_suffix('*') {
                Some(prefix) => {
                    let ns = sysctl_namespace(prefix).ok_or_else(|| {
                        format!("the sysctls {dotted:?} are not known to be namespaced")
                    })?;
                    list.prefixes.push((prefix.to_string(), ns));
                }
                None => {
                    let ns = sysctl_namespace(&dotted).ok_or_else(|| {
                        format!("the sysctl {dotted:?} is not known to be namespaced")
                    })?;
                    list.names.insert(dotted, ns);
                }
            }
        }
        Ok(list)
    }

    /// Why the pod may not set sysctl `name` (as the kubelet words it), if it may not.
    fn check(&self, name: &str, host_network: bool, host_ipc: bool) -> Result<(), String> {
        let dotted = dotted_sysctl(name);
        if !valid_sysctl(name, false) {
            return Err(format!("{dotted:?} not allowlisted"));
        }
        let ns = self.names.get(&dotted).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| dotted.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            None => Err(format!("{dotted:?} not allowlisted")),
            Some(ns @ SysctlNamespace::Ipc) if host_ipc => {
                Err(format!("{dotted:?} not allowed with host {ns} enabled"))
            }
            Some(ns @ SysctlNamespace::Net) if host_network => {
                Err(format!("{dotted:?} not allowed with host {ns} enabled"))
            }
            Some(_) => Ok(()),
        }
    }
}

/// The running kernel's release as (major, minor), if it reads as one.
fn kernel_release() -> Option<(u32, u32)> {
    let uname = rustix::system::uname();
    let release = uname.release().to_str().ok()?;
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Admits `pod`'s sysctls against `allowlist`, or says why not (the kubelet's
/// `SysctlForbidden`, naming the first sysctl refused).
pub fn admit_sysctls(pod: &Pod, allowlist: &SysctlAllowlist) -> Result<(), Refusal> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_deref())
        .unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let host_ipc = spec.host_ipc.unwrap_or(false);
    for s in sysctls {
        allowlist
            .check(&s.name, host_network, host_ipc)
            .map_err(|why| Refusal {
                reason: SYSCTL_FORBIDDEN.to_string(),
                message: format!("forbidden sysctl: {why}"),
            })?;
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

    #[test]
    fn extended_resources_are_checked_when_the_node_has_them() {
        let mut n = node();
        let wants = |count: &str| {
            pod(with_toleration(
                serde_json::json!({"containers": [{"name": "c",
                "resources": {"requests": {"example.com/dongle": count},
                              "limits": {"example.com/dongle": count}}}]}),
            ))
        };
        // A resource the node does not have is another scheduler's business.
        assert_eq!(admit(&wants("3"), &[], &n), Ok(()));
        n.allocatable.insert("example.com/dongle".into(), 5.0);
        assert_eq!(admit(&wants("3"), &[&wants("2")], &n), Ok(()));
        let err = admit(&wants("3"), &[&wants("3")], &n).expect_err("dongle");
        assert_eq!(err.reason, "OutOfexample.com/dongle");
        assert!(
            err.message
                .contains("example.com/dongle, requested: 3, used: 3, capacity: 5"),
            "{}",
            err.message
        );
    }

    fn sysctl_pod(names: &[&str], extra: serde_json::Value) -> Pod {
        let mut spec = serde_json::json!({"containers": [{"name": "c"}], "securityContext": {
            "sysctls": names.iter().map(|n| serde_json::json!({"name": n, "value": "1"}))
                .collect::<Vec<_>>()}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        pod(spec)
    }

    fn safe_only() -> SysctlAllowlist {
        SysctlAllowlist::new(&[], Some((6, 1))).expect("allowlist")
    }

    #[test]
    fn safe_sysctls_pass_and_others_are_refused_as_the_kubelet_does() {
        let list = safe_only();
        let none = serde_json::json!({});
        for safe in [
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_syncookies",
            "net.ipv4.ping_group_range",
            "net.ipv4.ip_unprivileged_port_start",
            "net.ipv4.ip_local_reserved_ports",
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
            "net.ipv4.tcp_rmem",
            "net.ipv4.tcp_wmem",
            // The slash form reads as the dotted one.
            "net/ipv4/ip_unprivileged_port_start",
        ] {
            assert_eq!(
                admit_sysctls(&sysctl_pod(&[safe], none.clone()), &list),
                Ok(()),
                "{safe}"
            );
        }
        assert_eq!(
            admit_sysctls(&pod(serde_json::json!({"containers": []})), &list),
            Ok(())
        );
        let err = admit_sysctls(
            &sysctl_pod(&["net.ipv4.tcp_syncookies", "kernel.msgmax"], none.clone()),
            &list,
        )
        .expect_err("unsafe");
        assert_eq!(
            err,
            Refusal {
                reason: "SysctlForbidden".into(),
                message: r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#.into(),
            }
        );
        for unsafe_one in [
            "net.core.somaxconn",
            "vm.swappiness",
            "kernel/msgmax",
            "net.ipv4.ip_unprivileged_port_start.",
            "net.ipv4/../../vm/swappiness",
            "",
        ] {
            let err = admit_sysctls(&sysctl_pod(&[unsafe_one], none.clone()), &list)
                .expect_err(unsafe_one);
            assert_eq!(err.reason, SYSCTL_FORBIDDEN, "{unsafe_one}");
            assert!(err.message.ends_with(" not allowlisted"), "{}", err.message);
        }
        // Kernels that do not namespace a safe sysctl yet do not allow it.
        let old = SysctlAllowlist::new(&[], Some((4, 4))).expect("allowlist");
        let keepalive = sysctl_pod(&["net.ipv4.tcp_keepalive_time"], none.clone());
        assert!(admit_sysctls(&keepalive, &old).is_err());
        assert_eq!(admit_sysctls(&keepalive, &list), Ok(()));
        let unknown = SysctlAllowlist::new(&[], None).expect("allowlist");
        assert!(admit_sysctls(&keepalive, &unknown).is_err());
        assert_eq!(
            admit_sysctls(&sysctl_pod(&["net.ipv4.tcp_syncookies"], none), &unknown),
            Ok(())
        );
    }

    #[test]
    fn allowed_unsafe_sysctl_patterns_pass() {
        let list = SysctlAllowlist::new(
            &[
                "kernel.msg*".into(),
                "net.core.somaxconn".into(),
                "net/ipv6/conf/*".into(),
            ],
            Some((6, 1)),
        )
        .expect("allowlist");
        let none = serde_json::json!({});
        for ok in [
            "kernel.msgmax",
            "kernel.msgmnb",
            "kernel/msgmni",
            "net.core.somaxconn",
            "net.ipv6.conf.all.forwarding",
            "kernel.shm_rmid_forced",
        ] {
            assert_eq!(
                admit_sysctls(&sysctl_pod(&[ok], none.clone()), &list),
                Ok(()),
                "{ok}"
            );
        }
        for refused in ["kernel.shmmax", "net.core.rmem_max", "kernel.sem"] {
            assert!(
                admit_sysctls(&sysctl_pod(&[refused], none.clone()), &list).is_err(),
                "{refused}"
            );
        }
        for bad in ["vm.*", "kernel.panic", "*", "kernel.msg**", "Kernel.msgmax"] {
            assert!(SysctlAllowlist::new(&[bad.into()], None).is_err(), "{bad}");
        }
    }

    #[test]
    fn sysctls_of_a_namespace_shared_with_the_host_are_refused() {
        let list = SysctlAllowlist::new(&["kernel.msg*".into(), "kernel.sem".into()], Some((6, 1)))
            .expect("allowlist");
        let host_net = serde_json::json!({"hostNetwork": true});
        let host_ipc = serde_json::json!({"hostIPC": true});
        let err = admit_sysctls(
            &sysctl_pod(&["net.ipv4.ip_unprivileged_port_start"], host_net.clone()),
            &list,
        )
        .expect_err("host net");
        assert_eq!(err.reason, "SysctlForbidden");
        assert_eq!(
            err.message,
            r#"forbidden sysctl: "net.ipv4.ip_unprivileged_port_start" not allowed with host net enabled"#
        );
        for ipc in ["kernel.shm_rmid_forced", "kernel.msgmax", "kernel.sem"] {
            let err = admit_sysctls(&sysctl_pod(&[ipc], host_ipc.clone()), &list).expect_err(ipc);
            assert_eq!(
                err.message,
                format!("forbidden sysctl: {ipc:?} not allowed with host ipc enabled")
            );
        }
        // The other namespace is still the pod's own.
        assert_eq!(
            admit_sysctls(&sysctl_pod(&["kernel.msgmax"], host_net), &list),
            Ok(())
        );
        assert_eq!(
            admit_sysctls(&sysctl_pod(&["net.ipv4.tcp_syncookies"], host_ipc), &list),
            Ok(())
        );
    }

    #[test]
    fn slash_sysctl_names_read_as_dotted() {
        assert_eq!(dotted_sysctl("net/ipv4/tcp_rmem"), "net.ipv4.tcp_rmem");
        assert_eq!(
            dotted_sysctl("net/ipv4/conf/eth0.100/rp_filter"),
            "net.ipv4.conf.eth0/100.rp_filter"
        );
        assert_eq!(
            dotted_sysctl("net.ipv4.conf.eth0/100.rp_filter"),
            "net.ipv4.conf.eth0/100.rp_filter"
        );
        assert_eq!(dotted_sysctl("kernel"), "kernel");
    }
}
