//! The agent's eviction manager: pressure conditions, admission under pressure, evictions in
//! the kubelet's order, allocatable.

mod agent_support;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agent_support::*;
use common::TempDir;
use serde_json::Value;

/// A small tmpfs of the test's own, unmounted when dropped (even when the test fails).
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Self {
        let dir = TempDir::new("evictfs");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mounting a tmpfs on {}", dir.path().display());
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn available(&self) -> u64 {
        let st = rustix::fs::statvfs(self.path()).expect("statvfs");
        st.f_bavail * st.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A quantity (`64Mi`, `1500m`, `12345Ki`, `7`) in base units (millis for `m`).
fn amount(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    for (s, mult) in units {
        if let Some(n) = q.strip_suffix(s) {
            return n.parse::<u64>().expect("number") * mult;
        }
    }
    q.parse().expect("plain quantity")
}

fn millicpu(q: &str) -> u64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().expect("millis"),
        None => q.parse::<u64>().expect("cores") * 1000,
    }
}

fn node_condition(node: &Value, kind: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|v| v.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or(Value::Null)
}

fn wait_condition(a: &Agent, kind: &str, status: &str) -> Value {
    let mut found = Value::Null;
    a.wait(&format!("{kind} {status}"), Duration::from_secs(30), |a| {
        found = node_condition(&a.get("/node").1, kind);
        found["status"] == status
    });
    found
}

/// The first threshold of the `nodefs.available` signal in a `/node/reports` answer.
fn nodefs_threshold(reports: &Value) -> Value {
    reports["eviction"]["signals"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["signal"] == "nodefs.available"))
        .map(|s| s["thresholds"][0].clone())
        .unwrap_or(Value::Null)
}

/// Eviction checks done so far.
fn checks(a: &Agent) -> u64 {
    a.get("/node/reports").1["eviction"]["checks"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits until the eviction manager has done `n` checks in all.
fn wait_checks(a: &Agent, n: u64) {
    a.wait(
        &format!("{n} eviction checks"),
        Duration::from_secs(60),
        |a| checks(a) >= n,
    );
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

fn evicted(p: &Value) -> bool {
    phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
}

const PERIODS: &str = "eviction_monitoring_period_secs = 1.0\n\
                       eviction_pressure_transition_period_secs = 2.0\n\
                       system_reserved = { memory = \"1Gi\" }\n\
                       kube_reserved = { cpu = \"500m\" }\n";

/// An agent whose pod log directory (so its nodefs: the smaller filesystem counts) is `fs`,
/// set through a `--config-dir` drop-in (kept alive by the returned TempDir).
fn agent_on_small_nodefs(fs: &Tmpfs, agent_toml: &str) -> (Agent, TempDir) {
    let dropins = TempDir::new("evictconf");
    std::fs::write(
        dropins.path().join("50-nodefs.toml"),
        format!("[agent]\npod_log_dir = {:?}\n", fs.path()),
    )
    .expect("drop-in");
    let a = Agent::start_with_config(
        &["--config-dir".into(), dropins.path().display().to_string()],
        agent_toml,
    );
    (a, dropins)
}

/// nodefs is the pods' log directory on a 64 MiB tmpfs (the pods dir is on the big disk: the
/// smaller filesystem counts). Filling it crosses `nodefs.available < 20Mi`: DiskPressure, the
/// BestEffort pod evicted first (it uses more than its request of 0), the Burstable one (within
/// its 1Gi request) a period later; freed, the condition goes after the transition period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_pressure_evicts_best_effort_first_then_burstable_and_clears() {
    let fs = Tmpfs::mount(64);
    let (a, _dropins) = agent_on_small_nodefs(
        &fs,
        &format!("{PERIODS}eviction_hard = {{ \"nodefs.available\" = \"20Mi\" }}\n"),
    );
    a.write(
        "be.yaml",
        &pod_yaml("be", "echo hello from be; sleep 3600", "", ""),
    );
    let requests =
        "    resources:\n      requests:\n        memory: 10Mi\n        ephemeral-storage: 1Gi\n";
    a.write(
        "bu.yaml",
        &pod_yaml("bu", "echo hello from bu; sleep 3600", "", requests),
    );
    a.wait_pod("default", "be", "be running", |p| running(p, "main"));
    a.wait_pod("default", "bu", "bu running", |p| running(p, "main"));
    assert_eq!(
        node_condition(&a.get("/node").1, "DiskPressure")["reason"],
        "KubeletHasNoDiskPressure"
    );

    // Allocatable: capacity minus the reserves and the hard thresholds, nodefs being the tmpfs.
    let node = a.get("/node").1;
    let (cap, alloc) = (&node["status"]["capacity"], &node["status"]["allocatable"]);
    let q = |v: &Value, k: &str| {
        v[k].as_str()
            .unwrap_or_else(|| panic!("{k} in {v}"))
            .to_string()
    };
    assert_eq!(amount(&q(cap, "ephemeral-storage")), 64 << 20, "{cap}");
    assert_eq!(amount(&q(alloc, "ephemeral-storage")), 44 << 20, "{alloc}");
    assert_eq!(
        amount(&q(alloc, "memory")),
        amount(&q(cap, "memory")) - (1 << 30)
    );
    assert_eq!(millicpu(&q(alloc, "cpu")), millicpu(&q(cap, "cpu")) - 500);
    assert_eq!(q(alloc, "pods"), "110");
    let (_, reports) = a.get("/node/reports");
    let ev = &reports["eviction"];
    assert_eq!(
        ev["nodefs"].as_str().map(PathBuf::from),
        Some(fs.path().to_path_buf()),
        "{ev}"
    );
    let nodefs = ev["signals"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["signal"] == "nodefs.available"))
        .cloned()
        .unwrap_or_else(|| panic!("nodefs.available in {ev}"));
    assert_eq!(nodefs["capacity"], 64u64 << 20);
    assert_eq!(nodefs["thresholds"][0]["met"], false, "{nodefs}");

    // Fill the tmpfs down to 8 MiB left.
    let filler = fs.path().join("filler");
    let size = fs.available().saturating_sub(8 << 20);
    std::fs::write(&filler, vec![0u8; size as usize]).expect("fill");
    let cond = wait_condition(&a, "DiskPressure", "True");
    assert_eq!(cond["reason"], "KubeletHasDiskPressure");
    let be = a.wait_pod("default", "be", "be evicted", evicted);
    let msg = be["status"]["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 20Mi, available: "
        ) && msg.contains("Container main was using ")
            && msg.contains("request is 0, has larger consumption of ephemeral-storage."),
        "{msg}"
    );
    let bu = a.wait_pod("default", "bu", "bu evicted", evicted);
    assert!(
        bu["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("low on resource: ephemeral-storage")),
        "{bu}"
    );
    let (_, reports) = a.get("/node/reports");
    let order: Vec<&str> = reports["eviction"]["evictions"]
        .as_array()
        .expect("evictions")
        .iter()
        .filter_map(|e| e["pod"].as_str())
        .collect();
    assert_eq!(order, ["default/be", "default/bu"]);

    let (_, reports) = a.get("/node/reports");
    assert_eq!(
        nodefs_threshold(&reports)["met"],
        true,
        "still filled: {}",
        reports["eviction"]
    );

    // Freed: DiskPressure stays for the transition period (2 s, checked every 1 s), then goes.
    // The first check that sees the threshold no longer met still reports the condition.
    std::fs::remove_file(&filler).expect("free");
    let freed = Instant::now();
    let mut relieved = Value::Null;
    a.wait(
        "nodefs.available no longer met",
        Duration::from_secs(30),
        |a| {
            relieved = a.get("/node/reports").1;
            nodefs_threshold(&relieved)["met"] == false
        },
    );
    assert_eq!(
        relieved["eviction"]["conditions"],
        serde_json::json!(["DiskPressure"]),
        "DiskPressure kept through the transition period: {}",
        relieved["eviction"]
    );
    let cond = wait_condition(&a, "DiskPressure", "False");
    assert_eq!(cond["reason"], "KubeletHasNoDiskPressure");
    assert!(
        freed.elapsed() >= Duration::from_millis(900),
        "{:?}",
        freed.elapsed()
    );
    a.finish().await;
}

/// A soft threshold: DiskPressure as soon as it is crossed (the kubelet's rule), evictions only
/// once it stayed crossed for its grace period, with the pod's grace capped at the maximum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_threshold_evicts_only_after_its_grace_period() {
    let fs = Tmpfs::mount(64);
    let (a, _dropins) = agent_on_small_nodefs(
        &fs,
        &format!(
            "{PERIODS}eviction_hard = {{}}\n\
             eviction_soft = {{ \"nodefs.available\" = \"20Mi\" }}\n\
             eviction_soft_grace_period_secs = {{ \"nodefs.available\" = 4.0 }}\n\
             eviction_max_pod_grace_period_secs = 0\n"
        ),
    );
    a.write("be.yaml", &pod_yaml("be", "echo hello; sleep 3600", "", ""));
    a.wait_pod("default", "be", "be running", |p| running(p, "main"));
    let size = fs.available().saturating_sub(8 << 20);
    std::fs::write(fs.path().join("filler"), vec![0u8; size as usize]).expect("fill");
    // The grace period counts from the first check that finds the threshold crossed: that
    // check reports it met, its grace period not, and nobody evicted.
    let mut first_met = Value::Null;
    a.wait("the soft threshold met", Duration::from_secs(30), |a| {
        first_met = a.get("/node/reports").1;
        nodefs_threshold(&first_met)["met"] == true
    });
    let pressure_at = Instant::now();
    let soft = nodefs_threshold(&first_met);
    assert_eq!(soft["kind"], "soft", "{soft}");
    assert_eq!(soft["gracePeriodMet"], false, "{}", first_met["eviction"]);
    assert_eq!(
        first_met["eviction"]["evictions"],
        serde_json::json!([]),
        "{}",
        first_met["eviction"]
    );
    assert_eq!(
        first_met["eviction"]["conditions"],
        serde_json::json!(["DiskPressure"]),
        "DiskPressure as soon as the soft threshold is crossed: {}",
        first_met["eviction"]
    );
    wait_condition(&a, "DiskPressure", "True");
    a.wait_pod("default", "be", "be evicted", evicted);
    let waited = pressure_at.elapsed();
    assert!(waited >= Duration::from_secs(3), "evicted after {waited:?}");
    let (_, reports) = a.get("/node/reports");
    let e = &reports["eviction"]["evictions"][0];
    assert_eq!(e["signal"], "nodefs.available", "{e}");
    assert_eq!(e["graceSecs"], 0, "{e}");
    a.finish().await;
}

/// A memory.available threshold above the node's memory: always under memory pressure. A
/// BestEffort pod is refused at admission; a system-node-critical one runs and is never evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_refuses_best_effort_and_spares_critical_pods() {
    let a = Agent::start_with_config(
        &[],
        &format!("{PERIODS}eviction_hard = {{ \"memory.available\" = \"1000Ti\" }}\n"),
    );
    let cond = wait_condition(&a, "MemoryPressure", "True");
    assert_eq!(cond["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(
        node_condition(&a.get("/node").1, "DiskPressure")["status"],
        "False"
    );
    let node = a.get("/node").1;
    assert_eq!(node["status"]["allocatable"]["memory"], "0", "{node}");

    a.write(
        "crit.yaml",
        &pod_yaml(
            "crit",
            "sleep 3600",
            "  priorityClassName: system-node-critical\n",
            "",
        ),
    );
    a.wait_pod("default", "crit", "crit running", |p| running(p, "main"));
    a.write("be.yaml", &pod_yaml("be", "sleep 3600", "", ""));
    let be = a.wait_pod("default", "be", "be refused", evicted);
    assert!(
        be["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("The node had condition: [MemoryPressure]")),
        "{be}"
    );
    // Several checks under pressure (counted from now): the critical pod is never evicted.
    let before = checks(&a);
    wait_checks(&a, before + 3);
    let crit = a.pod("default", "crit").expect("crit");
    assert!(
        running(&crit, "main") && restarts(&crit, "main") == 0,
        "{crit}"
    );
    let (_, reports) = a.get("/node/reports");
    let ev = &reports["eviction"];
    assert!(ev["checks"].as_u64() >= Some(4), "{ev}");
    assert!(ev["checks"].as_u64() >= Some(before + 3), "{ev}");
    assert_eq!(ev["conditions"], serde_json::json!(["MemoryPressure"]));
    assert_eq!(ev["evictions"], serde_json::json!([]));
    let memory = ev["signals"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["signal"] == "memory.available"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(memory["thresholds"][0]["met"], true, "{memory}");
    assert!(
        memory["available"].as_u64() < memory["capacity"].as_u64(),
        "{memory}"
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_disk_pressure_first_removes_unused_images() {
    // imagefs.available above what this disk has free: always under DiskPressure. Image GC's own
    // thresholds (100 %) never act; the eviction manager's node-level reclaim must.
    let a = Agent::start_with_config(
        &[],
        "eviction_monitoring_period_secs = 0.5\nimage_gc_high_threshold_percent = 100\n\
         image_gc_low_threshold_percent = 100\nimage_minimum_gc_age_secs = 0.0\n\
         [agent.eviction_hard]\n\"imagefs.available\" = \"99%\"\n",
    );
    let c = a.daemon.client().await;
    common::pull(&c, &common::image("layers"))
        .await
        .expect("pull");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = common::list(&c).await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unused image was not reclaimed: {:?}\n{}",
            left.iter().map(|i| &i.repo_tags).collect::<Vec<_>>(),
            a.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.wait("the reclaim logged", Duration::from_secs(10), |a| {
        a.daemon
            .log()
            .contains("disk pressure: removed unused images before evicting pods")
    });
    wait_condition(&a, "DiskPressure", "True");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_local_storage_limits_are_evicted() {
    let a = Agent::start_with_config(&[], "eviction_monitoring_period_secs = 0.5\n");
    // An emptyDir on disk over its sizeLimit, and a container over its ephemeral-storage limit;
    // a third pod within its limits stays.
    a.write(
        "fills-volume.yaml",
        &pod_yaml(
            "fills-volume",
            "dd if=/dev/zero of=/scratch/blob bs=1M count=3 && sleep 3600",
            "  volumes:\n  - name: scratch\n    emptyDir: {sizeLimit: 1Mi}\n",
            "    volumeMounts:\n    - {name: scratch, mountPath: /scratch}\n",
        ),
    );
    a.write(
        "fills-rootfs.yaml",
        &pod_yaml(
            "fills-rootfs",
            "dd if=/dev/zero of=/blob bs=1M count=3 && sleep 3600",
            "",
            // A second container without a limit: the pod has no total limit, so the
            // container's own limit is what breaks.
            &format!(
                "    resources: {{limits: {{ephemeral-storage: 1Mi}}}}\n  - name: side\n    image: {}\n    command: [sleep, \"3600\"]\n",
                common::image("busybox")
            ),
        ),
    );
    a.write(
        "fills-pod.yaml",
        &pod_yaml(
            "fills-pod",
            "dd if=/dev/zero of=/blob bs=1M count=3 && sleep 3600",
            "",
            "    resources: {limits: {ephemeral-storage: 1Mi}}\n",
        ),
    );
    a.write(
        "within.yaml",
        &pod_yaml(
            "within",
            "dd if=/dev/zero of=/blob bs=1k count=10 && sleep 3600",
            "  volumes:\n  - name: scratch\n    emptyDir: {sizeLimit: 10Mi}\n",
            "    resources: {limits: {ephemeral-storage: 50Mi}}\n    volumeMounts:\n    - {name: scratch, mountPath: /scratch}\n",
        ),
    );
    let p = a.wait_pod("default", "fills-volume", "fills-volume evicted", evicted);
    assert_eq!(
        p["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    let p = a.wait_pod("default", "fills-rootfs", "fills-rootfs evicted", evicted);
    assert_eq!(
        p["status"]["message"],
        "Container main exceeded its local ephemeral storage limit \"1Mi\". "
    );
    let p = a.wait_pod("default", "fills-pod", "fills-pod evicted", evicted);
    assert_eq!(
        p["status"]["message"],
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. "
    );
    // Checks after the third eviction leave the pod within its limits running.
    let before = checks(&a);
    wait_checks(&a, before + 3);
    let within = a.pod("default", "within").expect("within");
    assert!(running(&within, "main"), "{within}");
    let (_, reports) = a.get("/node/reports");
    let evicted_pods: Vec<&str> = reports["eviction"]["evictions"]
        .as_array()
        .expect("evictions")
        .iter()
        .filter_map(|e| e["pod"].as_str())
        .collect();
    assert!(
        !evicted_pods.contains(&"default/within"),
        "{evicted_pods:?}"
    );
    a.finish().await;
}
