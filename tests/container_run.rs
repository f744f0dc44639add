//! Real containers through CRI: create, start, exit code, CRI log, stop, remove.

mod common;

use common::*;
use k8s_cri::v1 as cri;

#[tokio::test]
async fn a_container_runs_logs_and_reports_its_exit() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let sandbox_cfg = pod_config("runner", &logs, cri::NamespaceMode::Container);
    let sandbox = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_cfg.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox")
        .into_inner()
        .pod_sandbox_id;
    let id = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(sh_container(
                "echo",
                &busybox,
                "echo hello; echo oops >&2; printf unterminated; exit 3",
                cri::NamespaceMode::Container,
            )),
            sandbox_config: Some(sandbox_cfg.clone()),
        })
        .await
        .expect("create")
        .into_inner()
        .container_id;
    let listed = c
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].state,
        cri::ContainerState::ContainerCreated as i32
    );
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("start");
    let s = wait_exited(&c, &id).await;
    assert_eq!(s.exit_code, 3);
    assert!(s.finished_at >= s.started_at && s.started_at > 0);
    // Complete once the exit is reported, the unterminated last line included as a partial
    // record, as containerd writes it (the kubelet reads the log at once for a
    // FallbackToLogsOnError termination message, and adds a newline only after F records).
    let log = std::fs::read_to_string(logs.join("echo.log")).expect("log");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 3, "{log}");
    assert!(
        lines.iter().any(|l| l.ends_with(" stdout P unterminated")),
        "{log}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with(" stdout F hello")),
        "{log}"
    );
    assert!(lines.iter().any(|l| l.ends_with(" stderr F oops")), "{log}");

    // A container that ignores SIGTERM is killed after the timeout.
    let sleeper = run_container(
        &c,
        &sandbox,
        &sandbox_cfg,
        sh_container(
            "sleeper",
            &busybox,
            "sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    // ExecSync inside the running container: output, exit code, timeout.
    let exec = |cmd: &[&str], timeout: i64| {
        let c = c.clone();
        let req = cri::ExecSyncRequest {
            container_id: sleeper.clone(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        };
        async move { c.runtime().exec_sync(req).await.map(|r| r.into_inner()) }
    };
    let r = exec(&["echo", "hi"], 10).await.expect("exec echo");
    assert_eq!((r.stdout.as_slice(), r.exit_code), (b"hi\n".as_slice(), 0));
    let r = exec(&["sh", "-c", "echo e >&2; exit 4"], 10)
        .await
        .expect("exec exit 4");
    assert_eq!((r.stderr.as_slice(), r.exit_code), (b"e\n".as_slice(), 4));
    let e = exec(&["sleep", "30"], 1).await.expect_err("times out");
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    let e = exec(&[], 1).await.expect_err("empty cmd");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: sleeper.clone(),
            timeout: 1,
        })
        .await
        .expect("stop");
    let s = wait_exited(&c, &sleeper).await;
    assert_eq!(s.exit_code, 137, "SIGKILL after the timeout");
    c.runtime()
        .remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .expect("remove");
    // A running container goes with its sandbox: stop then remove the pod.
    let last = run_container(
        &c,
        &sandbox,
        &sandbox_cfg,
        sh_container(
            "last",
            &busybox,
            "sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .expect("stop sandbox");
    let s = wait_exited(&c, &last).await;
    assert_eq!(s.exit_code, 137);
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        })
        .await
        .expect("remove sandbox");
    let listed = c
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert!(
        listed.is_empty(),
        "containers removed with their sandbox: {listed:?}"
    );
    let left: Vec<_> = std::fs::read_dir(d.root().join("containers"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_reported_oom_killed() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("oom", &logs, mode);
    let pod = run_pod(&c, &pod_cfg).await;
    // `tail` keeps the whole of /dev/zero (one endless line) in memory.
    let mut cfg = sh_container("hog", &busybox, "tail /dev/zero", mode);
    if let Some(linux) = cfg.linux.as_mut() {
        linux.resources = Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        });
    }
    let hog = run_container(&c, &pod, &pod_cfg, cfg).await;
    let s = wait_exited(&c, &hog).await;
    assert_eq!(
        (s.reason.as_str(), s.exit_code),
        ("OOMKilled", 137),
        "{s:?}"
    );
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn unknown_ids_are_not_found_and_stop_remove_are_idempotent() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let rt = c.runtime();
    let unknown = "0123456789abcdef-no-such-container";
    let code = |r: Result<(), tonic::Status>| r.expect_err("must fail").code();
    let not_found = tonic::Code::NotFound;
    let e = container_status(&c, unknown).await.expect_err("status");
    assert_eq!(e.code(), not_found);
    assert!(e.message().contains(unknown), "{e:?}");
    let start = rt
        .clone()
        .start_container(cri::StartContainerRequest {
            container_id: unknown.into(),
        })
        .await;
    assert_eq!(code(start.map(|_| ())), not_found);
    assert_eq!(
        code(exec(&c, unknown, &["true"], 5).await.map(|_| ())),
        not_found
    );
    let update = rt
        .clone()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: unknown.into(),
            linux: Some(Default::default()),
            ..Default::default()
        })
        .await;
    assert_eq!(code(update.map(|_| ())), not_found);
    let reopen = rt
        .clone()
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: unknown.into(),
        })
        .await;
    assert_eq!(code(reopen.map(|_| ())), not_found);

    // Stop and remove: unknown, exited, and already removed are all fine.
    let stop = |id: String| {
        let rt = rt.clone();
        async move {
            rt.clone()
                .stop_container(cri::StopContainerRequest {
                    container_id: id,
                    timeout: 1,
                })
                .await
                .map(|_| ())
        }
    };
    let remove = |id: String| {
        let rt = rt.clone();
        async move {
            rt.clone()
                .remove_container(cri::RemoveContainerRequest { container_id: id })
                .await
                .map(|_| ())
        }
    };
    stop(unknown.into()).await.expect("stop unknown");
    remove(unknown.into()).await.expect("remove unknown");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("idem", &logs, mode);
    let pod = run_pod(&c, &pod_cfg).await;
    let done = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("done", &busybox, "true", mode),
    )
    .await;
    wait_exited(&c, &done).await;
    stop(done.clone()).await.expect("stop exited");
    stop(done.clone()).await.expect("stop exited twice");
    // Start of an exited container is a precondition failure, not a crash.
    let again = rt
        .clone()
        .start_container(cri::StartContainerRequest {
            container_id: done.clone(),
        })
        .await;
    assert_eq!(code(again.map(|_| ())), tonic::Code::FailedPrecondition);
    remove(done.clone()).await.expect("remove");
    remove(done.clone()).await.expect("remove twice");
    assert_eq!(
        container_status(&c, &done).await.expect_err("gone").code(),
        not_found
    );
    // Creating in a stopped pod is a precondition failure.
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("stop pod");
    let e = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(sh_container("late", &busybox, "true", mode)),
            sandbox_config: Some(pod_cfg.clone()),
        })
        .await
        .expect_err("stopped pod");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    remove_pod(&c, &pod).await;
}
