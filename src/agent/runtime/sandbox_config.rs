//! The CRI PodSandboxConfig of a pod: metadata, hostname, DNS, ports, namespaces, sysctls.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::labels;

/// The pod's log directory, as the kubelet names it: `<root>/<namespace>_<name>_<uid>`.
pub fn log_directory(root: &Path, pod: &Pod) -> PathBuf {
    root.join(format!(
        "{}_{}_{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    ))
}

/// The sandbox config for attempt `attempt` of `pod`.
pub fn sandbox_config(
    pod: &Pod,
    hash: &str,
    attempt: u32,
    log_root: &Path,
    node_name: &str,
    cgroup_root: &str,
    cluster_dns: &ClusterDns<'_>,
) -> cri::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let hostname = hostname_of(pod, node_name);
    let mode = |host: Option<bool>| {
        if host.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        }
    };
    let pid = if spec.host_pid.unwrap_or(false) {
        cri::NamespaceMode::Node as i32
    } else if spec.share_process_namespace.unwrap_or(false) {
        cri::NamespaceMode::Pod as i32
    } else {
        cri::NamespaceMode::Container as i32
    };
    let psc = spec.security_context.clone().unwrap_or_default();
    let sysctls = psc
        .sysctls
        .iter()
        .flatten()
        // In dotted form, the name admission checked (`net/ipv4/tcp_rmem` reads as
        // `net.ipv4.tcp_rmem`).
        .map(|s| {
            (
                crate::agent::pods::admission::dotted_sysctl(&s.name),
                s.value.clone(),
            )
        })
        .collect();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            attempt,
        }),
        hostname,
        log_directory: log_directory(log_root, pod).display().to_string(),
        dns_config: Some(dns_config(
            &spec,
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            Path::new("/etc/resolv.conf"),
            cluster_dns,
        )),
        port_mappings: port_mappings(&spec),
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod, hash),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(cgroup_root, pod),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: mode(spec.host_network),
                    pid,
                    ipc: mode(spec.host_ipc),
                    ..Default::default()
                }),
                run_as_user: psc.run_as_user.map(|v| cri::Int64Value { value: v }),
                run_as_group: psc.run_as_group.map(|v| cri::Int64Value { value: v }),
                supplemental_groups: super::container_config::supplemental_groups(&psc),
                seccomp: Some(super::container_config::seccomp(
                    psc.seccomp_profile.as_ref(),
                )),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's cgroup as the kubelet names it with the runtime's cgroup driver. cgroupfs:
/// `<root>/pod<uid>` for Guaranteed pods, `<root>/burstable/pod<uid>` and
/// `<root>/besteffort/pod<uid>` (root `/kubepods` by default). systemd: the slices
/// `kubepods-pod<uid>.slice`, `kubepods-burstable-pod<uid>.slice` and
/// `kubepods-besteffort-pod<uid>.slice`, the root's parts joined by dashes and the uid's dashes
/// made underscores (a dash nests slices).
pub fn cgroup_parent(root: &str, pod: &Pod) -> String {
    cgroup_parent_for(crate::runtime::cgroup_driver::current(), root, pod)
}

/// [`cgroup_parent`] under `driver`.
pub fn cgroup_parent_for(
    driver: crate::runtime::cgroup_driver::CgroupDriver,
    root: &str,
    pod: &Pod,
) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let qos = pod
        .spec
        .as_ref()
        .map(super::resources::qos_class)
        .unwrap_or("BestEffort");
    let class = match qos {
        "Guaranteed" => None,
        "Burstable" => Some("burstable"),
        _ => Some("besteffort"),
    };
    match driver {
        crate::runtime::cgroup_driver::CgroupDriver::Cgroupfs => {
            let root = root.trim_end_matches('/');
            match class {
                None => format!("{root}/pod{uid}"),
                Some(c) => format!("{root}/{c}/pod{uid}"),
            }
        }
        crate::runtime::cgroup_driver::CgroupDriver::Systemd => {
            let mut parts: Vec<String> = root
                .split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect();
            parts.extend(class.map(str::to_string));
            parts.push(format!("pod{}", uid.replace('-', "_")));
            format!("{}.slice", parts.join("-"))
        }
    }
}

/// The cgroup path of the agent's pods' root (`agent.cgroup_root`) under the runtime's driver:
/// as configured for cgroupfs, its slice's path for systemd (`/kubepods.slice`).
pub fn pods_cgroup(root: &str) -> String {
    use crate::runtime::cgroup_driver::{self, CgroupDriver};
    match cgroup_driver::current() {
        CgroupDriver::Cgroupfs => root.to_string(),
        CgroupDriver::Systemd => {
            let parts: Vec<&str> = root.split('/').filter(|p| !p.is_empty()).collect();
            cgroup_driver::expand_slice(&format!("{}.slice", parts.join("-")))
                .unwrap_or_else(|_| root.to_string())
        }
    }
}

/// Host ports of every container.
pub fn port_mappings(spec: &PodSpec) -> Vec<cri::PortMapping> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The cluster's DNS service, as the kubelet's clusterDNS and clusterDomain give it.
pub struct ClusterDns<'a> {
    /// Its addresses (none: ClusterFirst pods fall back to the host's resolv.conf).
    pub servers: &'a [String],
    /// The cluster's domain (`cluster.local`).
    pub domain: &'a str,
}

/// The ClusterFirst policy with which a pod asks for the cluster's DNS: ClusterFirst off the
/// host network, or ClusterFirstWithHostNet.
fn wants_cluster_dns(spec: &PodSpec) -> Option<&'static str> {
    match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "ClusterFirstWithHostNet" => Some("ClusterFirstWithHostNet"),
        "ClusterFirst" if !spec.host_network.unwrap_or(false) => Some("ClusterFirst"),
        _ => None,
    }
}

/// The DNS policy that applies to a pod: ClusterFirst when it asks for the cluster's DNS and
/// the node has one, else Default (None stays None), as in the kubelet.
pub fn effective_dns_policy(spec: &PodSpec, cluster: &ClusterDns<'_>) -> &'static str {
    if spec.dns_policy.as_deref() == Some("None") {
        "None"
    } else if wants_cluster_dns(spec).is_some() && !cluster.servers.is_empty() {
        "ClusterFirst"
    } else {
        "Default"
    }
}

/// The policy a pod asked for the cluster's DNS with when the node has none to give (it falls
/// back to Default; the kubelet says so with a MissingClusterDNS event).
pub fn missing_cluster_dns(spec: &PodSpec, cluster: &ClusterDns<'_>) -> Option<&'static str> {
    wants_cluster_dns(spec).filter(|_| cluster.servers.is_empty())
}

/// The pod's DNS: `ClusterFirst` the cluster's DNS with the namespace's search path and
/// `ndots:5`; `Default` the host's resolv.conf; `None` only the pod's dnsConfig; dnsConfig is
/// merged on top of the others.
pub fn dns_config(
    spec: &PodSpec,
    namespace: &str,
    host_resolv: &Path,
    cluster: &ClusterDns<'_>,
) -> cri::DnsConfig {
    let host = || {
        std::fs::read_to_string(host_resolv)
            .map(|t| parse_resolv_conf(&t))
            .unwrap_or_default()
    };
    let mut dns = match effective_dns_policy(spec, cluster) {
        "None" => cri::DnsConfig::default(),
        "ClusterFirst" => {
            let d = cluster.domain;
            let mut searches = vec![
                format!("{namespace}.svc.{d}"),
                format!("svc.{d}"),
                d.to_string(),
            ];
            for s in host().searches {
                if !searches.contains(&s) {
                    searches.push(s);
                }
            }
            cri::DnsConfig {
                servers: cluster.servers.to_vec(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        _ => host(),
    };
    if let Some(extra) = &spec.dns_config {
        for s in extra.nameservers.iter().flatten() {
            if !dns.servers.contains(s) {
                dns.servers.push(s.clone());
            }
        }
        for s in extra.searches.iter().flatten() {
            if !dns.searches.contains(s) {
                dns.searches.push(s.clone());
            }
        }
        for o in extra.options.iter().flatten() {
            let name = o.name.clone().unwrap_or_default();
            dns.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            dns.options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    dns
}

/// nameserver, search/domain and options lines of a resolv.conf.
pub fn parse_resolv_conf(text: &str) -> cri::DnsConfig {
    let mut dns = cri::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search") | Some("domain") => {
                dns.searches = words.map(str::to_string).collect();
            }
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// The hostname of `pod`'s sandbox: the node's for a host-network pod, else `spec.hostname` or
/// the pod's name, cut as [`pod_hostname`] cuts it.
pub fn hostname_of(pod: &Pod, node_name: &str) -> String {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return node_name.to_string();
    }
    let name = spec
        .and_then(|s| s.hostname.as_deref())
        .or(pod.metadata.name.as_deref())
        .unwrap_or_default();
    pod_hostname(name)
}

/// Longest hostname a pod gets (a DNS label).
const MAX_HOSTNAME: usize = 63;

/// A pod's hostname from its name (or `spec.hostname`): cut to 63 bytes without trailing `-` or
/// `.`, as the kubelet does for a pod name longer than a DNS label.
fn pod_hostname(name: &str) -> String {
    if name.len() <= MAX_HOSTNAME {
        return name.to_string();
    }
    let mut end = MAX_HOSTNAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].trim_end_matches(['-', '.']).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroups_are_named_as_the_kubelet_names_them_for_each_driver() {
        use crate::runtime::cgroup_driver::CgroupDriver;
        let pod = |resources: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"uid": "1a2b-3c"},
                "spec": {"containers": [{"name": "c", "resources": resources}]},
            }))
            .expect("pod")
        };
        let guaranteed = pod(serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}}));
        let burstable = pod(serde_json::json!({"requests": {"cpu": "1"}}));
        let best = pod(serde_json::json!({}));
        let fs = |p: &Pod| cgroup_parent_for(CgroupDriver::Cgroupfs, "/kubepods", p);
        let sd = |p: &Pod| cgroup_parent_for(CgroupDriver::Systemd, "/kubepods", p);
        assert_eq!(fs(&guaranteed), "/kubepods/pod1a2b-3c");
        assert_eq!(fs(&burstable), "/kubepods/burstable/pod1a2b-3c");
        assert_eq!(fs(&best), "/kubepods/besteffort/pod1a2b-3c");
        assert_eq!(sd(&guaranteed), "kubepods-pod1a2b_3c.slice");
        assert_eq!(sd(&burstable), "kubepods-burstable-pod1a2b_3c.slice");
        assert_eq!(sd(&best), "kubepods-besteffort-pod1a2b_3c.slice");
        // Every name is one the runtime takes under the same driver.
        for p in [&guaranteed, &burstable, &best] {
            assert!(CgroupDriver::Systemd.pod_cgroup(&sd(p)).is_ok());
            assert!(CgroupDriver::Cgroupfs.pod_cgroup(&fs(p)).is_ok());
        }
    }

    #[test]
    fn long_pod_names_make_hostnames_of_63_bytes_at_most() {
        let long = "termination-message-container3472327f-ed07-4c9a-accb-54447a0c7f8d";
        assert_eq!(
            pod_hostname(long),
            "termination-message-container3472327f-ed07-4c9a-accb-54447a0c7f"
        );
        assert_eq!(pod_hostname("web-0"), "web-0");
        let dashed = format!("{}--x", "a".repeat(61));
        assert_eq!(pod_hostname(&dashed), "a".repeat(61));
    }

    #[test]
    fn resolv_conf() {
        let d = parse_resolv_conf(
            "# x\nnameserver 1.1.1.1\nnameserver 8.8.8.8 ; y\nsearch a.b c\noptions ndots:2 edns0\n",
        );
        assert_eq!(d.servers, vec!["1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.searches, vec!["a.b", "c"]);
        assert_eq!(d.options, vec!["ndots:2", "edns0"]);
    }

    const NO_DNS: ClusterDns<'static> = ClusterDns {
        servers: &[],
        domain: "cluster.local",
    };

    #[test]
    fn cluster_first_uses_the_cluster_dns_and_the_namespace_search_path() {
        let servers = ["10.96.0.10".to_string()];
        let dns = ClusterDns {
            servers: &servers,
            domain: "cluster.local",
        };
        let spec: PodSpec =
            serde_json::from_value(serde_json::json!({"containers": []})).expect("spec");
        let d = dns_config(&spec, "web", Path::new("/nonexistent"), &dns);
        assert_eq!(d.servers, servers);
        assert_eq!(
            d.searches,
            [
                "web.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(d.options, ["ndots:5"]);
        let host: PodSpec =
            serde_json::from_value(serde_json::json!({"containers": [], "hostNetwork": true}))
                .expect("spec");
        assert_eq!(effective_dns_policy(&host, &dns), "Default");
        assert_eq!(effective_dns_policy(&spec, &NO_DNS), "Default");
        assert_eq!(missing_cluster_dns(&spec, &NO_DNS), Some("ClusterFirst"));
        assert_eq!(missing_cluster_dns(&host, &NO_DNS), None);
        assert_eq!(missing_cluster_dns(&spec, &dns), None);
    }

    #[test]
    fn dns_none_uses_only_the_pod_config() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [],
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "5"}]}
        }))
        .expect("spec");
        let d = dns_config(&spec, "ns", Path::new("/nonexistent"), &NO_DNS);
        assert_eq!(d.servers, vec!["10.0.0.10"]);
        assert_eq!(d.options, vec!["ndots:5"]);
    }
}
