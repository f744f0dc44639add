//! berthd crashes (kill -9) and hung shims: running containers keep running and logging,
//! exits during the outage are reported, half-created containers are rolled back, what no
//! record names is removed at start, and one stopped shim does not hold up anybody else.

mod common;

use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;

/// (id, state, exit code) of every container, sorted by id.
async fn containers(c: &berth::client::CriClient) -> Vec<(String, i32, i32)> {
    let listed = c
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    let mut out = Vec::new();
    for ctr in listed {
        let s = container_status(c, &ctr.id).await.expect("status");
        out.push((ctr.id, ctr.state, s.exit_code));
    }
    out.sort();
    out
}

async fn sandboxes(c: &berth::client::CriClient) -> Vec<(String, i32)> {
    let mut v: Vec<(String, i32)> = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
        .into_iter()
        .map(|s| (s.id, s.state))
        .collect();
    v.sort();
    v
}

fn log_lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test]
async fn running_containers_survive_kill_9_and_half_created_ones_are_rolled_back() {
    let mut d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("crash", &logs, cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &pod_cfg).await;
    let logger = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container(
            "logger",
            &busybox,
            "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.05; done",
            mode,
        ),
    )
    .await;
    let quitter = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("quitter", &busybox, "sleep 1.5; exit 7", mode),
    )
    .await;
    let created = create_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("later", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let pods_before = sandboxes(&c).await;
    let before = containers(&c).await;
    assert_eq!(before.len(), 3);

    d.kill9();
    // Forge a container a crash interrupted half-way: a Creating record whose bundle has a
    // mounted rootfs.
    let bundle = d.root().join("containers").join("half");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("bundle");
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&rootfs)
        .status()
        .expect("mount");
    assert!(status.success());
    // ... and a process left in its cgroup (by a shim that crashed with berthd).
    let leaf = format!("berth-half-{}", std::process::id());
    let cgroup = std::path::PathBuf::from("/sys/fs/cgroup/pids").join(&leaf);
    std::fs::create_dir_all(&cgroup).expect("cgroup");
    let spec = serde_json::json!({ "linux": { "cgroupsPath": format!("/{leaf}") } });
    std::fs::write(bundle.join("config.json"), spec.to_string()).expect("config.json");
    let mut orphan = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .expect("sleep");
    std::fs::write(cgroup.join("cgroup.procs"), orphan.id().to_string()).expect("join cgroup");
    {
        let store = berth::store::Store::open(&d.root().join("berth.redb")).expect("store");
        // Built from JSON so that fields added later with defaults need no change here.
        let rec: berth::runtime::container::ContainerRecord =
            serde_json::from_value(serde_json::json!({
                "id": "half", "name": "half_crash_0", "sandbox_id": pod,
                "state": "Creating", "created_at": 0, "started_at": 0, "exit": null,
                "config_hex": "", "fingerprint_hex": "", "image_ref": "", "image_id": "",
                "bundle": bundle, "snapshot": "", "log_path": logs.join("half.log"),
                "socket": d.state().join("shims/half.sock"), "exit_file": bundle.join("exit.json"),
                "uid": 0, "gid": 0, "groups": [],
            }))
            .expect("record");
        store
            .put_record(berth::store::CONTAINERS, "half", &rec)
            .expect("forge record");
    }
    // ... and the files of a removal a crash cut short: a bundle moved aside, not yet deleted.
    let removed = d.root().join("containers").join("rm-gone");
    std::fs::create_dir_all(removed.join("rootfs/etc")).expect("removed bundle");
    std::fs::write(removed.join("config.json"), "{}").expect("removed bundle's config");
    // The quitter exits while berthd is down; the logger keeps logging.
    let lines_down = log_lines(&logs.join("logger.log"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        log_lines(&logs.join("logger.log")) > lines_down,
        "logging went on"
    );

    d.spawn();
    let c = d.client().await;
    assert_eq!(sandboxes(&c).await, pods_before, "pods exactly as before");
    let after = containers(&c).await;
    let ids = |v: &Vec<(String, i32, i32)>| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&after),
        ids(&before),
        "the same containers, the half one gone"
    );
    let find = |id: &str| after.iter().find(|x| x.0 == id).cloned().expect("listed");
    assert_eq!(
        find(&logger).1,
        cri::ContainerState::ContainerRunning as i32
    );
    assert_eq!(
        (find(&quitter).1, find(&quitter).2),
        (cri::ContainerState::ContainerExited as i32, 7),
        "the exit during the outage is reported"
    );
    assert_eq!(
        find(&created).1,
        cri::ContainerState::ContainerCreated as i32
    );
    assert!(
        !mounted(&rootfs) && !bundle.exists(),
        "half container cleaned up"
    );
    assert!(
        !settled_entries(&d.root().join("containers")).contains(&"rm-gone".to_string()),
        "the bundle a removal moved aside is deleted at start-up"
    );
    let reaped = orphan.wait().expect("wait orphan");
    assert!(!reaped.success(), "the orphan in its cgroup was killed");
    assert!(!cgroup.exists(), "its cgroup removed");

    // The shims still answer: exec in the logger, start the created container.
    assert_eq!(exec_ok(&c, &logger, &["echo", "alive"]).await, "alive\n");
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: created.clone(),
        })
        .await
        .expect("start after restart");
    let n = log_lines(&logs.join("logger.log"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(log_lines(&logs.join("logger.log")) > n, "still logging");
    remove_pod(&c, &pod).await;
    assert!(containers(&c).await.is_empty());
}

/// A berthd killed after preparing a container (bundle, mounted rootfs, snapshot) or a pod's
/// directory (pins, /dev/shm) but before saving its record: the next start removes them.
#[tokio::test]
async fn what_no_record_names_is_removed_at_start() {
    let mut d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod_cfg = pod_config("unnamed", &logs, mode);
    let pod = run_pod(&c, &pod_cfg).await;
    let snapshots_before = d.snapshot_dirs();
    let kept = run_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("kept", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let lost = create_container(
        &c,
        &pod,
        &pod_cfg,
        sh_container("lost", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let bundle = d.root().join("containers").join(&lost);
    assert!(mounted(&bundle.join("rootfs")));
    assert_eq!(d.snapshot_dirs().len(), snapshots_before.len() + 2);

    // The crash came before the record was saved: no record, no shim; the bundle, its mount
    // and its snapshot are there.
    d.kill9();
    let _ = std::process::Command::new("pkill")
        .args(["-9", "-f"])
        .arg(format!("berth-shim.*{lost}"))
        .status();
    {
        let store = berth::store::Store::open(&d.root().join("berth.redb")).expect("store");
        store
            .delete_record(berth::store::CONTAINERS, &lost)
            .expect("forget the record");
    }
    // ... and a pod directory whose record was never saved, with a tmpfs /dev/shm in it.
    let ghost = d.state().join("sandboxes/ghost");
    std::fs::create_dir_all(ghost.join("shm")).expect("ghost dir");
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(ghost.join("shm"))
        .status()
        .expect("mount");
    assert!(status.success());

    d.spawn();
    let c = d.client().await;
    assert!(!mounted(&bundle.join("rootfs")), "the rootfs is unmounted");
    assert!(!bundle.exists(), "the bundle is gone");
    assert!(
        !mounted(&ghost.join("shm")) && !ghost.exists(),
        "the pod dir is gone"
    );
    assert_eq!(
        d.snapshot_dirs().len(),
        snapshots_before.len() + 1,
        "only the kept container's snapshot is left"
    );
    let listed = containers(&c).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, kept);
    assert_eq!(exec_ok(&c, &kept, &["echo", "alive"]).await, "alive\n");
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn a_stopped_shim_does_not_hold_up_other_containers_or_pods() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let mode = cri::NamespaceMode::Container;
    let pod1_cfg = pod_config("hung", &logs, mode);
    let pod1 = run_pod(&c, &pod1_cfg).await;
    let hung = run_container(
        &c,
        &pod1,
        &pod1_cfg,
        sh_container("hung", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let pod2_cfg = pod_config("healthy", &logs, mode);
    let pod2 = run_pod(&c, &pod2_cfg).await;
    let healthy = run_container(
        &c,
        &pod2,
        &pod2_cfg,
        sh_container("healthy", &busybox, "exec sleep 1000", mode),
    )
    .await;
    let shim = shim_pid(&hung);
    let stop = |sig: &str| {
        std::process::Command::new("kill")
            .arg(sig)
            .arg(shim.to_string())
            .status()
            .expect("kill")
    };
    stop("-STOP");
    // Liveness guard only (a hang fails the test instead of blocking it forever).
    let guard = Duration::from_secs(30);
    let listed = tokio::time::timeout(guard, containers(&c)).await;
    let listed = listed.expect("ListContainers does not hang on a stopped shim");
    assert_eq!(
        listed.len(),
        2,
        "both listed, the hung one with its last known state"
    );
    assert!(
        listed
            .iter()
            .all(|x| x.1 == cri::ContainerState::ContainerRunning as i32)
    );
    let other = tokio::time::timeout(guard, exec_ok(&c, &healthy, &["echo", "ok"]))
        .await
        .expect("exec in another pod is not held up");
    assert_eq!(other, "ok\n");
    let pod3_cfg = pod_config("newcomer", &logs, mode);
    let pod3 = tokio::time::timeout(guard, run_pod(&c, &pod3_cfg))
        .await
        .expect("a new pod is not held up");
    // Status calls answer from berthd's own state: the hung one as last known (running).
    for id in [&hung, &healthy] {
        let s = tokio::time::timeout(guard, container_status(&c, id))
            .await
            .expect("ContainerStatus does not hang")
            .expect("ContainerStatus");
        assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    }
    let pods = tokio::time::timeout(guard, sandboxes(&c))
        .await
        .expect("ListPodSandbox does not hang");
    assert_eq!(pods.len(), 3);
    let s = tokio::time::timeout(guard, sandbox_status(&c, &pod1))
        .await
        .expect("PodSandboxStatus does not hang");
    assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
    let newcomer = tokio::time::timeout(
        guard,
        run_container(
            &c,
            &pod3,
            &pod3_cfg,
            sh_container("newcomer", &busybox, "exec sleep 1000", mode),
        ),
    )
    .await
    .expect("a new container is not held up");
    assert_eq!(
        container_status(&c, &newcomer).await.expect("status").state,
        cri::ContainerState::ContainerRunning as i32
    );
    // Calls that need the stopped shim itself fail with DeadlineExceeded, naming the container.
    let e = tokio::time::timeout(guard, exec(&c, &hung, &["true"], 1))
        .await
        .expect("exec on the hung shim returns")
        .expect_err("the shim cannot answer");
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    let e = tokio::time::timeout(
        guard,
        c.runtime().stop_container(cri::StopContainerRequest {
            container_id: hung.clone(),
            timeout: 1,
        }),
    )
    .await
    .expect("StopContainer on the hung shim returns")
    .expect_err("the shim cannot answer");
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains(&hung), "{}", e.message());
    stop("-CONT");
    for p in [pod1, pod2, pod3] {
        remove_pod(&c, &p).await;
    }
}
