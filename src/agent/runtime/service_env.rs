//! The service environment variables a container starts with: `{NAME}_SERVICE_HOST`,
//! `{NAME}_SERVICE_PORT[_{PORT}]` and the Docker-link style `{NAME}_PORT...` variables of the
//! services in the pod's namespace (when `enableServiceLinks` is on) and of the API server's
//! `kubernetes` service, as the kubelet sets them.

use k8s_openapi::api::core::v1::Service;

/// Namespace and name of the API server's own service, whose variables every pod gets.
pub const MASTER_SERVICE: (&str, &str) = ("default", "kubernetes");

/// The services whose variables a pod in `namespace` gets, out of `services` (any namespaces):
/// those with a cluster IP, of the pod's namespace when `links` is on, and the API server's
/// service (a service of the pod's namespace of the same name wins), sorted by name.
pub fn services_for<'a>(services: &'a [Service], namespace: &str, links: bool) -> Vec<&'a Service> {
    let mut chosen: Vec<&Service> = Vec::new();
    for svc in services.iter().filter(|s| has_cluster_ip(s)) {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let master = (ns, name) == MASTER_SERVICE;
        let local = links && ns == namespace;
        if !master && !local {
            continue;
        }
        match chosen
            .iter()
            .position(|c| c.metadata.name.as_deref() == Some(name))
        {
            // Same name twice: the pod's namespace wins over the API server's service.
            Some(i) if local => chosen[i] = svc,
            Some(_) => {}
            None => chosen.push(svc),
        }
    }
    chosen.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    chosen
}

/// Whether `svc` has a cluster IP (not headless, not an ExternalName).
fn has_cluster_ip(svc: &Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default();
    !ip.is_empty() && ip != "None"
}

/// The variables of `services`, in order.
pub fn service_env(services: &[&Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let prefix = env_name(svc.metadata.name.as_deref().unwrap_or_default());
        let ports = spec.ports.as_deref().unwrap_or_default();
        out.push((format!("{prefix}_SERVICE_HOST"), ip.clone()));
        if let Some(first) = ports.first() {
            out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in ports {
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{prefix}_SERVICE_PORT_{}", env_name(name)),
                    p.port.to_string(),
                ));
            }
        }
        // Docker-link variables; the first port also gives the bare `{NAME}_PORT`.
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let scheme = proto.to_ascii_lowercase();
            let url = format!("{scheme}://{host}:{}", p.port);
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_ascii_uppercase());
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), scheme));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

/// A service or port name as a variable name: upper case, `-` as `_`.
fn env_name(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, Option<&str>)]) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, port, proto)| ServicePort {
                            name: n.map(str::to_string),
                            port: *port,
                            protocol: proto.map(str::to_string),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn variables_of_a_service_with_two_ports() {
        let s = svc(
            "ns",
            "foo-service",
            "10.0.0.11",
            &[
                (Some("http"), 8765, None),
                (Some("dns-udp"), 53, Some("UDP")),
            ],
        );
        let env = service_env(&[&s]);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("FOO_SERVICE_SERVICE_HOST"), Some("10.0.0.11"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT"), Some("8765"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT_HTTP"), Some("8765"));
        assert_eq!(get("FOO_SERVICE_SERVICE_PORT_DNS_UDP"), Some("53"));
        assert_eq!(get("FOO_SERVICE_PORT"), Some("tcp://10.0.0.11:8765"));
        assert_eq!(
            get("FOO_SERVICE_PORT_8765_TCP"),
            Some("tcp://10.0.0.11:8765")
        );
        assert_eq!(get("FOO_SERVICE_PORT_8765_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("FOO_SERVICE_PORT_8765_TCP_PORT"), Some("8765"));
        assert_eq!(get("FOO_SERVICE_PORT_8765_TCP_ADDR"), Some("10.0.0.11"));
        assert_eq!(get("FOO_SERVICE_PORT_53_UDP"), Some("udp://10.0.0.11:53"));
        assert_eq!(get("FOO_SERVICE_PORT_53_UDP_PROTO"), Some("udp"));
    }

    #[test]
    fn links_off_keeps_only_the_api_servers_service_and_headless_ones_never_count() {
        let all = vec![
            svc(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, None)],
            ),
            svc("ns", "web", "10.0.0.2", &[(None, 80, None)]),
            svc("ns", "headless", "None", &[(None, 80, None)]),
            svc("other", "db", "10.0.0.3", &[(None, 5432, None)]),
        ];
        let names = |v: Vec<&Service>| -> Vec<String> {
            v.iter()
                .map(|s| s.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        assert_eq!(names(services_for(&all, "ns", true)), ["kubernetes", "web"]);
        assert_eq!(names(services_for(&all, "ns", false)), ["kubernetes"]);
        // A service of the pod's namespace named as the API server's wins.
        let mut shadow = all.clone();
        shadow.push(svc("ns", "kubernetes", "10.0.0.9", &[(None, 1, None)]));
        let chosen = services_for(&shadow, "ns", true);
        let env = service_env(&chosen);
        assert!(env.contains(&("KUBERNETES_SERVICE_HOST".into(), "10.0.0.9".into())));
        assert!(!env.contains(&("KUBERNETES_SERVICE_HOST".into(), "10.0.0.1".into())));
    }
}
