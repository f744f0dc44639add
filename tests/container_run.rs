//! Real containers through CRI: create, start, exit code, CRI log, stop, remove.

mod common;

use common::*;
use k8s_cri::{v1 as cri, v1alpha2 as a2};

#[tokio::test]
async fn a_container_runs_logs_and_reports_its_exit() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    let pulled = pull(&c, &busybox).await.expect("pull");
    // Status says what Berth supports: recursive read-only mounts (this kernel has
    // mount_setattr), pods with their own user namespace (idmapped mounts work here), the
    // supplemental-groups policies.
    let st = c
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .into_inner();
    assert_eq!(st.runtime_handlers.len(), 1, "{st:?}");
    assert_eq!(st.runtime_handlers[0].name, "");
    let handler = st.runtime_handlers[0].features.expect("handler features");
    assert!(handler.recursive_read_only_mounts, "{st:?}");
    assert!(handler.user_namespaces, "{st:?}");
    assert!(st.features.is_some_and(|f| f.supplemental_groups_policy));
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
    let listed = list_containers(&c).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].state,
        cri::ContainerState::ContainerCreated as i32
    );
    // image_id is the image's id, as PullImage answered and ImageStatus shows it, in the list
    // and in the status.
    assert_eq!(
        status(&c, &busybox).await.map(|i| i.id),
        Some(pulled.clone())
    );
    assert_eq!(listed[0].image_id, pulled);
    assert_eq!(
        container_status(&c, &id).await.expect("status").image_id,
        pulled
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
    // Checkpoints need CRIU, which cannot run on every kernel: the reason, never Unimplemented.
    let checkpoint = |id: &str| {
        let c = c.clone();
        let req = cri::CheckpointContainerRequest {
            container_id: id.to_string(),
            location: "/tmp/berth-checkpoint-never.tar".into(),
            timeout: 10,
        };
        async move { c.runtime().checkpoint_container(req).await }
    };
    let e = checkpoint(&sleeper).await.expect_err("no checkpoint");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(&sleeper) && e.message().contains("CRIU"),
        "{e:?}"
    );
    let e = checkpoint("nosuchcontainer").await.expect_err("unknown");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

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
    let listed = list_containers(&c).await;
    assert!(
        listed.is_empty(),
        "containers removed with their sandbox: {listed:?}"
    );
    let left = common::settled_entries(&d.root().join("containers"));
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

/// StopContainer as the container's process exits on its own (its shim has reaped it, berthd
/// has not yet recorded the exit) succeeds, and the container reads exited with its own exit
/// code as soon as the call returns: a node agent stopping a pod at that moment reports the
/// container terminated, not still running.
#[tokio::test]
async fn a_container_stopped_as_it_exits_reports_its_own_exit() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("stop-exiting", &logs, mode);
    let pod = run_pod(&c, &pod_cfg).await;
    for i in 0..30 {
        let name = format!("exiting-{i}");
        let id = run_container(
            &c,
            &pod,
            &pod_cfg,
            sh_container(&name, &busybox, "exit 3", mode),
        )
        .await;
        c.runtime()
            .stop_container(cri::StopContainerRequest {
                container_id: id.clone(),
                timeout: 5,
            })
            .await
            .unwrap_or_else(|e| panic!("stop of {name} as it exits: {e:?}"));
        let s = container_status(&c, &id).await.expect("ContainerStatus");
        assert_eq!(
            (s.state, s.exit_code),
            (cri::ContainerState::ContainerExited as i32, 3),
            "{name} right after StopContainer: {s:?}"
        );
        c.runtime()
            .remove_container(cri::RemoveContainerRequest { container_id: id })
            .await
            .expect("remove");
    }
    remove_pod(&c, &pod).await;
}

/// ListContainers and ListPodSandbox of both API versions, with and without filters.
async fn lists(
    c: &berth::client::CriClient,
    filter: Option<cri::ContainerFilter>,
) -> (Vec<cri::Container>, Vec<a2::Container>) {
    let v1 = c
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: filter.clone(),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    let old = a2::runtime_service_client::RuntimeServiceClient::new(c.channel())
        .list_containers(a2::ListContainersRequest {
            filter: filter.map(|f| a2::ContainerFilter {
                id: f.id,
                state: f.state.map(|s| a2::ContainerStateValue { state: s.state }),
                pod_sandbox_id: f.pod_sandbox_id,
                label_selector: f.label_selector,
            }),
        })
        .await
        .expect("v1alpha2 ListContainers")
        .into_inner()
        .containers;
    (v1, old)
}

async fn pod_states(c: &berth::client::CriClient) -> (Vec<i32>, Vec<i32>) {
    let v1 = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    let old = a2::runtime_service_client::RuntimeServiceClient::new(c.channel())
        .list_pod_sandbox(a2::ListPodSandboxRequest { filter: None })
        .await
        .expect("v1alpha2 ListPodSandbox")
        .into_inner()
        .items;
    for (new, old) in v1.iter().zip(&old) {
        assert_eq!((&new.id, &new.labels), (&old.id, &old.labels));
        assert_eq!(
            new.metadata.as_ref().map(|m| &m.name),
            old.metadata.as_ref().map(|m| &m.name)
        );
    }
    (
        v1.iter().map(|p| p.state).collect(),
        old.iter().map(|p| p.state).collect(),
    )
}

#[tokio::test]
async fn lists_follow_every_change_in_both_api_versions() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mut pod_cfg = pod_config("lister", &logs, cri::NamespaceMode::Container);
    pod_cfg.labels.insert("tier".into(), "web".into());
    let pod = run_pod(&c, &pod_cfg).await;
    let mut cfg = sh_container(
        "worker",
        &busybox,
        "trap 'exit 0' TERM; sleep 1000 & wait",
        cri::NamespaceMode::Container,
    );
    cfg.labels.insert("role".into(), "worker".into());
    cfg.annotations.insert("note".into(), "kept".into());
    let id = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(cfg.clone()),
            sandbox_config: Some(pod_cfg.clone()),
        })
        .await
        .expect("create")
        .into_inner()
        .container_id;
    let state = |s: cri::ContainerState| s as i32;
    let (v1, old) = lists(&c, None).await;
    assert_eq!((v1.len(), old.len()), (1, 1));
    assert_eq!(v1[0].state, state(cri::ContainerState::ContainerCreated));
    assert_eq!(old[0].state, v1[0].state);
    assert_eq!(
        (&old[0].id, &old[0].pod_sandbox_id, &old[0].image_ref),
        (&v1[0].id, &v1[0].pod_sandbox_id, &v1[0].image_ref)
    );
    assert_eq!(
        (&old[0].labels, &old[0].annotations),
        (&cfg.labels, &cfg.annotations)
    );
    assert_eq!(old[0].created_at, v1[0].created_at);
    assert_eq!(
        old[0].image.as_ref().map(|i| &i.image),
        Some(&busybox),
        "{:?}",
        old[0]
    );
    assert_eq!(pod_states(&c).await, (vec![0], vec![0]), "pod ready");

    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("start");
    let running = |s| {
        Some(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue { state: state(s) }),
            ..Default::default()
        })
    };
    let (v1, old) = lists(&c, running(cri::ContainerState::ContainerRunning)).await;
    assert_eq!((v1.len(), old.len()), (1, 1), "running after start");
    assert_eq!(old[0].state, state(cri::ContainerState::ContainerRunning));
    let by_label = Some(cri::ContainerFilter {
        label_selector: [("role".to_string(), "worker".to_string())].into(),
        ..Default::default()
    });
    assert_eq!(lists(&c, by_label).await.1.len(), 1);
    let other_label = Some(cri::ContainerFilter {
        label_selector: [("role".to_string(), "db".to_string())].into(),
        ..Default::default()
    });
    assert_eq!(lists(&c, other_label).await.1.len(), 0);

    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 10,
        })
        .await
        .expect("stop");
    let (v1, old) = lists(&c, None).await;
    assert_eq!(v1[0].state, state(cri::ContainerState::ContainerExited));
    assert_eq!(old[0].state, v1[0].state);
    assert!(
        lists(&c, running(cri::ContainerState::ContainerRunning))
            .await
            .1
            .is_empty()
    );
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("stop pod");
    assert_eq!(pod_states(&c).await, (vec![1], vec![1]), "pod not ready");
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await
        .expect("remove pod");
    let (v1, old) = lists(&c, None).await;
    assert!(v1.is_empty() && old.is_empty(), "{v1:?} {old:?}");
    assert_eq!(pod_states(&c).await, (vec![], vec![]));
}
