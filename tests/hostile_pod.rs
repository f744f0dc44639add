//! Hostile pods against the runtime, played through CRI: a shared-PID pod looking for the host
//! through its pod init, a container that plants its working directory for the next exec, and
//! the exec's standing with the OOM killer. An escape is detected by a marker directory the
//! test makes on the host: a vulnerable Berth would only list or write inside it.

mod common;

use common::*;
use k8s_cri::v1 as cri;

/// A directory on the host holding one marker file, which a container must never see or
/// change; returns the directory, the marker's name and its content.
fn host_marker() -> (TempDir, String, String) {
    let dir = TempDir::new("hostile-marker");
    let name = format!("marker-{}", dir.unique_name());
    let content = format!("host secret {}", dir.unique_name());
    std::fs::write(dir.path().join(&name), &content).expect("marker");
    (dir, name, content)
}

/// The names in the marker directory: only the marker, unless something escaped.
fn entries(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("marker dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A pod config with its own cgroup parent (as the kubelet sends), PID per `pid`.
fn pod_with_cgroup(
    name: &str,
    logs: &std::path::Path,
    pid: cri::NamespaceMode,
) -> cri::PodSandboxConfig {
    let mut cfg = pod_config(name, logs, pid);
    if let Some(l) = cfg.linux.as_mut() {
        l.cgroup_parent = format!("/berth-it-{name}-{}", std::process::id());
    }
    cfg
}

/// Adds `caps` to a container's capabilities.
fn with_caps(mut c: cri::ContainerConfig, caps: &[&str]) -> cri::ContainerConfig {
    if let Some(sc) = c.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.capabilities = Some(cri::Capability {
            add_capabilities: caps.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
    }
    c
}

/// ExecSync of `sh -c script`: (exit code, stdout + stderr), or the call's error as text.
async fn sh(c: &berth::client::CriClient, id: &str, script: &str) -> Result<(i32, String), String> {
    exec(c, id, &["sh", "-c", script], 10)
        .await
        .map(|r| {
            (
                r.exit_code,
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&r.stdout),
                    String::from_utf8_lossy(&r.stderr)
                ),
            )
        })
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

#[tokio::test]
async fn the_pod_init_of_a_shared_pid_pod_shows_nothing_of_the_host() {
    let (marker_dir, marker, secret) = host_marker();
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let pod_cfg = pod_with_cgroup("hostile-pidns", &logs, cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &pod_cfg).await;
    let pod_mode = cri::NamespaceMode::Pod;
    let plain = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("plain", &busybox, "exec sleep 1000", pod_mode),
    )
    .await;
    let tracer = run_container(
        &c,
        &pod,
        &pod_cfg,
        with_caps(
            sh_container("tracer", &busybox, "exec sleep 1001", pod_mode),
            &["SYS_PTRACE"],
        ),
    )
    .await;
    let marker_path = marker_dir.path().join(&marker);
    let marker_path = marker_path.display();
    let dir_path = marker_dir.path().display();

    for (who, id) in [
        ("without CAP_SYS_PTRACE", &plain),
        ("with CAP_SYS_PTRACE", &tracer),
    ] {
        let (_, cmdline) = sh(&c, id, "cat /proc/1/cmdline").await.expect("exec");
        assert!(
            cmdline.starts_with("berth-pod-init"),
            "{who}: pid 1 is the pod init: {cmdline:?}"
        );

        // Its mount table, when readable at all, is its own empty root and nothing else.
        let (code, mountinfo) = sh(&c, id, "cat /proc/1/mountinfo").await.expect("exec");
        if code == 0 {
            let points: Vec<&str> = mountinfo
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .collect();
            assert!(
                points.iter().all(|p| *p == "/") && points.len() <= 1,
                "{who}: /proc/1/mountinfo names host mounts:\n{mountinfo}"
            );
        }

        // Its root holds nothing, and the host's files are not behind it.
        let (_, listing) = sh(&c, id, "ls -A /proc/1/root/ 2>&1; echo end")
            .await
            .expect("exec");
        let listed: Vec<&str> = listing
            .lines()
            .filter(|l| *l != "end" && !l.contains("Permission denied"))
            .collect();
        assert!(listed.is_empty(), "{who}: /proc/1/root lists {listed:?}");
        let (_, read) = sh(&c, id, &format!("cat /proc/1/root{marker_path} 2>&1"))
            .await
            .expect("exec");
        assert!(
            !read.contains(&secret),
            "{who}: read the host's marker: {read}"
        );
        let _ = sh(
            &c,
            id,
            &format!("echo pwned > /proc/1/root{dir_path}/written 2>&1; mkdir /proc/1/root{dir_path}/made 2>&1"),
        )
        .await
        .expect("exec");
        assert_eq!(
            entries(&marker_dir),
            vec![marker.clone()],
            "{who}: wrote on the host"
        );
    }

    // The init itself holds no capability and is no longer root.
    let inits: Vec<u32> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"berth-pod-init\0"))
                && std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
                    c.contains(&format!("berth-it-hostile-pidns-{}", std::process::id()))
                })
        })
        .collect();
    assert_eq!(inits.len(), 1, "the pod's init: {inits:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", inits[0])).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    for set in ["CapEff:", "CapPrm:", "CapBnd:", "CapAmb:", "CapInh:"] {
        assert_eq!(
            field(set),
            "0000000000000000",
            "{set} of the pod init\n{status}"
        );
    }
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "a seccomp filter");
    assert!(field("Uid:").starts_with("65535"), "uid: {}", field("Uid:"));

    // The pod still works as a shared-PID pod: orphans are reaped by the contained init.
    sh(&c, &plain, "sleep 0.2 & exit 0").await.expect("exec");
    let mut zombies = String::from("not checked");
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        zombies = sh(
            &c,
            &tracer,
            "grep -l '^State:.*Z' /proc/[0-9]*/status || true",
        )
        .await
        .expect("exec")
        .1;
        if zombies.trim().is_empty() {
            break;
        }
    }
    assert!(zombies.trim().is_empty(), "zombies left: {zombies}");
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn exec_refuses_a_working_directory_planted_to_lead_out() {
    let (marker_dir, marker, _) = host_marker();
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    // In the host's PID namespace the test's own process is visible: its root is the host's,
    // the most a planted link can reach (a shared-PID pod's init has an empty root; the link
    // there must fail as well, and so must a link through the exec's own /proc entry).
    for (tag, pid_mode, target) in [
        (
            "host-pid",
            cri::NamespaceMode::Node,
            format!(
                "/proc/{}/root{}",
                std::process::id(),
                marker_dir.path().display()
            ),
        ),
        (
            "pod-pid",
            cri::NamespaceMode::Pod,
            format!("/proc/1/root{}", marker_dir.path().display()),
        ),
        (
            "self",
            cri::NamespaceMode::Pod,
            "/proc/self/cwd".to_string(),
        ),
    ] {
        let name = format!("hostile-cwd-{tag}");
        let pod_cfg = pod_with_cgroup(&name, &logs, pid_mode);
        let pod = run_pod(&c, &pod_cfg).await;
        let mut cfg = sh_container(
            "planter",
            &busybox,
            &format!(
                "cd / && rm -rf /tmp && ln -s {target} /tmp && touch /planted && exec sleep 1000"
            ),
            pid_mode,
        );
        cfg.working_dir = "/tmp".into();
        let id = run_container(&c, &pod, &pod_cfg, cfg).await;
        // Seen from the host: the container's root holds /planted once the link is there.
        let pid = container_info(&c, &id).await["pid"].as_i64().expect("pid");
        let planted = std::path::PathBuf::from(format!("/proc/{pid}/root/planted"));
        for _ in 0..200 {
            if planted.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(planted.exists(), "{tag}: the container planted its link");
        let got = sh(&c, &id, "pwd; touch escaped; echo ran").await;
        match &got {
            Ok((code, out)) => {
                assert!(
                    !out.contains("ran"),
                    "{tag}: exec ran in the planted directory: {out}"
                );
                assert_ne!(*code, 0, "{tag}: {out}");
            }
            Err(message) => assert!(
                message.contains("/tmp") && message.contains(&id),
                "{tag}: the error names the directory and the container: {message}"
            ),
        }
        assert_eq!(
            entries(&marker_dir),
            vec![marker.clone()],
            "{tag}: wrote on the host"
        );
        remove_pod(&c, &pod).await;
    }
}

#[tokio::test]
async fn an_exec_has_the_containers_oom_score_adj() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let pod_cfg = pod_with_cgroup("hostile-oom", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &pod_cfg).await;
    let mut cfg = sh_container(
        "victim",
        &busybox,
        "exec sleep 1000",
        cri::NamespaceMode::Container,
    );
    if let Some(l) = cfg.linux.as_mut() {
        l.resources = Some(cri::LinuxContainerResources {
            oom_score_adj: 937,
            ..Default::default()
        });
    }
    let id = run_container(&c, &pod, &pod_cfg, cfg).await;
    let init = exec_ok(&c, &id, &["cat", "/proc/1/oom_score_adj"]).await;
    assert_eq!(init.trim(), "937", "the container's init");
    let own = exec_ok(&c, &id, &["cat", "/proc/self/oom_score_adj"]).await;
    assert_eq!(own.trim(), "937", "the exec'd process");
    remove_pod(&c, &pod).await;
}
