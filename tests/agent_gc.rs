//! The agent's garbage collection: dead containers and unused images.

mod agent_support;
mod common;

use std::time::{Duration, Instant};

use agent_support::*;
use common::{image, pull, tail};
use k8s_cri::v1 as cri;

const EXITED: i32 = cri::ContainerState::ContainerExited as i32;
const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;

/// Containers of the pod with uid `uid`, as (attempt, state), oldest first.
async fn pod_containers(c: &berth::client::CriClient, uid: &str) -> Vec<(u32, i32)> {
    let mut v: Vec<(u32, i32)> = containers(c)
        .await
        .into_iter()
        .filter(|ct| ct.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid))
        .map(|ct| (ct.metadata.map(|m| m.attempt).unwrap_or(0), ct.state))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_keeps_one_dead_instance_and_its_status() {
    let a = Agent::start_with_config(&[], "container_gc_period_secs = 1.0\n");
    a.write(
        "crash.yaml",
        &pod_yaml("crash", "echo boom; exit 1", "", ""),
    );
    let pod = a.wait_pod("default", "crash", "three restarts", |p| {
        restarts(p, "main") >= 3
    });
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    // Through more restarts, at most the newest dead instance and the current one exist.
    let until = Instant::now() + Duration::from_secs(6);
    let mut newest = 0;
    while Instant::now() < until {
        let list = pod_containers(&c, &uid).await;
        assert!(list.len() <= 2, "more than one dead instance: {list:?}");
        if let [(older, state), (newer, _)] = list.as_slice() {
            assert_eq!(*state, EXITED, "{list:?}");
            assert_eq!(
                older + 1,
                *newer,
                "the dead instance kept is the newest: {list:?}"
            );
        }
        newest = newest.max(list.last().map(|l| l.0).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pod = a.wait_pod("default", "crash", "the status catching up", |p| {
        restarts(p, "main") >= i64::from(newest)
    });
    let st = container(&pod, "main");
    assert_eq!(st["lastState"]["terminated"]["exitCode"], 1, "{st}");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_limit_removes_dead_containers_the_pod_worker_keeps() {
    // max_containers = 0: no dead container may stay on the node (the pod worker alone keeps
    // the newest dead instance for lastState).
    let a = Agent::start_with_config(&[], "container_gc_period_secs = 1.0\nmax_containers = 0\n");
    let once = "if [ -e /marker/once ]; then exec sleep 3600; fi; touch /marker/once; exit 1";
    a.write(
        "once.yaml",
        &pod_yaml(
            "once",
            once,
            "  volumes:\n  - name: marker\n    emptyDir: {}\n",
            "    volumeMounts:\n    - name: marker\n      mountPath: /marker\n",
        ),
    );
    let pod = a.wait_pod("default", "once", "running after one restart", |p| {
        running(p, "main") && restarts(p, "main") == 1
    });
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = pod_containers(&c, &uid).await;
        if list == [(1, RUNNING)] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead first instance was not collected: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod = a.pod("default", "once").expect("pod");
    assert!(running(&pod, "main"), "{pod}");
    assert_eq!(
        restarts(&pod, "main"),
        1,
        "restartCount comes from the instance"
    );
    for line in a
        .daemon
        .log()
        .lines()
        .filter(|l| l.contains("container GC"))
    {
        eprintln!("{line}");
    }
    a.finish().await;
}

/// A counter of `/gc` (`image_passes`, `container_passes`, ...).
fn gc_counter(a: &Agent, name: &str) -> u64 {
    let (code, gc) = a.get("/gc");
    assert_eq!(code, 200, "/gc: {gc}");
    gc[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in /gc: {gc}"))
}

/// Waits until the `/gc` counter `name` reaches `n`.
fn wait_gc_counter(a: &Agent, name: &str, n: u64) {
    a.wait(&format!("{name} >= {n}"), Duration::from_secs(60), |a| {
        a.get("/gc").1[name].as_u64() >= Some(n)
    });
}

async fn image_ids(c: &berth::client::CriClient) -> Vec<String> {
    common::list(c).await.into_iter().map(|i| i.id).collect()
}

const AGGRESSIVE_IMAGE_GC: &str = "image_gc_period_secs = 1.0\nimage_gc_high_threshold_percent = 1\n\
     image_gc_low_threshold_percent = 0\nimage_minimum_gc_age_secs = 1.0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_collected_above_the_threshold_and_used_ones_stay() {
    let a = Agent::start_with_config(&[], AGGRESSIVE_IMAGE_GC);
    a.write("busy.yaml", &pod_yaml("busy", "exec sleep 3600", "", ""));
    a.wait_pod("default", "busy", "busy running", |p| running(p, "main"));
    let c = a.daemon.client().await;
    let busybox = common::status(&c, &image("busybox"))
        .await
        .expect("busybox is there")
        .id;
    let mut extra = Vec::new();
    for name in ["layers", "busybox:oci"] {
        let id = pull(&c, &image(name)).await.expect("pull");
        if id != busybox {
            extra.push(id);
        }
    }
    assert!(!extra.is_empty(), "no image other than busybox to collect");
    let started = Instant::now();
    loop {
        let ids = image_ids(&c).await;
        if extra.iter().all(|e| !ids.contains(e)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "unused images {extra:?} still there: {ids:?}\n{}",
            tail(&a.daemon.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("unused images collected in {:?}", started.elapsed());
    // More passes (counted from now) leave the image the running pod uses.
    let passes = gc_counter(&a, "image_passes");
    wait_gc_counter(&a, "image_passes", passes + 3);
    assert!(
        image_ids(&c).await.contains(&busybox),
        "busybox in use was removed"
    );
    let gc = a.get("/gc").1;
    assert!(
        gc["images_removed"].as_u64() >= Some(extra.len() as u64),
        "{gc}"
    );
    let pod = a.pod("default", "busy").expect("pod");
    assert!(running(&pod, "main"), "{pod}");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_stay_below_the_high_threshold() {
    // The kubelet's usage (100 - available / capacity) of the disk the daemon's root is on;
    // the high threshold goes above it. (Whether the default 85% is crossed depends on the
    // machine: the selection with the defaults is unit-tested in agent::gc.)
    let st = rustix::fs::statvfs(std::env::temp_dir()).expect("statvfs");
    let used_percent = 100 - st.f_bavail * 100 / st.f_blocks.max(1);
    assert!(
        used_percent < 99,
        "the test disk is full ({used_percent}% used)"
    );
    let high = (used_percent + 2).min(100);
    let a = Agent::start_with_config(
        &[],
        &format!(
            "image_gc_period_secs = 1.0\nimage_minimum_gc_age_secs = 0.0\n\
             image_gc_high_threshold_percent = {high}\nimage_gc_low_threshold_percent = 0\n"
        ),
    );
    let c = a.daemon.client().await;
    let id = pull(&c, &image("layers")).await.expect("pull");
    // Passes that all began after the pull.
    let passes = gc_counter(&a, "image_passes");
    wait_gc_counter(&a, "image_passes", passes + 3);
    assert!(
        image_ids(&c).await.contains(&id),
        "an unused image was removed below the {high}% threshold"
    );
    let gc = a.get("/gc").1;
    assert_eq!(gc["images_removed"], 0, "{gc}");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_images_are_reported_pinned_and_never_collected() {
    // `layers` pinned by its reference as a user writes it (no tag: `:latest`), `busybox` not.
    let pinned = image("layers");
    let a = Agent::start_with_config(
        &[],
        &format!("{AGGRESSIVE_IMAGE_GC}[images]\npinned_images = [{pinned:?}]\n"),
    );
    let c = a.daemon.client().await;
    let kept = pull(&c, &pinned).await.expect("pull layers");
    let other = pull(&c, &image("busybox")).await.expect("pull busybox");
    assert_ne!(kept, other, "two distinct images");
    let listed = common::list(&c).await;
    let pinned_of = |id: &str| listed.iter().find(|i| i.id == id).map(|i| i.pinned);
    // The unpinned one may already be gone; the pinned one is listed, pinned.
    assert_eq!(pinned_of(&kept), Some(true), "{listed:?}");
    assert_ne!(pinned_of(&other), Some(true), "{listed:?}");
    let status = common::status(&c, &pinned).await.expect("layers status");
    assert!(status.pinned, "ImageStatus of {pinned}: {status:?}");
    let started = Instant::now();
    while image_ids(&c).await.contains(&other) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the unpinned image was not collected\n{}",
            tail(&a.daemon.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let passes = gc_counter(&a, "image_passes");
    wait_gc_counter(&a, "image_passes", passes + 3);
    assert!(
        image_ids(&c).await.contains(&kept),
        "the pinned image was removed\n{}",
        tail(&a.daemon.log(), 30)
    );
    a.finish().await;
}

/// The memory cgroup limits of memory plus swap of a running container, read on the host:
/// (v1 `memory.memsw.limit_in_bytes` or v2 `memory.swap.max`, its value).
async fn swap_limit_of(c: &berth::client::CriClient, id: &str) -> (String, String) {
    let own = common::exec_ok(c, id, &["cat", "/proc/self/cgroup"]).await;
    let v1 = own.lines().find_map(|l| {
        let (_, rest) = l.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    let file = match v1 {
        Some(path) => format!("/sys/fs/cgroup/memory{path}/memory.memsw.limit_in_bytes"),
        None => {
            let path = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .expect("a cgroup v2 path");
            format!("/sys/fs/cgroup{path}/memory.swap.max")
        }
    };
    let value = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
    (file, value.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_swap_bounds_memory_plus_swap_at_the_memory_limit() {
    let a = Agent::start();
    let resources = "    resources:\n      requests:\n        memory: 16Mi\n      limits:\n        memory: 64Mi\n";
    a.write(
        "capped.yaml",
        &pod_yaml("capped", "exec sleep 3600", "", resources),
    );
    let pod = a.wait_pod("default", "capped", "capped running", |p| {
        running(p, "main")
    });
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let c = a.daemon.client().await;
    let id = running_container(&c, uid, "main").await;
    let (file, value) = swap_limit_of(&c, &id).await;
    let want = if file.ends_with("memory.swap.max") {
        "0".to_string()
    } else {
        (64u64 << 20).to_string()
    };
    assert_eq!(value, want, "{file}");
    a.finish().await;
}

/// Runs and stops a sandbox that looks like one the agent made for pod `uid`.
async fn dead_agent_sandbox(c: &berth::client::CriClient, a: &Agent, uid: &str, n: u32) -> String {
    let mut config = common::pod_config(
        &format!("leftover-{n}"),
        a.logs.path(),
        cri::NamespaceMode::Container,
    );
    if let Some(m) = config.metadata.as_mut() {
        m.uid = uid.to_string();
        m.attempt = n;
    }
    config.labels = [
        ("berth.io/managed-by".to_string(), "berth-agent".to_string()),
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
    ]
    .into();
    let id = common::run_pod(c, &config).await;
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("StopPodSandbox");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_sandboxes_of_a_pod_go_except_its_newest() {
    let a = Agent::start_with_config(&[], "container_gc_period_secs = 1.0\n");
    a.write("keep.yaml", &pod_yaml("keep", "exec sleep 3600", "", ""));
    let pod = a.wait_pod("default", "keep", "keep running", |p| running(p, "main"));
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let live = sandboxes(&c).await.remove(0).id;
    let older = dead_agent_sandbox(&c, &a, &uid, 7).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let newest = dead_agent_sandbox(&c, &a, &uid, 8).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ids: Vec<String> = sandboxes(&c).await.into_iter().map(|s| s.id).collect();
        if !ids.contains(&older) {
            assert!(
                ids.contains(&live),
                "the pod's ready sandbox stays: {ids:?}"
            );
            assert!(
                ids.contains(&newest),
                "the pod's newest sandbox stays: {ids:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the older dead sandbox stayed: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod = a.pod("default", "keep").expect("pod");
    assert!(running(&pod, "main"), "{pod}");
    // Once the pod is gone, its remaining dead sandbox goes too (finish waits for none left).
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_init_container_is_kept_so_it_does_not_run_again() {
    let a = Agent::start_with_config(&[], "container_gc_period_secs = 1.0\nmax_containers = 0\n");
    a.write(
        "init.yaml",
        &pod_yaml(
            "init",
            "exec sleep 3600",
            "  initContainers:\n  - name: prep\n    image: IMAGE\n    command: [\"true\"]\n"
                .replace("IMAGE", &image("busybox"))
                .as_str(),
            "",
        ),
    );
    let pod = a.wait_pod("default", "init", "running", |p| running(p, "main"));
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    // Several GC passes later the init container's only instance is still there, and it ran once.
    let passes = gc_counter(&a, "container_passes");
    wait_gc_counter(&a, "container_passes", passes + 3);
    let prep: Vec<(u32, i32)> = containers(&c)
        .await
        .into_iter()
        .filter(|ct| {
            ct.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid.as_str())
                && ct.metadata.as_ref().is_some_and(|m| m.name == "prep")
        })
        .map(|ct| (ct.metadata.map(|m| m.attempt).unwrap_or(0), ct.state))
        .collect();
    assert_eq!(
        prep,
        [(0, k8s_cri::v1::ContainerState::ContainerExited as i32)]
    );
    let pod = a.pod("default", "init").expect("pod");
    assert!(running(&pod, "main"), "{pod}");
    assert_eq!(restarts(&pod, "main"), 0);
    a.finish().await;
}
