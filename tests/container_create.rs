//! CreateContainer's checks through a real berthd: each bad request gets its code and leaves no
//! snapshot, mount or bundle behind.

mod common;

use common::*;
use k8s_cri::v1 as cri;
use tonic::Code;

fn sandbox_config() -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "cc".into(),
            uid: "uid-cc".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    }
}

fn container(image: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), "echo hi".into()],
        // As the kubelet sends it: its own PID namespace, the pod's network and IPC.
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: cri::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn try_create(
    c: &berth::client::CriClient,
    sandbox: &str,
    config: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    c.runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config()),
        })
        .await
        .map(|r| r.into_inner().container_id)
}

async fn create(
    c: &berth::client::CriClient,
    sandbox: &str,
    config: cri::ContainerConfig,
) -> tonic::Status {
    try_create(c, sandbox, config)
        .await
        .expect_err("a bad request")
}

fn nothing_left(d: &Daemon, layers: usize) {
    assert_eq!(
        d.snapshot_dirs().len(),
        layers,
        "only the image's layers: {:?}",
        d.snapshot_dirs()
    );
    let bundles = common::settled_entries(&d.root().join("containers"));
    assert!(bundles.is_empty(), "bundles left: {bundles:?}");
    let root = d.root().to_string_lossy().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts.contains(&format!("{root}/containers")),
        "rootfs mount left"
    );
}

#[tokio::test]
async fn create_container_checks_its_input_and_leaves_nothing() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let layers = d.snapshot_dirs().len();
    let sandbox = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config()),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox")
        .into_inner()
        .pod_sandbox_id;

    let e = create(&c, "no-such-sandbox", container(&busybox)).await;
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("no-such-sandbox"));

    let missing = image("not-pulled");
    let e = create(&c, &sandbox, container(&missing)).await;
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains(&missing), "{}", e.message());

    let mut relative = container(&busybox);
    relative.mounts.push(cri::Mount {
        container_path: "data".into(),
        host_path: "/tmp".into(),
        ..Default::default()
    });
    let e = create(&c, &sandbox, relative).await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("container_path"), "{}", e.message());
    nothing_left(&d, layers);

    // Impossible resources: a negative memory limit, swap below the memory limit.
    for (memory, swap, field) in [
        (-1, 0, "memory_limit_in_bytes"),
        (64 << 20, 32 << 20, "memory_swap_limit_in_bytes"),
    ] {
        let mut r = container(&busybox);
        if let Some(l) = r.linux.as_mut() {
            l.resources = Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: memory,
                memory_swap_limit_in_bytes: swap,
                ..Default::default()
            });
        }
        let e = create(&c, &sandbox, r).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{}", e.message());
        nothing_left(&d, layers);
    }

    let mut seccomp = container(&busybox);
    if let Some(sc) = seccomp
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.seccomp = Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Localhost as i32,
            localhost_ref: "/nonexistent/profile.json".into(),
        });
    }
    let e = create(&c, &sandbox, seccomp).await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("/nonexistent/profile.json"),
        "{}",
        e.message()
    );
    nothing_left(&d, layers);

    // A valid request makes a container; removing it leaves nothing.
    let id = try_create(&c, &sandbox, container(&busybox))
        .await
        .expect("create");
    c.runtime()
        .remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .expect("remove");
    nothing_left(&d, layers);

    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .expect("stop");
    let e = create(&c, &sandbox, container(&busybox)).await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        })
        .await
        .expect("remove");
    nothing_left(&d, layers);
}

#[tokio::test]
async fn a_retried_create_gets_the_first_calls_container_and_a_different_one_conflicts() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let pod = run_pod(&c, &sandbox_config()).await;
    // Two identical calls at once (a kubelet retry racing its first call) and one after.
    let (a, b) = tokio::join!(
        try_create(&c, &pod, container(&busybox)),
        try_create(&c, &pod, container(&busybox))
    );
    let (a, b) = (a.expect("first"), b.expect("retry"));
    assert_eq!(a, b, "a retry gets the first call's container");
    let again = try_create(&c, &pod, container(&busybox))
        .await
        .expect("late retry");
    assert_eq!(again, a);
    // Only one container was made.
    let listed = list_containers(&c).await;
    assert_eq!(listed.len(), 1);
    // The same name with a different request is AlreadyExists, naming the holder.
    let mut other = container(&busybox);
    other.command = vec!["sh".into(), "-c".into(), "echo other".into()];
    let e = create(&c, &pod, other.clone()).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains(&a), "{e:?}");
    // Once removed, the name is free.
    c.runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: a.clone(),
        })
        .await
        .expect("remove");
    let fresh = try_create(&c, &pod, other).await.expect("name free again");
    assert_ne!(fresh, a);
    remove_pod(&c, &pod).await;
}

/// A request whose caller gives up after 2 ms, far sooner than the work takes.
fn with_2ms_deadline<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(std::time::Duration::from_millis(2));
    req
}

const CREATED: i32 = cri::ContainerEventType::ContainerCreatedEvent as i32;

#[tokio::test]
async fn calls_cut_short_by_their_deadline_finish_and_a_retry_gets_their_result() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let layers = d.snapshot_dirs().len();
    let mut events = c
        .runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .expect("events")
        .into_inner();
    let mut next_event = async || {
        tokio::time::timeout(std::time::Duration::from_secs(20), events.message())
            .await
            .expect("an event in time")
            .expect("event stream")
            .expect("an event")
    };
    // Deadlines far shorter than the work: the caller gives up (its client may say Cancelled
    // before berthd says DeadlineExceeded), and the sandbox and the container are made all
    // the same (their events come), and the retries get them.
    let cut_short = |e: tonic::Status| {
        assert!(
            matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{e:?}"
        )
    };
    let run = with_2ms_deadline(cri::RunPodSandboxRequest {
        config: Some(sandbox_config()),
        runtime_handler: String::new(),
    });
    cut_short(
        c.runtime()
            .run_pod_sandbox(run)
            .await
            .expect_err("deadline"),
    );
    let made = next_event().await;
    assert_eq!(made.container_event_type, CREATED);
    let pod = run_pod(&c, &sandbox_config()).await;
    assert_eq!(
        made.container_id, pod,
        "the retry gets the first call's sandbox"
    );
    assert_eq!(
        next_event().await.container_event_type,
        cri::ContainerEventType::ContainerStartedEvent as i32
    );
    let create = with_2ms_deadline(cri::CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(container(&busybox)),
        sandbox_config: Some(sandbox_config()),
    });
    cut_short(
        c.runtime()
            .create_container(create)
            .await
            .expect_err("deadline"),
    );
    let made = next_event().await;
    assert_eq!(made.container_event_type, CREATED);
    let id = try_create(&c, &pod, container(&busybox))
        .await
        .expect("retry");
    assert_eq!(
        made.container_id, id,
        "the retry gets the first call's container: {made:?}"
    );
    let listed = list_containers(&c).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    c.runtime()
        .remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .expect("remove");
    remove_pod(&c, &pod).await;
    nothing_left(&d, layers);
}

/// Shims running for containers under `d`'s root.
fn shims_of(d: &Daemon) -> Vec<String> {
    let needle = d.root().join("containers").to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("berth-shim") && cmd.contains(&needle)).then_some(cmd)
        })
        .collect()
}

#[tokio::test]
async fn a_pod_removed_while_a_container_is_created_in_it_takes_the_container_with_it() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let layers = d.snapshot_dirs().len();
    let mut sleeper = container(&busybox);
    sleeper.command = vec!["sleep".into(), "60".into()];
    // The removal lands at every point of the creation: before, during preparation, while
    // the shim starts, after. Whatever the order, no container outlives its pod.
    let mut created = 0;
    for round in 0..16u64 {
        let pod = run_pod(&c, &sandbox_config()).await;
        let (creator, config, sandbox) = (c.clone(), sleeper.clone(), pod.clone());
        let creation = tokio::spawn(async move {
            let id = try_create(&creator, &sandbox, config).await?;
            // Started if it still exists, as the kubelet and the agent do next.
            let _ = creator
                .runtime()
                .start_container(cri::StartContainerRequest {
                    container_id: id.clone(),
                })
                .await;
            Ok::<_, tonic::Status>(id)
        });
        tokio::time::sleep(std::time::Duration::from_millis(round * 4)).await;
        c.runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            })
            .await
            .expect("RemovePodSandbox");
        match creation.await.expect("creation task") {
            Ok(_) => created += 1,
            Err(e) => assert!(
                matches!(e.code(), Code::NotFound | Code::FailedPrecondition),
                "round {round}: {e:?}"
            ),
        }
        let left = list_containers(&c).await;
        assert!(
            left.is_empty(),
            "round {round}: containers outlived their pod: {left:?}"
        );
        assert_eq!(shims_of(&d), Vec::<String>::new(), "round {round}");
        nothing_left(&d, layers);
    }
    // Both orders happened: some containers were made before the removal took them.
    assert!(created > 0, "no creation finished before its pod's removal");
}
