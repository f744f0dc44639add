//! CNI results (1.0.0, 0.4.0, 0.3.x and the older 0.2.0/0.1.0 shape) reduced to the pod's IPs.

use std::net::IpAddr;

use serde_json::Value;

/// Pod IPs found in a result: the addresses on interface `ifname` inside the pod (or, when the
/// result names no interfaces, every address), IPv4 first, in the result's order otherwise.
pub fn pod_ips(result: &Value, ifname: &str) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let interfaces = result.get("interfaces").and_then(Value::as_array);
    if let Some(list) = result.get("ips").and_then(Value::as_array) {
        // Indexes of interfaces that are the pod's `ifname` (inside a sandbox).
        let pod_if = |idx: u64| -> bool {
            interfaces
                .and_then(|ifs| ifs.get(usize::try_from(idx).ok()?))
                .is_some_and(|i| {
                    let sandbox = i.get("sandbox").and_then(Value::as_str).unwrap_or("");
                    let name = i.get("name").and_then(Value::as_str).unwrap_or("");
                    !sandbox.is_empty() && (name == ifname || ifname.is_empty())
                })
        };
        let any_pod_if = list
            .iter()
            .filter_map(|ip| ip.get("interface").and_then(Value::as_u64))
            .any(pod_if);
        for ip in list {
            let on_pod = match ip.get("interface").and_then(Value::as_u64) {
                Some(idx) => pod_if(idx),
                None => true,
            };
            if any_pod_if && !on_pod {
                continue;
            }
            if let Some(addr) = ip
                .get("address")
                .and_then(Value::as_str)
                .and_then(parse_cidr)
            {
                ips.push(addr);
            }
        }
    } else {
        // 0.1.0 / 0.2.0: {"ip4": {"ip": "10.1.0.2/24"}, "ip6": {...}}
        for key in ["ip4", "ip6"] {
            if let Some(addr) = result
                .get(key)
                .and_then(|v| v.get("ip"))
                .and_then(Value::as_str)
                .and_then(parse_cidr)
            {
                ips.push(addr);
            }
        }
    }
    let mut seen = Vec::new();
    ips.retain(|ip| {
        let new = !seen.contains(ip);
        seen.push(*ip);
        new
    });
    // Stable: IPv4 before IPv6, as Kubernetes expects for the primary pod IP by default.
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips
}

/// The address of `a.b.c.d/len` (or a bare address).
fn parse_cidr(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_result_takes_the_pod_interface() {
        let r: Value = serde_json::from_str(
            r#"{"cniVersion":"1.0.0",
            "interfaces":[{"name":"cni0","mac":"aa"},{"name":"veth1","mac":"bb"},{"name":"eth0","mac":"cc","sandbox":"/run/netns/x"}],
            "ips":[{"address":"fd00::5/64","interface":2},{"address":"10.88.0.5/16","gateway":"10.88.0.1","interface":2},{"address":"10.99.0.1/16","interface":0}]}"#,
        )
        .expect("json");
        let ips: Vec<String> = pod_ips(&r, "eth0").iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["10.88.0.5", "fd00::5"]);
    }

    #[test]
    fn v03_without_interfaces_and_v02() {
        let r: Value = serde_json::from_str(
            r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.1.2.3/24"}]}"#,
        )
        .expect("json");
        assert_eq!(pod_ips(&r, "eth0")[0].to_string(), "10.1.2.3");
        let r: Value = serde_json::from_str(r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.4.0.9/16"}}"#)
            .expect("json");
        assert_eq!(pod_ips(&r, "eth0")[0].to_string(), "10.4.0.9");
        assert!(pod_ips(&serde_json::json!({}), "eth0").is_empty());
    }
}
