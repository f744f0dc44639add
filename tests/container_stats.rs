//! Container and pod stats from real cgroups, and UpdateContainerResources applied live.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use berth::client::CriClient;
use berth::runtime::cgroups::Layout;
use common::*;
use k8s_cri::v1 as cri;

const MIB: u64 = 1 << 20;

fn pod_cfg(name: &str, log_dir: &std::path::Path, cgroup_parent: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "stats".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        labels: [("pod".to_string(), name.to_string())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            // No pod init process: the stats must come from the containers alone.
            security_context: Some(cri::LinuxSandboxSecurityContext {
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

fn ctr(name: &str, image: &str, script: &str, labels: &[(&str, &str)]) -> cri::ContainerConfig {
    let mut config = sh_container(name, image, script, cri::NamespaceMode::Container);
    config.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config
}

/// A pod with its own cgroup parent; the caller removes it with [`remove_pod`].
struct Pod {
    id: String,
    config: cri::PodSandboxConfig,
}

/// A pod, with its own cgroup parent when `own_cgroup` (else its containers' cgroups are the
/// pod's, summed).
async fn start_pod(c: &CriClient, d: &Daemon, name: &str, own_cgroup: bool) -> Pod {
    let parent = if own_cgroup {
        format!("/berth-test-stats-{}-{name}", std::process::id())
    } else {
        String::new()
    };
    let config = pod_cfg(name, &d.dir.path().join("logs"), &parent);
    let id = run_pod(c, &config).await;
    Pod { id, config }
}

async fn create(c: &CriClient, pod: &Pod, config: cri::ContainerConfig) -> String {
    c.runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        })
        .await
        .expect("create container")
        .into_inner()
        .container_id
}

async fn start(c: &CriClient, id: &str) {
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.into(),
        })
        .await
        .expect("start container");
}

async fn stats(c: &CriClient, id: &str) -> cri::ContainerStats {
    c.runtime()
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.into(),
        })
        .await
        .expect("container stats")
        .into_inner()
        .stats
        .expect("stats")
}

async fn list_stats(c: &CriClient, filter: Option<cri::ContainerStatsFilter>) -> Vec<String> {
    let mut ids: Vec<String> = c
        .runtime()
        .list_container_stats(cri::ListContainerStatsRequest { filter })
        .await
        .expect("list container stats")
        .into_inner()
        .stats
        .into_iter()
        .filter_map(|s| s.attributes.map(|a| a.id))
        .collect();
    ids.sort();
    ids
}

fn val(v: &Option<cri::UInt64Value>) -> u64 {
    v.as_ref().map(|v| v.value).unwrap_or(0)
}

fn cpu_ns(s: &cri::ContainerStats) -> u64 {
    val(&s.cpu.as_ref().expect("cpu").usage_core_nano_seconds)
}

fn working_set(s: &cri::ContainerStats) -> u64 {
    val(&s.memory.as_ref().expect("memory").working_set_bytes)
}

fn layer(s: &cri::ContainerStats) -> (u64, u64) {
    let l = s.writable_layer.as_ref().expect("writable layer");
    (val(&l.used_bytes), val(&l.inodes_used))
}

/// Polls `f` until it holds (20 s).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut last = String::new();
    for _ in 0..200 {
        match f().await {
            Ok(()) => return,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: {last}");
}

#[tokio::test]
async fn stats_follow_cpu_memory_and_the_writable_layer() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let pod = start_pod(&c, &d, "stats", true).await;
    let other = start_pod(&c, &d, "other", false).await;

    let burner = create(
        &c,
        &pod,
        ctr(
            "burner",
            &busybox,
            "while :; do :; done",
            &[("role", "burner")],
        ),
    )
    .await;
    let hog = create(
        &c,
        &pod,
        ctr(
            "hog",
            &busybox,
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=20 && sleep 1000",
            &[("role", "hog")],
        ),
    )
    .await;
    let writer = create(
        &c,
        &pod,
        ctr("writer", &busybox, "sleep 1000", &[("role", "writer")]),
    )
    .await;
    let idle = create(&c, &other, ctr("idle", &busybox, "sleep 1000", &[])).await;
    for id in [&burner, &hog, &writer] {
        start(&c, id).await;
    }

    // A created container already has stats (critest lists created ones).
    let s = stats(&c, &idle).await;
    let attrs = s.attributes.as_ref().expect("attributes");
    assert_eq!(attrs.id, idle);
    assert_eq!(
        attrs.metadata.as_ref().map(|m| m.name.as_str()),
        Some("idle")
    );
    assert!(s.cpu.as_ref().expect("cpu").timestamp > 0);
    assert!(s.memory.as_ref().expect("memory").timestamp > 0);

    // CPU: the burner's counter rises and its rate is positive.
    let first = stats(&c, &burner).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = stats(&c, &burner).await;
    assert!(
        cpu_ns(&second) > cpu_ns(&first),
        "cpu usage rises: {first:?} then {second:?}"
    );
    let rate = val(&second.cpu.as_ref().expect("cpu").usage_nano_cores);
    assert!(rate > 100_000_000, "a busy loop uses >0.1 core: {rate}");
    assert_eq!(
        second.attributes.as_ref().map(|a| a.labels.clone()),
        Some(HashMap::from([("role".to_string(), "burner".to_string())]))
    );

    // Memory: 20 MiB of /dev/shm are charged to the hog.
    eventually("hog working set ≥ 20 MiB", || async {
        let ws = working_set(&stats(&c, &hog).await);
        (ws >= 20 * MIB)
            .then_some(())
            .ok_or(format!("working set {ws}"))
    })
    .await;

    // Writable layer: a 5 MiB file in the rootfs shows (at the next measurement: layers are
    // measured at most every 10 s).
    let before = stats(&c, &writer).await;
    let fs_id = before
        .writable_layer
        .as_ref()
        .and_then(|l| l.fs_id.as_ref())
        .map(|f| f.mountpoint.clone())
        .unwrap_or_default();
    assert!(!fs_id.is_empty(), "{before:?}");
    let out = c
        .runtime()
        .exec_sync(cri::ExecSyncRequest {
            container_id: writer.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "mkdir /data && dd if=/dev/zero of=/data/blob bs=1M count=5".into(),
            ],
            timeout: 30,
        })
        .await
        .expect("exec")
        .into_inner();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let (b, bi) = layer(&before);
    eventually("the layer grows by 5 MiB and two inodes", || async {
        let (a, ai) = layer(&stats(&c, &writer).await);
        (a >= b + 5 * MIB && ai >= bi + 2)
            .then_some(())
            .ok_or(format!("{b} -> {a} bytes, {bi} -> {ai} inodes"))
    })
    .await;

    // ListContainerStats filters.
    let mut pod_ids = vec![burner.clone(), hog.clone(), writer.clone()];
    pod_ids.sort();
    let mut all = pod_ids.clone();
    all.push(idle.clone());
    all.sort();
    assert_eq!(list_stats(&c, None).await, all);
    let by_pod = cri::ContainerStatsFilter {
        pod_sandbox_id: pod.id[..12].to_string(),
        ..Default::default()
    };
    assert_eq!(list_stats(&c, Some(by_pod)).await, pod_ids);
    let by_label = cri::ContainerStatsFilter {
        label_selector: [("role".to_string(), "hog".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(list_stats(&c, Some(by_label)).await, vec![hog.clone()]);
    let by_id = cri::ContainerStatsFilter {
        id: idle.clone(),
        ..Default::default()
    };
    assert_eq!(list_stats(&c, Some(by_id)).await, vec![idle.clone()]);
    let none = cri::ContainerStatsFilter {
        label_selector: [("role".to_string(), "nobody".to_string())].into(),
        ..Default::default()
    };
    assert!(list_stats(&c, Some(none)).await.is_empty());
    let e = c
        .runtime()
        .container_stats(cri::ContainerStatsRequest {
            container_id: "nosuchcontainer".into(),
        })
        .await
        .expect_err("unknown container");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    // Pod stats: the pod cgroup and its containers.
    let ps = c
        .runtime()
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .expect("pod stats")
        .into_inner()
        .stats
        .expect("stats");
    assert_eq!(
        ps.attributes.as_ref().map(|a| a.id.as_str()),
        Some(pod.id.as_str())
    );
    let linux = ps.linux.expect("linux");
    let mut in_pod: Vec<String> = linux
        .containers
        .iter()
        .filter_map(|s| s.attributes.as_ref().map(|a| a.id.clone()))
        .collect();
    in_pod.sort();
    assert_eq!(in_pod, pod_ids);
    assert!(val(&linux.cpu.as_ref().expect("cpu").usage_core_nano_seconds) > 0);
    let pod_ws = val(&linux.memory.as_ref().expect("memory").working_set_bytes);
    assert!(pod_ws >= 20 * MIB, "pod working set {pod_ws}");
    let procs = val(&linux.process.as_ref().expect("process").process_count);
    assert!(procs >= 3, "processes: {procs}");
    if let Some(net) = &linux.network {
        assert!(net.default_interface.is_some(), "{net:?}");
    }
    let listed = c
        .runtime()
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest {
            filter: Some(cri::PodSandboxStatsFilter {
                label_selector: [("pod".to_string(), "other".to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .expect("list pod stats")
        .into_inner()
        .stats;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].attributes.as_ref().map(|a| a.id.as_str()),
        Some(other.id.as_str())
    );
    let all_pods = c
        .runtime()
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
        .expect("list pod stats")
        .into_inner()
        .stats;
    assert_eq!(all_pods.len(), 2);
    let e = c
        .runtime()
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: "nosuchpod".into(),
        })
        .await
        .expect_err("unknown pod");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    remove_pod(&c, &pod.id).await;
    remove_pod(&c, &other.id).await;
    assert!(list_stats(&c, None).await.is_empty());
    remove_pod_cgroup(&pod).await;
}

/// Waits for the pod's cgroup to be gone; removes what is left empty (a container cgroup that
/// was still going when the pod went keeps the pod's busy).
async fn remove_pod_cgroup(pod: &Pod) {
    let parent = pod
        .config
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    if parent.is_empty() {
        return;
    }
    let layout = Layout::detect().expect("layout");
    let dirs = layout.dirs(&parent);
    for _ in 0..30 {
        if dirs.iter().all(|d| !d.exists()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for d in dirs.iter().filter(|d| d.exists()) {
        eprintln!("pod cgroup {} outlived its pod; removing it", d.display());
        let _ = std::fs::remove_dir(d);
    }
}

fn read_trim(p: &std::path::Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

async fn update(
    c: &CriClient,
    id: &str,
    r: cri::LinuxContainerResources,
) -> Result<(), tonic::Status> {
    c.runtime()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux: Some(r),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn update_container_resources_changes_the_cgroup_live() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let pod = start_pod(&c, &d, "update", false).await;
    let mut cfg = ctr("sleeper", &busybox, "sleep 1000", &[]);
    if let Some(l) = cfg.linux.as_mut() {
        l.resources = Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 64 * MIB as i64,
            cpu_shares: 512,
            ..Default::default()
        });
    }
    let id = create(&c, &pod, cfg).await;
    start(&c, &id).await;
    let v2 = Layout::detect().expect("layout").is_v2();

    update(
        &c,
        &id,
        cri::LinuxContainerResources {
            memory_limit_in_bytes: 100 * MIB as i64,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            ..Default::default()
        },
    )
    .await
    .expect("update");
    if v2 {
        assert_eq!(
            read_trim(&cgroup_file(&d, &id, "memory", "memory.max")),
            (100 * MIB).to_string()
        );
        assert_eq!(
            read_trim(&cgroup_file(&d, &id, "cpu", "cpu.max")),
            "50000 100000"
        );
    } else {
        assert_eq!(
            read_trim(&cgroup_file(&d, &id, "memory", "memory.limit_in_bytes")),
            (100 * MIB).to_string()
        );
        assert_eq!(
            read_trim(&cgroup_file(&d, &id, "cpu", "cpu.cfs_quota_us")),
            "50000"
        );
        assert_eq!(
            read_trim(&cgroup_file(&d, &id, "cpu", "cpu.cfs_period_us")),
            "100000"
        );
    }
    let status = c
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .expect("status")
        .into_inner()
        .status
        .expect("status");
    let r = status
        .resources
        .and_then(|r| r.linux)
        .expect("ContainerStatus.resources.linux");
    assert_eq!(r.memory_limit_in_bytes, 100 * MIB as i64);
    assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
    assert_eq!(r.cpu_shares, 512, "fields the update leaves alone stay");
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.root().join("containers").join(&id).join("config.json")).expect("spec"),
    )
    .expect("json");
    assert_eq!(
        spec.pointer("/linux/resources/memory/limit"),
        Some(&serde_json::json!(100 * MIB))
    );
    assert_eq!(
        spec.pointer("/linux/resources/cpu/quota"),
        Some(&serde_json::json!(50_000))
    );
    // The stats report the new limit.
    let s = stats(&c, &id).await;
    let avail = val(&s.memory.as_ref().expect("memory").available_bytes);
    assert!(avail > 0 && avail <= 100 * MIB, "available {avail}");

    // Bad requests.
    let e = update(
        &c,
        "nosuchcontainer",
        cri::LinuxContainerResources {
            memory_limit_in_bytes: 100 * MIB as i64,
            ..Default::default()
        },
    )
    .await
    .expect_err("unknown id");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    for bad in [
        cri::LinuxContainerResources {
            memory_limit_in_bytes: -5,
            ..Default::default()
        },
        cri::LinuxContainerResources {
            cpu_quota: 500,
            ..Default::default()
        },
    ] {
        let e = update(&c, &id, bad).await.expect_err("invalid");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
    // Nothing changed by the refused ones.
    let limit_file = if v2 {
        cgroup_file(&d, &id, "memory", "memory.max")
    } else {
        cgroup_file(&d, &id, "memory", "memory.limit_in_bytes")
    };
    assert_eq!(read_trim(&limit_file), (100 * MIB).to_string());

    // A limit below what the container holds: cgroup v1 without swap cannot reclaim shmem and
    // refuses (v2 would OOM-kill instead, so only v1 is checked).
    let no_swap = std::fs::read_to_string("/proc/swaps")
        .map(|t| t.lines().count() <= 1)
        .unwrap_or(false);
    if !v2 && no_swap {
        let out = c
            .runtime()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec![
                    "dd".into(),
                    "if=/dev/zero".into(),
                    "of=/dev/shm/held".into(),
                    "bs=1M".into(),
                    "count=16".into(),
                ],
                timeout: 30,
            })
            .await
            .expect("exec")
            .into_inner();
        assert_eq!(out.exit_code, 0, "{out:?}");
        let e = update(
            &c,
            &id,
            cri::LinuxContainerResources {
                memory_limit_in_bytes: 4 * MIB as i64,
                ..Default::default()
            },
        )
        .await
        .expect_err("below usage");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains(&id), "{e:?}");
        assert_eq!(read_trim(&limit_file), (100 * MIB).to_string());
    }

    // An exited container cannot be updated.
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .expect("stop");
    let e = update(
        &c,
        &id,
        cri::LinuxContainerResources {
            memory_limit_in_bytes: 80 * MIB as i64,
            ..Default::default()
        },
    )
    .await
    .expect_err("exited");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    // Exited containers still list (with whatever their cgroup has left).
    assert_eq!(list_stats(&c, None).await, vec![id.clone()]);

    remove_pod(&c, &pod.id).await;
}
