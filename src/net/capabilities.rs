//! What Berth offers plugins through `runtimeConfig` (each plugin receives the ones it declares
//! in `capabilities`) and `CNI_ARGS`, from the PodSandboxConfig and the node's pod CIDR.

use k8s_cri::v1 as cri;
use serde_json::{Map, Value, json};

/// Annotation with the pod's ingress limit (a Kubernetes quantity in bits/s, e.g. `10M`).
pub const INGRESS_ANNOTATION: &str = "kubernetes.io/ingress-bandwidth";
/// Annotation with the pod's egress limit.
pub const EGRESS_ANNOTATION: &str = "kubernetes.io/egress-bandwidth";

/// Burst (bits) given with a rate, as the kubelet's own CNI code did: effectively unlimited.
const BURST_BITS: u64 = i32::MAX as u64;

/// `CNI_ARGS` for a pod, as Kubernetes runtimes pass it.
pub fn cni_args(config: &cri::PodSandboxConfig, sandbox_id: &str) -> String {
    let meta = config.metadata.clone().unwrap_or_default();
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={sandbox_id};K8S_POD_UID={}",
        meta.namespace, meta.name, meta.uid
    )
}

/// Every capability value for this pod: portMappings, bandwidth, dns, ipRanges.
pub fn runtime_config(
    config: &cri::PodSandboxConfig,
    pod_cidr: &str,
) -> Result<Map<String, Value>, String> {
    let mut rc = Map::new();
    let ports: Vec<Value> = config
        .port_mappings
        .iter()
        .filter(|p| p.host_port > 0)
        .map(|p| {
            let protocol = match cri::Protocol::try_from(p.protocol) {
                Ok(cri::Protocol::Udp) => "udp",
                Ok(cri::Protocol::Sctp) => "sctp",
                _ => "tcp",
            };
            let mut m = json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": protocol,
            });
            if !p.host_ip.is_empty() {
                m["hostIP"] = Value::String(p.host_ip.clone());
            }
            m
        })
        .collect();
    if !ports.is_empty() {
        rc.insert("portMappings".into(), Value::Array(ports));
    }
    let rate = |key: &str| -> Result<Option<u64>, String> {
        config
            .annotations
            .get(key)
            .map(|v| bandwidth(v).map_err(|e| format!("annotation {key}={v:?}: {e}")))
            .transpose()
    };
    let (ingress, egress) = (rate(INGRESS_ANNOTATION)?, rate(EGRESS_ANNOTATION)?);
    if ingress.is_some() || egress.is_some() {
        let mut bw = Map::new();
        if let Some(r) = ingress {
            bw.insert("ingressRate".into(), r.into());
            bw.insert("ingressBurst".into(), BURST_BITS.into());
        }
        if let Some(r) = egress {
            bw.insert("egressRate".into(), r.into());
            bw.insert("egressBurst".into(), BURST_BITS.into());
        }
        rc.insert("bandwidth".into(), Value::Object(bw));
    }
    if let Some(dns) = &config.dns_config {
        rc.insert(
            "dns".into(),
            json!({ "servers": dns.servers, "searches": dns.searches, "options": dns.options }),
        );
    }
    let ranges: Vec<Value> = pod_cidr
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| json!([{ "subnet": c }]))
        .collect();
    if !ranges.is_empty() {
        rc.insert("ipRanges".into(), Value::Array(ranges));
    }
    Ok(rc)
}

/// A bandwidth annotation in bits/s, within the kubelet's bounds (1k to 1P).
pub fn bandwidth(value: &str) -> Result<u64, String> {
    let bits = quantity(value)?;
    if bits < 1_000 {
        return Err("under the minimum of 1k bits/s".into());
    }
    if bits > 1_000_000_000_000_000 {
        return Err("over the maximum of 1P bits/s".into());
    }
    Ok(bits)
}

/// A Kubernetes quantity (`10M`, `1.5Gi`, `2e6`, `500k`) rounded up to an integer.
pub fn quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a quantity"))?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if (e.starts_with('e') || e.starts_with('E')) && e.len() > 1 => {
            let exp: i32 = e[1..]
                .parse()
                .map_err(|_| format!("{s:?} has a bad exponent"))?;
            10f64.powi(exp)
        }
        other => return Err(format!("{s:?} has an unknown suffix {other:?}")),
    };
    let v = (n * mult).ceil();
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    // Truncation is exact: v is a non-negative integer within u64 here.
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity("10M"), Ok(10_000_000));
        assert_eq!(quantity("1Ki"), Ok(1024));
        assert_eq!(quantity("1.5k"), Ok(1500));
        assert_eq!(quantity("2e6"), Ok(2_000_000));
        assert_eq!(quantity("100"), Ok(100));
        assert!(quantity("10X").is_err());
        assert!(quantity("abc").is_err());
        assert!(bandwidth("10").is_err());
        assert!(bandwidth("10E").is_err());
    }

    #[test]
    fn runtime_config_from_pod() {
        let mut config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            port_mappings: vec![
                cri::PortMapping {
                    protocol: cri::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into(),
                },
                cri::PortMapping {
                    protocol: 0,
                    container_port: 80,
                    host_port: 0,
                    host_ip: String::new(),
                },
            ],
            dns_config: Some(cri::DnsConfig {
                servers: vec!["10.0.0.10".into()],
                searches: vec!["svc.local".into()],
                options: vec!["ndots:5".into()],
            }),
            ..Default::default()
        };
        config
            .annotations
            .insert(INGRESS_ANNOTATION.into(), "10M".into());
        let rc = runtime_config(&config, "10.1.0.0/24, fd00::/64").expect("rc");
        assert_eq!(
            rc["portMappings"],
            json!([{"hostPort":5353,"containerPort":53,"protocol":"udp","hostIP":"127.0.0.1"}])
        );
        assert_eq!(rc["bandwidth"]["ingressRate"], 10_000_000);
        assert!(rc["bandwidth"].get("egressRate").is_none());
        assert_eq!(rc["dns"]["options"], json!(["ndots:5"]));
        assert_eq!(
            rc["ipRanges"],
            json!([[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64"}]])
        );
        assert_eq!(
            cni_args(&config, "abc"),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u"
        );
        config
            .annotations
            .insert(EGRESS_ANNOTATION.into(), "lots".into());
        assert!(runtime_config(&config, "").is_err());
    }
}
