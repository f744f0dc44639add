//! Chaos: berthd killed with SIGKILL at random moments while pods with networks and containers
//! are created and removed, shims killed under it, the disk under its root filled to ENOSPC and
//! freed, and a CNI plugin hanging; afterwards every pod the CRI reports exists for real and
//! nothing else does, and once every pod is removed no mount, cgroup, network namespace, veth,
//! IP, shim, plugin, process or snapshot is left and the images are intact.
//!
//! The same with the embedded agent running static pods from manifests that come and go.
//!
//! `BERTH_CHAOS_KILLS` sets how many kills (default 5); `hack/soak.sh` runs them longer.

mod agent_support;
mod cni_support;
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth::client::CriClient;
use cni_support::TestNet;
use common::*;
use k8s_cri::v1 as cri;
use sha2::Digest as _;

fn kills() -> u32 {
    std::env::var("BERTH_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    println!("chaos seed {seed}, {} kills", kills());
    seed
}

/// A small xorshift generator: the seed is printed so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }
}

/// Creates and removes pods (each with a network and one container) until the connection
/// breaks; every error is tolerated, as berthd may die in any call.
async fn churn(c: CriClient, image: String, logs: PathBuf, parent: String, first: u32) {
    for i in first.. {
        if !churn_once(&c, &image, &logs, &parent, i).await {
            return;
        }
    }
}

/// One pod made, its container created and started and, for even `i`, the pod removed again.
/// False when the pod could not be made (berthd gone, or the disk full).
async fn churn_once(c: &CriClient, image: &str, logs: &Path, parent: &str, i: u32) -> bool {
    let mut cfg = pod_config(&format!("chaos-{i}"), logs, cri::NamespaceMode::Container);
    cfg.linux.get_or_insert_with(Default::default).cgroup_parent = parent.to_string();
    let Ok(pod) = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        })
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
    else {
        return false;
    };
    let container = sh_container(
        "main",
        image,
        "exec sleep 1000",
        cri::NamespaceMode::Container,
    );
    let created = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container),
            sandbox_config: Some(cfg),
        })
        .await;
    if let Ok(r) = created {
        let _ = c
            .runtime()
            .start_container(cri::StartContainerRequest {
                container_id: r.into_inner().container_id,
            })
            .await;
    }
    if i.is_multiple_of(2) {
        let _ = c
            .runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            })
            .await;
        let _ = c
            .runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod,
            })
            .await;
    }
    true
}

/// Mount points below `dir` (not `dir` itself, which may be the test's tmpfs).
fn mounts_below(dir: &Path) -> Vec<String> {
    let d = format!("{}/", dir.to_string_lossy());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&d))
        .map(str::to_string)
        .collect()
}

/// Processes in a cgroup below `parent`, shims whose command line names `dir`, and processes
/// whose command line names `plugins` (a CNI plugin).
fn processes_of(parent: &str, dir: &Path, plugins: Option<&Path>) -> Vec<String> {
    let plugins = plugins.map(|p| p.to_string_lossy().to_string());
    let dir = dir.to_string_lossy().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        let cmd =
            String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
        if cgroup.contains(parent)
            || (cmd.contains("berth-shim") && cmd.contains(&dir))
            || plugins.as_ref().is_some_and(|p| cmd.contains(p.as_str()))
        {
            out.push(format!("{pid}: {cmd}"));
        }
    }
    out
}

/// Processes whose command line names `path`.
fn commands_naming(path: &Path) -> Vec<String> {
    processes_of(
        "/berth-chaos-none/",
        Path::new("/berth-chaos-none/"),
        Some(path),
    )
}

/// cgroup directories left below `parent` in any hierarchy.
fn cgroups_below(parent: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for h in hierarchies() {
        let top = h.join(parent.trim_start_matches('/'));
        for e in std::fs::read_dir(&top).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                out.push(e.path());
            }
        }
    }
    out
}

/// A berthd whose root is a tmpfs of `size`, so the run can fill it to ENOSPC.
fn daemon_on_tmpfs(args: &[&str], size: &str) -> Daemon {
    let dir = TempDir::new("chaos");
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).expect("mkdir root");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&root)
        .status()
        .expect("mount");
    assert!(st.success(), "mount a tmpfs at {root:?}");
    let mut d = Daemon {
        dir,
        child: None,
        extra_args: args.iter().map(|s| s.to_string()).collect(),
    };
    d.spawn();
    d
}

/// Fills the filesystem under `dir` until a write fails with ENOSPC; returns the filler.
fn fill_disk(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join("chaos-filler");
    let mut f = std::fs::File::create(&path).expect("create filler");
    let chunk = vec![0xa5u8; 1 << 20];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {path:?}: {e}"),
        }
    }
    // The last partial chunk too, so not even a page is free.
    while f.write(&chunk[..4096]).is_ok_and(|n| n > 0) {}
    path
}

/// A CNI plugin, last in the chain, that hangs on every call while `flag` exists and otherwise
/// passes its previous result on.
fn hanging_plugin(net: &TestNet, flag: &Path) {
    let path = net.bin_dir().join("hang");
    let body = format!(
        "#!/bin/sh\nin=$(cat)\n[ -e {flag} ] && echo \"$CNI_COMMAND\" >> {flag}.calls\nwhile [ -e {flag} ]; do sleep 0.1; done\n[ \"$CNI_COMMAND\" = ADD ] && printf '%s' \"$in\" | jq -c .prevResult\nexit 0\n",
        flag = flag.display()
    );
    std::fs::write(&path, body).expect("write plugin");
    let mut perm = std::fs::metadata(&path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&path, perm).expect("chmod");
}

/// Content blobs whose bytes do not hash to their name.
fn corrupt_blobs(root: &Path) -> (usize, Vec<String>) {
    let dir = root.join("content/blobs/sha256");
    let mut checked = 0;
    let mut bad = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let bytes = std::fs::read(e.path()).unwrap_or_default();
        checked += 1;
        if hex::encode(sha2::Sha256::digest(&bytes)) != name {
            bad.push(name);
        }
    }
    (checked, bad)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_pod_churn_loses_and_leaks_nothing() {
    let kills = kills();
    let mut rng = Rng(seed());
    let net = TestNet::new("chaos");
    net.bridge_up();
    let hang_flag = net.bin_dir().with_file_name("hang-flag");
    hanging_plugin(&net, &hang_flag);
    let mut plugins = net.standard()["plugins"]
        .as_array()
        .cloned()
        .expect("plugins");
    plugins.push(serde_json::json!({ "type": "hang" }));
    net.write("10-test.conflist", &net.conflist("1.0.0", plugins));
    let args = net.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = daemon_on_tmpfs(&args, "256m");
    let c = d.client().await;
    let busybox = image("busybox");
    let image_id = pull(&c, &busybox).await.expect("pull");
    let snapshots = d.snapshot_dirs();
    let logs = d.dir.path().join("logs");
    let parent = format!("/berth-chaos-{}", std::process::id());
    let begun = Instant::now();

    let mut shims_killed = 0;
    let (mut full_rounds, mut hang_rounds) = (0, 0);
    for round in 0..kills {
        // Every fifth round from the third runs on a full disk, every fifth from the fifth with
        // the CNI chain hanging: each lasts past the kill and ends after the restart.
        let filler = (round % 5 == 2).then(|| fill_disk(&d.root()));
        let hang = round % 5 == 4;
        if hang {
            std::fs::write(&hang_flag, b"").expect("hang flag");
        }
        full_rounds += u32::from(filler.is_some());
        hang_rounds += u32::from(hang);
        let c = d.client().await;
        let worker = tokio::spawn(churn(
            c.clone(),
            busybox.clone(),
            logs.clone(),
            parent.clone(),
            round * 1000,
        ));
        tokio::time::sleep(Duration::from_millis(200 + rng.next(1000))).await;
        // Now and then a shim dies too.
        if rng.next(2) == 0
            && let Some(ct) = list_containers(&c)
                .await
                .into_iter()
                .find(|ct| ct.state == cri::ContainerState::ContainerRunning as i32)
            && let Some(pid) = find_shim(&ct.id)
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            shims_killed += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.next(400))).await;
        d.kill9();
        if hang {
            // A plugin call hanging when berthd died ends with it, not when the plugin would.
            let hung = net.bin_dir().join("hang");
            let deadline = Instant::now() + Duration::from_secs(2);
            while !commands_naming(&hung).is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let left = commands_naming(&hung);
            assert!(left.is_empty(), "plugins outliving berthd: {left:?}");
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
        d.spawn();
        if let Some(filler) = filler {
            // berthd came back on the full disk; a few calls fail there, then it is freed.
            let c = d.client().await;
            churn_once(&c, &busybox, &logs, &parent, round * 1000 + 999).await;
            std::fs::remove_file(filler).expect("free the disk");
        }
        if hang {
            let _ = std::fs::remove_file(&hang_flag);
        }
    }

    // What the CRI reports exists, and what exists is reported.
    let c = d.client().await;
    let pods = list_pod_sandboxes(&c).await;
    let containers = list_containers(&c).await;
    let listed_pods: BTreeSet<String> = pods.iter().map(|p| p.id.clone()).collect();
    let listed_containers: BTreeSet<String> = containers.iter().map(|c| c.id.clone()).collect();
    let pod_dirs: BTreeSet<String> = settled_entries(&d.state().join("sandboxes"))
        .into_iter()
        .collect();
    let bundles: BTreeSet<String> = settled_entries(&d.root().join("containers"))
        .into_iter()
        .collect();
    assert_eq!(listed_pods, pod_dirs, "pods listed = pod directories");
    assert_eq!(listed_containers, bundles, "containers listed = bundles");
    for p in &pods {
        if p.state == cri::PodSandboxState::SandboxReady as i32 {
            assert!(
                mounted(&d.state().join("sandboxes").join(&p.id).join("netns")),
                "ready pod {} has its network namespace",
                p.id
            );
        }
    }
    let mut running = 0;
    for ct in &containers {
        if ct.state == cri::ContainerState::ContainerRunning as i32 {
            running += 1;
            assert_eq!(
                exec_ok(&c, &ct.id, &["echo", "alive"]).await,
                "alive\n",
                "running container {} answers",
                ct.id
            );
        }
    }

    // Every pod removed: nothing is left.
    for p in &pods {
        remove_pod(&c, &p.id).await;
    }
    assert!(list_pod_sandboxes(&c).await.is_empty());
    assert!(list_containers(&c).await.is_empty());
    assert!(settled_entries(&d.state().join("sandboxes")).is_empty());
    let left = settled_entries(&d.root().join("containers"));
    assert!(left.is_empty(), "bundles left: {left:?}");
    assert_eq!(d.snapshot_dirs(), snapshots, "only the image's snapshots");
    for dir in [d.root(), d.state()] {
        assert!(mounts_below(&dir).is_empty(), "{:?}", mounts_below(&dir));
    }
    assert!(net.veths().is_empty(), "veths left: {:?}", net.veths());
    assert!(
        net.allocations().is_empty(),
        "IPs left: {:?}",
        net.allocations()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_of(&parent, &d.root(), Some(&net.bin_dir().join("hang"))).is_empty()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        processes_of(&parent, &d.root(), Some(&net.bin_dir().join("hang"))).is_empty(),
        "{:?}",
        processes_of(&parent, &d.root(), Some(&net.bin_dir().join("hang")))
    );
    assert!(
        cgroups_below(&parent).is_empty(),
        "{:?}",
        cgroups_below(&parent)
    );
    let status = status(&c, &busybox)
        .await
        .expect("the image is still there");
    assert_eq!(status.id, image_id);
    let (blobs, bad) = corrupt_blobs(&d.root());
    assert!(bad.is_empty(), "corrupt blobs: {bad:?}");
    println!(
        "chaos: {kills} kills of berthd and {shims_killed} of shims in {:.1} s ({full_rounds} rounds on a full disk, {hang_rounds} with a hanging CNI plugin, which hung {} calls); after them {} pods and {} containers ({running} running) matched the disk; {blobs} blobs re-verified",
        begun.elapsed().as_secs_f64(),
        std::fs::read_to_string(hang_flag.with_extension("calls"))
            .unwrap_or_default()
            .lines()
            .count(),
        pods.len(),
        containers.len(),
    );
    for h in hierarchies() {
        let _ = std::fs::remove_dir(h.join(parent.trim_start_matches('/')));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_the_agent_runs_static_pods_loses_and_leaks_nothing() {
    use agent_support::{Agent, pod_yaml, running};
    let kills = kills();
    let mut rng = Rng(seed());
    let mut a = Agent::start();
    let begun = Instant::now();
    for round in 0..kills {
        // A pod comes, an older one goes, and berthd dies at a random moment meanwhile.
        a.write(
            &format!("p{round}.yaml"),
            &pod_yaml(&format!("p{round}"), "exec sleep 1000", "", ""),
        );
        if round >= 2 {
            let _ = std::fs::remove_file(a.manifest(&format!("p{}.yaml", round - 2)));
        }
        tokio::time::sleep(Duration::from_millis(200 + rng.next(1200))).await;
        a.daemon.kill9();
        a.respawn();
    }
    // The agent converges: the pods of the manifests left run, one sandbox each.
    let kept: Vec<u32> = (kills.saturating_sub(2)..kills).collect();
    for i in &kept {
        a.wait_pod("default", &format!("p{i}"), "the pod running", |p| {
            running(p, "main")
        });
    }
    // ... and the pods of the manifests that went (also while berthd was down) end.
    let c = a.daemon.client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let ready: Vec<String> = list_pod_sandboxes(&c)
            .await
            .into_iter()
            .filter(|p| p.state == cri::PodSandboxState::SandboxReady as i32)
            .filter_map(|p| p.metadata.map(|m| m.name))
            .collect();
        if ready.len() == kept.len() || Instant::now() > deadline {
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        ready.len(),
        kept.len(),
        "one ready sandbox per pod: {ready:?}"
    );
    a.finish().await;
    let (root, state) = (a.daemon.root(), a.daemon.state());
    assert!(list_containers(&c).await.is_empty());
    let left = settled_entries(&root.join("containers"));
    assert!(left.is_empty(), "bundles left: {left:?}");
    assert!(settled_entries(&state.join("sandboxes")).is_empty());
    for dir in [root.clone(), state.clone()] {
        assert!(mounts_below(&dir).is_empty(), "{:?}", mounts_below(&dir));
    }
    let cgroup_root = a.cgroup_root();
    assert!(
        processes_of(&cgroup_root, &root, None).is_empty(),
        "{:?}",
        processes_of(&cgroup_root, &root, None)
    );
    println!(
        "agent chaos: {kills} kills of berthd in {:.1} s; {} pods converged, then every pod and sandbox removed and nothing left",
        begun.elapsed().as_secs_f64(),
        kept.len()
    );
}
