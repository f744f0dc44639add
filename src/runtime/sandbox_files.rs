//! A pod's own files: /etc/hostname, /etc/hosts and /etc/resolv.conf, and its /dev/shm.

use std::path::Path;

use k8s_cri::v1 as cri;

/// `/etc/resolv.conf` from the pod's DNS config, or the host's when the pod gives none.
pub fn resolv_conf(dns: Option<&cri::DnsConfig>) -> std::io::Result<String> {
    let Some(dns) =
        dns.filter(|d| !d.servers.is_empty() || !d.searches.is_empty() || !d.options.is_empty())
    else {
        return match std::fs::read_to_string("/etc/resolv.conf") {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(e),
        };
    };
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for s in &dns.servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    Ok(out)
}

/// `/etc/hosts`: the host's for host-network pods, else localhost entries and the pod's name.
pub fn hosts(host_network: bool, hostname: &str) -> std::io::Result<String> {
    if host_network {
        return match std::fs::read_to_string("/etc/hosts") {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(e),
        };
    }
    let mut out = String::from(
        "# Kubernetes-managed hosts file (written by Berth).\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    if !hostname.is_empty() {
        out.push_str(&format!("127.0.1.1\t{hostname}\n"));
    }
    Ok(out)
}

/// Writes a file atomically (temp + rename) with mode 0644.
pub fn write_file(path: &Path, content: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

/// Mounts the pod's /dev/shm: a 64 MiB tmpfs, as containerd and the kubelet default to, its
/// root owned by `owner` (the host ids of a user-namespaced pod's root; None: host root).
pub fn mount_shm(target: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use rustix::mount::{MountFlags, mount};
    std::fs::create_dir_all(target)?;
    let mut data = "mode=1777,size=65536k".to_string();
    if let Some((uid, gid)) = owner {
        data.push_str(&format!(",uid={uid},gid={gid}"));
    }
    let data = std::ffi::CString::new(data)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    mount(
        "shm",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        data.as_c_str(),
    )
    .map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("mounting shm on {}: {e}", target.display()),
        )
    })
}

/// Unmounts a pod's /dev/shm; absent or not mounted is fine.
pub fn unmount_shm(target: &Path) {
    match rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => tracing::warn!(path = %target.display(), error = %e, "unmounting shm"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_from_dns_config() {
        let dns = cri::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(Some(&dns)).expect("resolv"),
            "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn hosts_for_pod_network_name_the_pod() {
        let h = hosts(false, "web-0").expect("hosts");
        assert!(h.contains("127.0.0.1\tlocalhost\n"));
        assert!(h.contains("\tweb-0\n"));
    }
}
