//! `berthctl stats` against real containers: a busy one shows its CPU use, and the bytes one
//! writes to its writable layer show as its disk use; `berthctl update` changes a limit;
//! `berthctl metricsp` shows the pod's CRI metrics, labelled.

mod common;

use std::process::Command;

use common::*;
use k8s_cri::v1 as cri;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_cpu_memory_and_disk_per_container() {
    let d = Daemon::start();
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("stats", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    let busy = run_container(
        &c,
        &pod,
        &cfg,
        sh_container(
            "busy",
            &image("busybox"),
            "while :; do :; done",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    let writer = run_container(
        &c,
        &pod,
        &cfg,
        sh_container(
            "writer",
            &image("busybox"),
            "dd if=/dev/zero of=/blob bs=1M count=8 2>/dev/null; exec sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(d.socket())
        .args(["-o", "json", "stats", "--pod", &pod, "--seconds", "1"])
        .output()
        .expect("berthctl stats");
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {rows:?}"))
            .clone()
    };
    let (b, w) = (row(&busy), row(&writer));
    assert!(b["cpu_percent"].as_f64().unwrap_or(0.0) > 30.0, "{b}");
    assert!(w["cpu_percent"].as_f64().unwrap_or(100.0) < 30.0, "{w}");
    assert!(
        b["memory_working_set_bytes"].as_u64().unwrap_or(0) > 0,
        "{b}"
    );
    assert!(
        w["writable_layer_bytes"].as_u64().unwrap_or(0) >= 8 << 20,
        "{w}"
    );
    assert_eq!(rows.len(), 2, "only the pod's containers");
    // The table names both.
    let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(d.socket())
        .args(["stats", "--seconds", "0.2"])
        .output()
        .expect("berthctl stats");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("busy") && text.contains("writer"), "{text}");
    // `berthctl update` changes the limit given and keeps the others.
    let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(d.socket())
        .args(["update", "--memory", "100663296", &writer])
        .output()
        .expect("berthctl update");
    assert!(out.status.success(), "{out:?}");
    let linux = container_status(&c, &writer)
        .await
        .expect("status")
        .resources
        .and_then(|r| r.linux)
        .expect("the limits in force");
    assert_eq!(linux.memory_limit_in_bytes, 100663296, "{linux:?}");
    let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(d.socket())
        .args(["update", "--memory=-5", &writer])
        .output()
        .expect("berthctl update");
    assert!(!out.status.success(), "a negative limit is refused");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&writer),
        "{out:?}"
    );
    // `berthctl metricsp` gives the busy container's CPU time, labelled with its name.
    let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(d.socket())
        .args(["-o", "json", "metricsp", &pod[..8]])
        .output()
        .expect("berthctl metricsp");
    assert!(out.status.success(), "{out:?}");
    let series: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let cpu = series
        .iter()
        .find(|s| {
            s["container"] == busy.as_str() && s["name"] == "container_cpu_usage_seconds_total"
        })
        .unwrap_or_else(|| panic!("busy's CPU time in {series:?}"));
    assert!(cpu["value"].as_u64().unwrap_or(0) > 0, "{cpu}");
    assert_eq!(cpu["labels"]["container"], "busy", "{cpu}");
    assert!(
        series.iter().all(|s| s["pod"] == pod.as_str()),
        "only the pod's series"
    );
    remove_pod(&c, &pod).await;
}
