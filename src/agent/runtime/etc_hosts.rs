//! The pod's `/etc/hosts` as the kubelet manages it: localhost entries, the pod's IPs with its
//! hostname (and FQDN under a subdomain), the pod's hostAliases; for host-network pods the
//! node's own file with the aliases after it. Mounted into every container that mounts nothing
//! at `/etc/hosts` itself.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{HostAlias, Pod};

/// Where the file goes in a container.
pub const CONTAINER_PATH: &str = "/etc/hosts";

/// First line of the file of a pod on the pod network (the one the kubelet writes, which
/// tools and tests look for).
const HEADER: &str = "# Kubernetes-managed hosts file.\n";

/// First line of the file of a host-network pod.
const HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";

/// The file's content for `pod` with addresses `ips`, `hostname` and DNS `domain` (the pod's
/// subdomain under the cluster domain, when it has one); `node_hosts` is the node's
/// `/etc/hosts`, used for host-network pods.
pub fn content(
    pod: &Pod,
    ips: &[&str],
    hostname: &str,
    domain: Option<&str>,
    node_hosts: &str,
) -> String {
    let spec = pod.spec.as_ref();
    let aliases = spec
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or_default();
    let mut out = String::new();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        out.push_str(HEADER_HOST_NETWORK);
        out.push_str(node_hosts);
    } else {
        out.push_str(HEADER);
        for line in [
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            "fe00::0\tip6-localnet",
            "fe00::0\tip6-mcastprefix",
            "fe00::1\tip6-allnodes",
            "fe00::2\tip6-allrouters",
        ] {
            out.push_str(line);
            out.push('\n');
        }
        for ip in ips {
            match domain {
                Some(d) => out.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
                None => out.push_str(&format!("{ip}\t{hostname}\n")),
            }
        }
    }
    out.push_str(&alias_lines(aliases));
    out
}

/// The hostAliases section: each IP with its names on one line.
fn alias_lines(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.as_deref().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", a.ip));
    }
    out
}

/// The pod's DNS domain: `<subdomain>.<namespace>.svc.<cluster domain>` when it sets a
/// subdomain (and the node has a cluster domain).
pub fn pod_domain(pod: &Pod, cluster_domain: &str) -> Option<String> {
    let sub = pod
        .spec
        .as_ref()?
        .subdomain
        .as_deref()
        .filter(|s| !s.is_empty())?;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    (!cluster_domain.is_empty()).then(|| format!("{sub}.{ns}.svc.{cluster_domain}"))
}

/// Writes the file for the pod whose directory is `pod_dir` (0644, replaced atomically) and
/// returns the container's mount of it.
pub fn write(pod_dir: &Path, content: &str) -> std::io::Result<cri::Mount> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(pod_dir)?;
    let path: PathBuf = pod_dir.join("etc-hosts");
    let tmp = pod_dir.join(".etc-hosts.tmp");
    std::fs::write(&tmp, content)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, &path)?;
    Ok(cri::Mount {
        container_path: CONTAINER_PATH.into(),
        host_path: path.display().to_string(),
        readonly: false,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut spec = serde_json::json!({"containers": [{"name": "c", "image": "busybox"}]});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop"},
            "spec": spec,
        }))
        .expect("pod")
    }

    #[test]
    fn pod_network_file_names_the_pod_and_its_aliases() {
        let p = pod(serde_json::json!({
            "subdomain": "web",
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}],
        }));
        let domain = pod_domain(&p, "cluster.local");
        assert_eq!(domain.as_deref(), Some("web.shop.svc.cluster.local"));
        let c = content(&p, &["10.128.0.7"], "web-0", domain.as_deref(), "");
        assert!(
            c.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
            "{c}"
        );
        assert!(
            c.contains("\n10.128.0.7\tweb-0.web.shop.svc.cluster.local\tweb-0\n"),
            "{c}"
        );
        assert!(
            c.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"),
            "{c}"
        );
    }

    #[test]
    fn host_network_file_is_the_nodes_with_a_header() {
        let p = pod(serde_json::json!({"hostNetwork": true}));
        let c = content(&p, &["192.0.2.1"], "node-a", None, "127.0.0.1 localhost\n");
        assert_eq!(
            c,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );
    }
}
