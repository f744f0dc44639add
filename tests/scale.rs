//! 500 running pods on one berthd: created in parallel, listed (every list answers from
//! berthd's own state), removed, with nothing left; a subscriber that reads every event sees
//! each container's events in order, one that never reads is dropped without slowing anyone.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use k8s_cri::v1 as cri;

const PODS: usize = 500;
const PARALLEL: usize = 16;

fn host_pod(i: usize, logs: &std::path::Path) -> cri::PodSandboxConfig {
    let mut cfg = pod_config(&format!("scale-{i}"), logs, cri::NamespaceMode::Container);
    if let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.network = cri::NamespaceMode::Node as i32;
    }
    cfg
}

/// A client on its own connection whose HTTP/2 windows are small, so that a stream it does
/// not read pushes back on berthd after a few KiB (instead of hyper's default MiBs).
async fn small_window_client(
    socket: &std::path::Path,
) -> cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel> {
    let socket = socket.to_owned();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .initial_stream_window_size(Some(4096))
        .initial_connection_window_size(Some(65_535))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connect");
    cri::runtime_service_client::RuntimeServiceClient::new(channel)
}

/// berth-shim processes serving containers of this daemon's state dir.
fn shims_of(state: &std::path::Path) -> usize {
    let needle = state.display().to_string();
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("berth-shim") && cmd.contains(&needle)
        })
        .count()
}

#[tokio::test]
async fn five_hundred_pods_run_list_and_go_with_nothing_left() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");

    // One subscriber reads everything; one never reads.
    let mut reader = c
        .runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .expect("GetContainerEvents")
        .into_inner();
    let mut idle = small_window_client(&d.socket())
        .await
        .get_container_events(cri::GetEventsRequest {})
        .await
        .expect("GetContainerEvents")
        .into_inner();
    let seen = tokio::spawn(async move {
        let mut seen: HashMap<String, Vec<i32>> = HashMap::new();
        while let Ok(Some(e)) = reader.message().await {
            seen.entry(e.container_id)
                .or_default()
                .push(e.container_event_type);
        }
        seen
    });

    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..PODS {
        let (c, gate, logs, busybox) = (c.clone(), gate.clone(), logs.clone(), busybox.clone());
        runs.spawn(async move {
            let _slot = gate.acquire().await.expect("gate");
            let cfg = host_pod(i, &logs);
            let pod = run_pod(&c, &cfg).await;
            let ctr = run_container(
                &c,
                &pod,
                &cfg,
                sh_container(
                    "sleep",
                    &busybox,
                    "exec sleep 1000",
                    cri::NamespaceMode::Container,
                ),
            )
            .await;
            (pod, ctr)
        });
    }
    let mut made = Vec::new();
    while let Some(r) = runs.join_next().await {
        made.push(r.expect("pod task"));
    }
    eprintln!("{PODS} pods started in {:?}", started.elapsed());

    let listed = list_containers(&c).await;
    assert_eq!(listed.len(), PODS);
    assert!(
        listed
            .iter()
            .all(|x| x.state == cri::ContainerState::ContainerRunning as i32)
    );
    let pods = list_pod_sandboxes(&c).await;
    assert_eq!(pods.len(), PODS);
    assert!(
        pods.iter()
            .all(|p| p.state == cri::PodSandboxState::SandboxReady as i32)
    );
    // Filters are answered from the same state.
    let (pod0, ctr0) = &made[0];
    let one = c
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: pod0.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("filtered list")
        .into_inner()
        .containers;
    assert_eq!(
        one.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
        [ctr0.as_str()]
    );
    let t = Instant::now();
    for _ in 0..20 {
        list_containers(&c).await;
    }
    eprintln!("ListContainers of {PODS}: {:?} each", t.elapsed() / 20);
    assert_eq!(shims_of(&d.state()), PODS);

    let mut removes = tokio::task::JoinSet::new();
    for (pod, _) in made.clone() {
        let (c, gate) = (c.clone(), gate.clone());
        removes.spawn(async move {
            let _slot = gate.acquire().await.expect("gate");
            remove_pod(&c, &pod).await;
        });
    }
    while let Some(r) = removes.join_next().await {
        r.expect("remove task");
    }
    assert!(list_containers(&c).await.is_empty());
    assert!(list_pod_sandboxes(&c).await.is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while shims_of(&d.state()) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shims_of(&d.state()), 0, "shims left");
    let left = common::settled_entries(&d.root().join("containers"));
    assert!(left.is_empty(), "bundles left: {left:?}");
    let sockets: Vec<_> = std::fs::read_dir(d.state().join("shims"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(sockets.is_empty(), "shim sockets left: {sockets:?}");

    // The reader saw every container's four events, in order.
    let (mut last, mut errors) = (None, 0);
    // The idle subscriber fell behind and was dropped: its stream ends with an error.
    let drained = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match idle.message().await {
                Ok(Some(e)) => last = Some(e.container_event_type),
                Ok(None) => break,
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                    errors += 1;
                    break;
                }
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the idle subscriber's stream ends");
    assert_eq!(
        errors, 1,
        "the idle subscriber was dropped (last event {last:?})"
    );
    drop(c);
    drop(d);
    let seen = seen.await.expect("reader");
    let order = [
        cri::ContainerEventType::ContainerCreatedEvent as i32,
        cri::ContainerEventType::ContainerStartedEvent as i32,
        cri::ContainerEventType::ContainerStoppedEvent as i32,
        cri::ContainerEventType::ContainerDeletedEvent as i32,
    ];
    // Each container's events, and each pod sandbox's own (its id as the container id).
    assert_eq!(seen.len(), 2 * PODS);
    for (pod, ctr) in &made {
        assert_eq!(
            seen.get(ctr).map(Vec::as_slice),
            Some(&order[..]),
            "events of {ctr}"
        );
        assert_eq!(
            seen.get(pod).map(Vec::as_slice),
            Some(&order[..]),
            "events of pod {pod}"
        );
    }
}
