//! Pinned pod namespaces: created by a berthd child, visible through nsenter, removed cleanly.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use berth::runtime::pin::{PinError, PinRequest, pin, unpin};
use common::{TempDir, mounted, nsenter};

#[tokio::test]
async fn pod_namespaces_are_pinned_configured_and_removed() {
    let dir = TempDir::new("pin");
    let req = PinRequest {
        net: Some(dir.path().join("netns")),
        ipc: Some(dir.path().join("ipcns")),
        uts: Some(dir.path().join("utsns")),
        pid: Some(dir.path().join("pidns")),
        user: None,
        cgroups: Vec::new(),
        hostname: Some("pod-a".into()),
        sysctls: vec![
            ("net.ipv4.ip_unprivileged_port_start".into(), "80".into()),
            ("kernel.shmmni".into(), "1000".into()),
        ],
    };
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_berthd"));
    let init = pin(exe, &req).await.expect("pin").expect("a pod init");
    // Killed even if an assertion below fails.
    struct KillOnDrop(berth::runtime::process::HostProcess);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            self.0.kill();
        }
    }
    let _guard = KillOnDrop(init);
    assert!(init.is_running());
    let net = req.net.clone().expect("net");
    let ipc = req.ipc.clone().expect("ipc");
    let uts = req.uts.clone().expect("uts");
    let pid = req.pid.clone().expect("pid");
    for p in [&net, &ipc, &uts, &pid] {
        assert!(mounted(p), "{} is a mount", p.display());
    }
    // The pinned PID namespace is the init's, and the init is its pid 1.
    let init_ns = std::fs::metadata(format!("/proc/{}/ns/pid", init.pid)).expect("init ns");
    assert_eq!(init_ns.ino(), std::fs::metadata(&pid).expect("pidns").ino());
    let p = format!("--pid={}", pid.display());
    // A process entering it gets a small pid of that namespace (pid 1 is the init; were the
    // init gone, the fork would fail).
    let inner: u32 = nsenter(&[&p, "sh", "-c", "echo $$"]).parse().expect("pid");
    assert!(
        (2..1000).contains(&inner),
        "pid {inner} inside the pod namespace"
    );
    // New namespaces, not the host's.
    let host_net = std::fs::metadata("/proc/self/ns/net")
        .expect("host ns")
        .ino();
    let pod_net = std::fs::metadata(&net).expect("pinned ns").ino();
    assert_ne!(host_net, pod_net);
    let n = format!("--net={}", net.display());
    let i = format!("--ipc={}", ipc.display());
    let u = format!("--uts={}", uts.display());
    assert_eq!(nsenter(&[&u, "hostname"]), "pod-a");
    assert_eq!(
        nsenter(&[&n, "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"]),
        "80"
    );
    assert_eq!(nsenter(&[&i, "cat", "/proc/sys/kernel/shmmni"]), "1000");
    // `ip` asks the kernel over netlink in the namespace (sysfs would show the host's).
    let links = nsenter(&[&n, "ip", "-o", "link", "show"]);
    let lines: Vec<&str> = links.lines().collect();
    assert_eq!(lines.len(), 1, "only lo in a fresh pod netns: {links}");
    assert!(
        lines[0].contains(": lo:") && lines[0].contains(",UP,"),
        "lo is up: {links}"
    );

    init.kill();
    unpin(&req);
    unpin(&req); // idempotent
    assert!(!init.is_running());
    for p in [&net, &ipc, &uts, &pid] {
        assert!(!p.exists() && !mounted(p), "{} removed", p.display());
    }
}

/// A pod with its own user namespace: the user namespace is pinned with the pod's mappings and
/// owns the pod's other namespaces, so a process in it (the pod's root) can join them.
#[tokio::test]
async fn a_user_namespace_owns_the_pods_other_namespaces() {
    use berth::runtime::userns::{IdRange, PodIds};
    let dir = TempDir::new("pin-userns");
    let ids = PodIds {
        uids: IdRange {
            container_id: 0,
            host_id: 300_000,
            length: 65536,
        },
        gids: IdRange {
            container_id: 0,
            host_id: 400_000,
            length: 65536,
        },
    };
    let req = PinRequest {
        net: Some(dir.path().join("netns")),
        ipc: Some(dir.path().join("ipcns")),
        uts: Some(dir.path().join("utsns")),
        pid: Some(dir.path().join("pidns")),
        user: Some((dir.path().join("userns"), ids)),
        hostname: Some("pod-u".into()),
        sysctls: vec![("net.ipv4.ip_unprivileged_port_start".into(), "81".into())],
        ..Default::default()
    };
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_berthd"));
    let init = pin(exe, &req).await.expect("pin").expect("a pod init");
    struct Unpin<'a>(&'a PinRequest, berth::runtime::process::HostProcess);
    impl Drop for Unpin<'_> {
        fn drop(&mut self) {
            self.1.kill();
            unpin(self.0);
        }
    }
    let guard = Unpin(&req, init);
    let user = dir.path().join("userns");
    assert!(mounted(&user));
    // The pod init runs in the pinned user namespace, which maps the pod's ids.
    let init_user = std::fs::metadata(format!("/proc/{}/ns/user", init.pid)).expect("init ns");
    assert_eq!(
        init_user.ino(),
        std::fs::metadata(&user).expect("userns").ino()
    );
    let maps = |f: &str| {
        std::fs::read_to_string(format!("/proc/{}/{f}", init.pid))
            .expect("map")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(maps("uid_map"), "0 300000 65536");
    assert_eq!(maps("gid_map"), "0 400000 65536");
    // Inside the user namespace (as its root), joining the pod's namespaces works only because
    // they are owned by it; the host's UTS namespace would be refused.
    let u = format!("--user={}", user.display());
    let n = format!("--net={}", dir.path().join("netns").display());
    let t = format!("--uts={}", dir.path().join("utsns").display());
    let p = format!("--pid={}", dir.path().join("pidns").display());
    assert_eq!(
        nsenter(&[
            &u,
            &n,
            &t,
            &p,
            "sh",
            "-c",
            "id -u; hostname; cat /proc/sys/net/ipv4/ip_unprivileged_port_start"
        ]),
        "0\npod-u\n81"
    );
    let host_uts = Command::new("nsenter")
        .args([&u, "--uts=/proc/1/ns/uts", "true"])
        .output()
        .expect("nsenter");
    assert!(
        !host_uts.status.success(),
        "the host's UTS namespace is not the pod root's to join"
    );
    drop(guard);
    for f in ["netns", "ipcns", "utsns", "pidns", "userns"] {
        let p = dir.path().join(f);
        assert!(!p.exists() && !mounted(&p), "{} removed", p.display());
    }
}

#[tokio::test]
async fn bad_sysctls_are_refused_before_anything_is_made() {
    let dir = TempDir::new("pin-bad");
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_berthd"));
    let host_net_only = PinRequest {
        ipc: Some(dir.path().join("ipcns")),
        sysctls: vec![("net.ipv4.ip_forward".into(), "1".into())],
        ..Default::default()
    };
    let e = pin(exe, &host_net_only)
        .await
        .expect_err("net sysctl without a netns");
    assert!(matches!(e, PinError::SysctlNotAllowed(_)), "{e}");
    assert!(!dir.path().join("ipcns").exists());
    // A sysctl the kernel does not have fails in the child, and nothing stays pinned.
    let unknown = PinRequest {
        net: Some(dir.path().join("netns")),
        sysctls: vec![("net.core.no_such_knob".into(), "1".into())],
        ..Default::default()
    };
    let e = pin(exe, &unknown).await.expect_err("unknown sysctl");
    assert!(e.to_string().contains("no_such_knob"), "{e}");
    assert!(!dir.path().join("netns").exists() && !mounted(&dir.path().join("netns")));
}
