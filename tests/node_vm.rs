//! Berth on the node most people run, in a Debian 12 VM (hack/node-vm.sh): systemd as PID 1, a
//! pure cgroup v2 hierarchy, Debian's kernel. This build's package is installed there and
//! berthd, started by systemd with the systemd cgroup driver it picks there, runs a static pod
//! with a shared PID namespace and limits (its init and each container in a scope of the pod's
//! slice, the limits kept across `systemctl daemon-reload`); the pod outlives `systemctl restart
//! berthd`, a container past its memory limit ends OOMKilled, and after a reboot of the VM
//! berthd reports the old container ended and the agent runs the pod again; then the stock
//! kubelet 1.20 runs a static pod on the same berthd, the agent off, with `cgroupDriver:
//! systemd` and then, berthd switched to cgroupfs, with `cgroupDriver: cgroupfs`.
//! AppArmor is enforced: berthd loads `berth-default` and every container and its exec run
//! under it; a Localhost profile named by the agent's securityContext field and by the
//! kubelet's annotation confines its container. The agent joins a control plane on the host
//! with a bootstrap token and, after the reboot, with the token deleted, rejoins with the
//! certificate it keeps under the root dir (`tests/node_vm/guest.sh` holds the checks).

mod cni_support;
mod common;
mod kubelet_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use kubelet_support::control_plane::ControlPlane;

/// The bootstrap token the guest's agent joins with.
const TOKEN_ID: &str = "b3rthv";
const TOKEN_SECRET: &str = "0123456789abcdef";

/// A control plane on the host for the guest's agent to join with a bootstrap token (TLS
/// bootstrap, its certificates approved by the controller manager), and what the guest needs
/// in the share: the CA, a bootstrap kubeconfig and an admin kubeconfig for `kubectl` (the
/// guest reaches the host's API server at 10.0.2.2).
fn cluster_for_the_guest(share: &Path) -> ControlPlane {
    let cp = ControlPlane::start("node-vm");
    cp.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-{TOKEN_ID}\n  namespace: kube-system\ntype: bootstrap.kubernetes.io/token\nstringData:\n  token-id: {TOKEN_ID}\n  token-secret: {TOKEN_SECRET}\n  usage-bootstrap-authentication: \"true\"\n  auth-extra-groups: system:bootstrappers:berth\n"
    ));
    for (name, role, group) in [
        (
            "berth-bootstrappers-create-csrs",
            "system:node-bootstrapper",
            "system:bootstrappers",
        ),
        (
            "berth-bootstrappers-auto-approve",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        (
            "berth-nodes-renew",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            name,
            &format!("--clusterrole={role}"),
            &format!("--group={group}"),
        ]);
    }
    for file in ["ca.crt", "admin.crt", "admin.key"] {
        std::fs::copy(cp.dir.path().join(file), share.join(file)).expect("copy a cluster file");
    }
    let kubectl = kubelet_support::kube_bin("BERTH_TEST_KUBECTL");
    std::fs::copy(kubectl, share.join("kubectl")).expect("copy kubectl");
    let server = format!("https://10.0.2.2:{}", cp.api_port);
    let kubeconfig = |ca: &str, user: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{server}', certificate-authority: {ca}}}\nusers:\n- name: u\n  user: {user}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        )
    };
    std::fs::write(
        share.join("bootstrap.kubeconfig"),
        kubeconfig(
            "/etc/berth/ca.crt",
            &format!("{{token: {TOKEN_ID}.{TOKEN_SECRET}}}"),
        ),
    )
    .expect("bootstrap kubeconfig");
    std::fs::write(
        share.join("admin.kubeconfig"),
        kubeconfig(
            "/mnt/share/ca.crt",
            "{client-certificate: /mnt/share/admin.crt, client-key: /mnt/share/admin.key}",
        ),
    )
    .expect("admin kubeconfig");
    cp
}

/// The package of the debug build (as tests/package.rs makes it).
fn package() -> PathBuf {
    PathBuf::from(hack("deb.sh", &["--profile", "dev"]).trim())
}

/// What the guest left in the share, for a failure's message.
fn guest_report(share: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(share.join(name)).unwrap_or_default();
    format!(
        "-- guest.log --\n{}\n-- console (last lines) --\n{}",
        read("guest.log"),
        tail(&read("console.log"), 40)
    )
}

#[test]
fn static_pod_survives_restart_and_reboot_on_systemd_and_cgroup_v2() {
    let deb = package();
    let share = TempDir::new("node-vm");
    std::fs::copy(&deb, share.path().join("berth.deb")).expect("copy the package");
    std::fs::copy(
        repo_root().join("tests/node_vm/guest.sh"),
        share.path().join("guest.sh"),
    )
    .expect("copy guest.sh");
    let kubelet = std::env::var("BERTH_TEST_KUBELET").unwrap_or_else(|_| {
        panic!("BERTH_TEST_KUBELET is not set: run the suite through `make test` (or eval \"$(bash hack/kubernetes.sh)\")")
    });
    std::fs::copy(&kubelet, share.path().join("kubelet")).expect("copy the kubelet");
    // The guest reaches the host's loopback at 10.0.2.2 (qemu's user network).
    let port = registry()
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .expect("the test registry's port");
    std::fs::write(
        share.path().join("env"),
        format!("REGISTRY=10.0.2.2:{port}\n"),
    )
    .expect("write env");
    let cp = cluster_for_the_guest(share.path());

    let out = Command::new("bash")
        .arg(repo_root().join("hack/node-vm.sh"))
        .args(["run", &share.path().to_string_lossy(), "900"])
        .output()
        .expect("run hack/node-vm.sh");
    let report = guest_report(share.path());
    assert!(
        out.status.success(),
        "the node VM's checks failed ({}):\n{}\n{report}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(share.path().join("guest.log")).expect("guest.log");
    eprintln!("{log}");
    // The node's own identity did the rejoin: its certificate, not the token, made the lease.
    assert!(
        !cp.audited("system:node:node-vm", "update", "leases")
            .is_empty(),
        "no lease update by system:node:node-vm"
    );
    for check in [
        "ok: stats from the v2 files",
        "ok: memory.oom.group 1",
        "ok: private cgroup namespace",
        "ok: pod init in its scope",
        "its limits kept across systemctl daemon-reload",
        "ok: an updated limit of",
        "ok: container kept across systemctl restart berthd",
        "ok: a container past its memory limit ends OOMKilled",
        "ok: the pre-reboot container reported ended",
        "ok: the stock kubelet 1.20 (systemd driver) runs its static pod",
        "ok: the kubelet's pod removed, its cgroups too (systemd driver)",
        "ok: the stock kubelet 1.20 (cgroupfs driver) runs its static pod",
        "ok: the kubelet's pod removed, its cgroups too (cgroupfs driver)",
        "ok: the agent's pod removed, its cgroups too",
        "ok: berthd loaded its AppArmor profile berth-default",
        "ok: the container and its exec run under berth-default",
        "ok: the Localhost AppArmor profile confines the container and its exec",
        "ok: joined the cluster with its bootstrap token",
        "ok: rejoined the cluster after the reboot with its stored certificate",
        "== all checks passed",
    ] {
        assert!(
            log.contains(check),
            "no '{check}' in the guest's log:\n{report}"
        );
    }
}
