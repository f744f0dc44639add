//! Container state from events: GetContainerEvents in order through a container's life, an
//! exit from outside (kill -9) reported without any list or status call, a shim that dies,
//! an exit while berthd was down, and subscribers that leave nothing behind.

mod common;

use std::time::{Duration, Instant};

use berth::client::CriClient;
use common::*;
use k8s_cri::v1 as cri;

type Events = tonic::Streaming<cri::ContainerEventResponse>;

async fn subscribe(c: &CriClient) -> Events {
    c.runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .expect("GetContainerEvents")
        .into_inner()
}

/// The next event about container `id` (others are skipped), within 10 s.
async fn next_for(events: &mut Events, id: &str) -> cri::ContainerEventResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = tokio::time::timeout(left, events.message())
            .await
            .unwrap_or_else(|_| panic!("no event for {id} within 10 s"))
            .expect("event stream")
            .expect("the stream ended");
        if got.container_id == id {
            return got;
        }
    }
}

fn kind(e: &cri::ContainerEventResponse) -> cri::ContainerEventType {
    cri::ContainerEventType::try_from(e.container_event_type).expect("event type")
}

/// The status of `id` carried by event `e`.
fn carried(e: &cri::ContainerEventResponse, id: &str) -> cri::ContainerStatus {
    e.containers_statuses
        .iter()
        .find(|s| s.id == id)
        .cloned()
        .unwrap_or_else(|| panic!("event carries no status of {id}: {e:?}"))
}

/// Host pid of the init of container `id`, from its verbose status.
async fn init_pid(c: &CriClient, id: &str) -> i32 {
    let info = c
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .info;
    let v: serde_json::Value = serde_json::from_str(&info["info"]).expect("info json");
    v["pid"].as_i64().expect("pid") as i32
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next()),
            Some("Z" | "X")
        )
    })
}

fn kill9(pid: i32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// The number of event subscribers berthd reports in its verbose status.
async fn subscribers(c: &CriClient) -> u64 {
    let info = c
        .runtime()
        .status(cri::StatusRequest { verbose: true })
        .await
        .expect("Status")
        .into_inner()
        .info;
    let v: serde_json::Value = serde_json::from_str(&info["events"]).expect("events json");
    v["subscribers"].as_u64().expect("subscribers")
}

#[tokio::test]
async fn events_follow_each_container_in_order_and_outside_exits_arrive_unpolled() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("events", &logs, mode);
    let mut events = subscribe(&c).await;
    let mut second = subscribe(&c).await;
    let pod = run_pod(&c, &pod_cfg).await;

    // A whole life: created, started, stopped (its own exit), deleted; each event carries the
    // pod's status and its containers' statuses at that moment.
    let short = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("short", &busybox, "sleep 0.3; exit 3", mode),
    )
    .await;
    let created = next_for(&mut events, &short).await;
    assert_eq!(
        kind(&created),
        cri::ContainerEventType::ContainerCreatedEvent
    );
    assert_eq!(
        created.pod_sandbox_status.as_ref().map(|s| s.id.as_str()),
        Some(pod.as_str())
    );
    assert_eq!(
        carried(&created, &short).state,
        cri::ContainerState::ContainerCreated as i32
    );
    let started = next_for(&mut events, &short).await;
    assert_eq!(
        kind(&started),
        cri::ContainerEventType::ContainerStartedEvent
    );
    assert_eq!(
        carried(&started, &short).state,
        cri::ContainerState::ContainerRunning as i32
    );
    let stopped = next_for(&mut events, &short).await;
    assert_eq!(
        kind(&stopped),
        cri::ContainerEventType::ContainerStoppedEvent
    );
    let s = carried(&stopped, &short);
    assert_eq!(
        (s.state, s.exit_code, s.reason.as_str()),
        (cri::ContainerState::ContainerExited as i32, 3, "Error")
    );
    assert!(created.created_at <= started.created_at && started.created_at <= stopped.created_at);
    // Once exited it is retired at once: its shim deleted it and left, its rootfs is unmounted.
    let rootfs = d.root().join("containers").join(&short).join("rootfs");
    let deadline = Instant::now() + Duration::from_secs(5);
    while (mounted(&rootfs) || find_shim(&short).is_some()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !mounted(&rootfs),
        "the exited container's rootfs is unmounted"
    );
    assert_eq!(
        find_shim(&short),
        None,
        "the exited container's shim is gone"
    );
    c.runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: short.clone(),
        })
        .await
        .expect("RemoveContainer");
    let deleted = next_for(&mut events, &short).await;
    assert_eq!(
        kind(&deleted),
        cri::ContainerEventType::ContainerDeletedEvent
    );
    assert!(deleted.containers_statuses.iter().all(|s| s.id != short));
    // Every subscriber gets the same events.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(kind(&next_for(&mut second, &short).await));
    }
    assert_eq!(
        seen,
        [
            cri::ContainerEventType::ContainerCreatedEvent,
            cri::ContainerEventType::ContainerStartedEvent,
            cri::ContainerEventType::ContainerStoppedEvent,
            cri::ContainerEventType::ContainerDeletedEvent,
        ]
    );

    // Killed from outside: the STOPPED event arrives with no list or status call polling.
    let victim = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("victim", &busybox, "exec sleep 1000", mode),
    )
    .await;
    assert_eq!(
        kind(&next_for(&mut events, &victim).await),
        cri::ContainerEventType::ContainerCreatedEvent
    );
    assert_eq!(
        kind(&next_for(&mut events, &victim).await),
        cri::ContainerEventType::ContainerStartedEvent
    );
    let pid = init_pid(&c, &victim).await;
    assert!(pid > 0 && alive(pid), "the victim runs as pid {pid}");
    let killed_at = Instant::now();
    kill9(pid);
    let stopped = next_for(&mut events, &victim).await;
    let latency = killed_at.elapsed();
    assert_eq!(
        kind(&stopped),
        cri::ContainerEventType::ContainerStoppedEvent
    );
    let s = carried(&stopped, &victim);
    assert_eq!(
        (s.state, s.exit_code),
        (cri::ContainerState::ContainerExited as i32, 137)
    );
    eprintln!("kill -9 to STOPPED event: {latency:?}");
    let s = container_status(&c, &victim).await.expect("status");
    assert_eq!(
        (s.state, s.exit_code),
        (cri::ContainerState::ContainerExited as i32, 137)
    );

    // A shim that dies: its container is ended and reported exited 255, Unknown, with why.
    let orphan = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("orphan", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let orphan_pid = init_pid(&c, &orphan).await;
    kill9(shim_pid(&orphan));
    let stopped = loop {
        let e = next_for(&mut events, &orphan).await;
        if kind(&e) == cri::ContainerEventType::ContainerStoppedEvent {
            break e;
        }
    };
    let s = carried(&stopped, &orphan);
    assert_eq!(
        (s.state, s.exit_code, s.reason.as_str()),
        (cri::ContainerState::ContainerExited as i32, 255, "Unknown")
    );
    assert!(s.message.contains("shim"), "{}", s.message);
    let gone = Instant::now() + Duration::from_secs(5);
    while alive(orphan_pid) && Instant::now() < gone {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !alive(orphan_pid),
        "the container of a dead shim is not left running"
    );

    // Subscribers that go away leave nothing behind.
    assert!(subscribers(&c).await >= 2);
    drop(events);
    drop(second);
    let mut left = u64::MAX;
    for _ in 0..250 {
        left = subscribers(&c).await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "subscribers left behind");
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn an_exit_while_berthd_was_down_is_sent_to_subscribers_after_the_restart() {
    let mut d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("outage", &logs, mode);
    let pod = run_pod(&c, &pod_cfg).await;
    let quitter = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("quitter", &busybox, "sleep 1; exit 5", mode),
    )
    .await;
    let stayer = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("stayer", &busybox, "exec sleep 1000", mode),
    )
    .await;
    d.kill9();
    tokio::time::sleep(Duration::from_secs(2)).await;
    d.spawn();
    let c = d.client().await;
    let mut events = subscribe(&c).await;
    let stopped = next_for(&mut events, &quitter).await;
    assert_eq!(
        kind(&stopped),
        cri::ContainerEventType::ContainerStoppedEvent
    );
    let s = carried(&stopped, &quitter);
    assert_eq!(
        (s.state, s.exit_code),
        (cri::ContainerState::ContainerExited as i32, 5)
    );
    // The one still running is watched again: its exit now is an event too.
    let s = container_status(&c, &stayer).await.expect("status");
    assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    kill9(init_pid(&c, &stayer).await);
    let stopped = next_for(&mut events, &stayer).await;
    assert_eq!(
        kind(&stopped),
        cri::ContainerEventType::ContainerStoppedEvent
    );
    assert_eq!(carried(&stopped, &stayer).exit_code, 137);
    remove_pod(&c, &pod).await;
}
