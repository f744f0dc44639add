//! Berth on the node most people run, in a Debian 12 VM (hack/node-vm.sh): systemd as PID 1, a
//! pure cgroup v2 hierarchy, Debian's kernel. This build's package is installed there and
//! berthd, started by systemd, runs a static pod with a shared PID namespace and limits; the pod
//! outlives `systemctl restart berthd`, a container past its memory limit ends OOMKilled, and
//! after a reboot of the VM berthd reports the old container ended and the agent runs the pod
//! again; then the stock kubelet 1.20 runs a static pod on the same berthd, the agent off
//! (`tests/node_vm/guest.sh` holds the checks).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

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
    for check in [
        "ok: stats from the v2 files",
        "ok: private cgroup namespace",
        "ok: pod init in its leaf cgroup",
        "ok: container kept across systemctl restart berthd",
        "ok: a container past its memory limit ends OOMKilled",
        "ok: the pre-reboot container reported ended",
        "ok: the stock kubelet 1.20 (cgroupfs driver) runs its static pod",
        "ok: the kubelet's pod removed, its cgroups too",
        "ok: the agent's pod removed, its cgroups too",
        "== all checks passed",
    ] {
        assert!(
            log.contains(check),
            "no '{check}' in the guest's log:\n{report}"
        );
    }
}
