//! Namespaces shared inside a pod: one PID namespace with Berth's pod init, network, IPC and
//! UTS; PID mode TARGET; a pod's init ends with the pod.

mod common;

use common::*;
use k8s_cri::v1 as cri;

/// Host pids of the `berth-pod-init` processes of pod `pod` (those in its pinned PID
/// namespace; other tests' pods run at the same time).
fn pod_inits(d: &Daemon, pod: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(pinned) = std::fs::metadata(d.state().join("sandboxes").join(pod).join("pidns")) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let ns = std::fs::metadata(e.path().join("ns/pid")).ok()?;
            (cmd.starts_with(b"berth-pod-init\0") && ns.ino() == pinned.ino()).then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn containers_of_a_pod_share_its_pid_namespace_and_its_init_reaps_orphans() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mut pod_cfg = pod_config("sharing", &logs, cri::NamespaceMode::Pod);
    // With a pod cgroup, as the kubelet always sends (on cgroup v1 the init must be able to
    // join a fresh cpuset cgroup).
    let parent = format!("/berth-it-sharing-{}", std::process::id());
    let _cgroups = CgroupRoot::made_by_the_test(parent.trim_start_matches('/').to_string());
    if let Some(l) = pod_cfg.linux.as_mut() {
        l.cgroup_parent = parent.clone();
    }
    let pod = run_pod(&c, &pod_cfg).await;
    let inits = pod_inits(&d, &pod);
    assert_eq!(inits.len(), 1, "one pod init for the pod");
    let init = inits[0];
    let cgroups = std::fs::read_to_string(format!("/proc/{init}/cgroup")).expect("cgroup");
    // In a leaf of its own below the pod cgroup: cgroup v2 allows no process beside the
    // containers' cgroups.
    let leaf = format!("{parent}/berth-pod-init");
    assert!(
        cgroups
            .lines()
            .all(|l| l.ends_with(&leaf) || !l.contains(":cpu")),
        "the pod init is in its leaf of the pod cgroup: {cgroups}"
    );

    let pod_mode = cri::NamespaceMode::Pod;
    let a = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container(
            "a",
            &busybox,
            "echo $$ > /dev/shm/a-pid; exec sleep 1000",
            pod_mode,
        ),
    )
    .await;
    let b = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("b", &busybox, "exec sleep 1001", pod_mode),
    )
    .await;

    // From b: pid 1 is Berth's init, and a's sleep is visible.
    let cmdline = exec_ok(&c, &b, &["cat", "/proc/1/cmdline"]).await;
    assert!(cmdline.starts_with("berth-pod-init"), "{cmdline:?}");
    let ps = exec_ok(
        &c,
        &b,
        &["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
    )
    .await;
    assert!(
        ps.contains("sleep 1000") && ps.contains("sleep 1001"),
        "{ps}"
    );
    // IPC is shared too: a wrote its pid into the pod's /dev/shm.
    let a_pid = exec_ok(&c, &b, &["cat", "/dev/shm/a-pid"]).await;
    let a_pid = a_pid.trim();
    assert_ne!(a_pid, "1", "a is not pid 1 of the shared namespace");
    assert!(
        exec_ok(&c, &b, &["cat", &format!("/proc/{a_pid}/cmdline")])
            .await
            .starts_with("sleep"),
        "b sees a's process under a's own pid"
    );
    // Hostname (UTS) and network are the pod's.
    assert_eq!(exec_ok(&c, &a, &["hostname"]).await.trim(), "sharing");

    // An orphan re-parented to the pod init is reaped, not left a zombie.
    exec_ok(&c, &a, &["sh", "-c", "sleep 0.2 & exit 0"]).await;
    let mut zombies = String::from("not checked");
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        zombies = exec_ok(
            &c,
            &b,
            &[
                "sh",
                "-c",
                "grep -l '^State:.*Z' /proc/[0-9]*/status || true",
            ],
        )
        .await;
        if zombies.trim().is_empty() {
            break;
        }
    }
    assert!(zombies.trim().is_empty(), "zombies left: {zombies}");

    // PID mode TARGET joins a's namespace.
    let mut target = sh_container("t", &busybox, "exec sleep 1002", cri::NamespaceMode::Target);
    if let Some(ns) = target
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.target_id = a.clone();
    }
    let t = run_container(&c, &pod, &pod_cfg, target).await;
    let ps = exec_ok(
        &c,
        &t,
        &["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
    )
    .await;
    assert!(ps.contains("sleep 1000"), "{ps}");
    // A TARGET that does not exist is NotFound.
    let mut bad = sh_container("bad", &busybox, "true", cri::NamespaceMode::Target);
    if let Some(ns) = bad
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.target_id = "0000no-such-container".into();
    }
    let e = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(bad),
            sandbox_config: Some(pod_cfg.clone()),
        })
        .await
        .expect_err("unknown target");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // Stopping the pod ends its init (and with it anything left in the namespace).
    remove_pod(&c, &pod).await;
    // Gone, or a zombie waiting for the host's init (this machine's pid 1 does not reap).
    let state = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap_or_default();
    let state = state.rsplit(')').next().unwrap_or_default().trim_start();
    assert!(
        state.is_empty() || state.starts_with('Z'),
        "pod init still runs: {state}"
    );
    // The pod cgroup and the init's leaf went with the pod.
    for h in hierarchies() {
        let dir = h.join(parent.trim_start_matches('/'));
        assert!(!dir.exists(), "{} left after the pod", dir.display());
    }
    let _ = (a, b, t);
}

#[tokio::test]
async fn container_pid_mode_gets_a_private_namespace_and_no_pod_init() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let pod_cfg = pod_config("private", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &pod_cfg).await;
    let pidns = d.state().join("sandboxes").join(&pod).join("pidns");
    assert!(
        !pidns.exists() && pod_inits(&d, &pod).is_empty(),
        "no pod init"
    );
    let mode = cri::NamespaceMode::Container;
    let a = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("a", &busybox, "exec sleep 1000", mode),
    )
    .await;
    assert_eq!(
        exec_ok(&c, &a, &["cat", "/proc/1/cmdline"]).await,
        "sleep\u{0}1000\u{0}"
    );
    remove_pod(&c, &pod).await;
}
