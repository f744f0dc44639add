//! Graceful node shutdown through `berthctl node shutdown`: regular pods end first, critical
//! pods last within their share; new pods are refused; a plain SIGTERM to berthd ends nothing.

mod agent_support;
mod cni_support;
mod common;

use std::time::{Duration, Instant};

use agent_support::*;
use serde_json::Value;

fn berthctl(a: &Agent, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("--agent-address")
        .arg(format!("127.0.0.1:{}", a.port()))
        .arg("--agent-socket")
        .arg(a.daemon.state().join("agent/agent.sock"))
        .args(args)
        .output()
        .expect("run berthctl")
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_shutdown_ends_regular_pods_then_critical_ones() {
    let a = Agent::start_with_config(
        &[],
        "shutdown_grace_period_secs = 6.0\nshutdown_grace_period_critical_pods_secs = 3.0\n",
    );
    // The regular pod takes a second to stop after SIGTERM; the critical one ignores SIGTERM,
    // so it lives until its share of the period (3 s) runs out and it is killed.
    start_regular_and_critical_pods(&a, "sleep 1");

    let port = a.port();
    let socket = a.daemon.state().join("agent/agent.sock");
    let shutdown = std::thread::spawn(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_berthctl"))
            .arg("--agent-address")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--agent-socket")
            .arg(&socket)
            .args(["-o", "json", "node", "shutdown"])
            .output()
            .expect("run berthctl node shutdown")
    });
    // While the critical pod still has its share to go, the regular one is already Failed.
    let begun = Instant::now();
    let mut saw_order = false;
    while begun.elapsed() < Duration::from_secs(20) && !shutdown.is_finished() {
        let (r, c) = (a.pod("default", "regular"), a.pod("default", "critical"));
        if let (Some(r), Some(c)) = (r, c)
            && phase(&r) == "Failed"
            && phase(&c) == "Running"
        {
            saw_order = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = shutdown.join().expect("shutdown thread");
    assert!(
        out.status.success(),
        "berthctl node shutdown: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        saw_order,
        "never saw the regular pod Failed while the critical one ran"
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let groups = report["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2, "{report}");
    assert_eq!(groups[0]["pods"], serde_json::json!(["default/regular"]));
    assert_eq!(groups[0]["graceSecs"], 3);
    assert_eq!(groups[0]["notEnded"], serde_json::json!([]));
    assert_eq!(groups[1]["pods"], serde_json::json!(["default/critical"]));
    assert_eq!(groups[1]["graceSecs"], 3);
    assert_eq!(groups[1]["notEnded"], serde_json::json!([]));
    let (first, second) = (
        groups[0]["endedAfterMs"].as_u64().unwrap_or(0),
        groups[1]["endedAfterMs"].as_u64().unwrap_or(0),
    );
    // The regular pod stopped on its own after about 1 s (before its 3 s share ran out: it
    // exited 0, checked below, not 137); the critical one was killed at the end of its 3 s
    // share, not before.
    assert!(first >= 900, "regular group ended after {first} ms");
    assert!(
        second.saturating_sub(first) >= 2800,
        "critical group took {} ms",
        second.saturating_sub(first)
    );

    for name in ["regular", "critical"] {
        let p = a.pod("default", name).expect("pod");
        assert_eq!(phase(&p), "Failed", "{name}: {p}");
        assert_eq!(p["status"]["reason"], "Terminated");
        assert_eq!(
            p["status"]["message"],
            "Pod was terminated in response to imminent node shutdown."
        );
        assert!(
            !container(&p, "main")["state"]["terminated"].is_null(),
            "{name}: {p}"
        );
        assert_eq!(condition(&p, "DisruptionTarget"), "True", "{name}: {p}");
    }
    // The node says it is going down.
    a.wait("the node NotReady", Duration::from_secs(10), |a| {
        let (_, n) = a.get("/node");
        n["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Ready"
                    && c["status"] == "False"
                    && c["message"] == "node is shutting down"
            })
        })
    });
    // The critical container ignored SIGTERM: it was killed (137); the regular one exited 0.
    let exit = |name: &str| {
        container(&a.pod("default", name).expect("pod"), "main")["state"]["terminated"]["exitCode"]
            .as_i64()
    };
    assert_eq!(exit("regular"), Some(0));
    assert_eq!(exit("critical"), Some(137));

    // No new pod starts on a node that is going down.
    a.write("late.yaml", &pod_yaml("late", "sleep 3600", "", ""));
    let late = a.wait_pod("default", "late", "late refused", |p| phase(p) == "Failed");
    assert_eq!(late["status"]["reason"], "NodeShutdown");
    // A second shutdown is refused.
    let again = berthctl(&a, &["node", "shutdown"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already shutting down"));
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_off_by_default_and_sigterm_leaves_pods_running() {
    let mut a = Agent::start();
    a.write("keep.yaml", &pod_yaml("keep", "sleep 3600", "", ""));
    a.wait_pod("default", "keep", "keep running", |p| running(p, "main"));
    let out = berthctl(&a, &["node", "shutdown"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("graceful node shutdown is off"), "{err}");
    // Any local user reaches the TCP endpoint: it reads, it never shuts the node down. The
    // control socket is root's and its group's only.
    let (code, body) = a.request("POST", "/node/shutdown");
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("agent.sock"),
        "{body}"
    );
    let meta =
        std::fs::metadata(a.daemon.state().join("agent/agent.sock")).expect("control socket");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o660
    );

    // berthctl's other agent views.
    let pods = berthctl(&a, &["pods", "--agent"]);
    let text = String::from_utf8_lossy(&pods.stdout);
    assert!(
        pods.status.success(),
        "{}",
        String::from_utf8_lossy(&pods.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains(" keep "))
        .unwrap_or_default();
    assert!(line.contains("1/1") && line.contains("Running"), "{text}");
    let node = berthctl(&a, &["node"]);
    let text = String::from_utf8_lossy(&node.stdout);
    assert!(node.status.success());
    assert!(
        text.contains("MemoryPressure") && text.contains("Kubelet"),
        "{text}"
    );
    assert!(
        text.contains("allocatable") || text.contains("ALLOCATABLE"),
        "{text}"
    );

    // A restart or an upgrade (SIGTERM) keeps every container running.
    let c = a.daemon.client().await;
    let before: Vec<String> = common_running(&c).await;
    assert_eq!(before.len(), 1);
    a.daemon.stop();
    a.respawn();
    let p = a.wait_pod("default", "keep", "keep running after restart", |p| {
        running(p, "main")
    });
    assert_eq!(restarts(&p, "main"), 0);
    let c = a.daemon.client().await;
    assert_eq!(common_running(&c).await, before);
    a.finish().await;
}

/// Ids of running containers.
async fn common_running(c: &berth::client::CriClient) -> Vec<String> {
    containers(c)
        .await
        .into_iter()
        .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .collect()
}

/// Mount points under `dir` (from /proc/self/mountinfo).
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_ended_by_shutdown_frees_its_memory_volume_at_once() {
    let a = Agent::start_with_config(&[], "shutdown_grace_period_secs = 4.0\n");
    let volume = "    volumeMounts:\n    - name: scratch\n      mountPath: /scratch\n  volumes:\n  - name: scratch\n    emptyDir:\n      medium: Memory\n      sizeLimit: 8Mi\n";
    a.write(
        "mem.yaml",
        &pod_yaml("mem", "echo kept > /scratch/f; exec sleep 3600", "", volume),
    );
    let p = a.wait_pod("default", "mem", "mem running", |p| running(p, "main"));
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let pod_dir = a.daemon.root().join("agent/pods").join(&uid);
    assert_eq!(
        mounts_under(&pod_dir).len(),
        1,
        "the Memory emptyDir is a tmpfs under {}",
        pod_dir.display()
    );

    let out = berthctl(&a, &["node", "shutdown"]);
    assert!(out.status.success(), "{out:?}");
    a.wait_pod("default", "mem", "mem ended", |p| phase(p) == "Failed");
    // Ended while its manifest stays: the tmpfs (its pages) is gone, the pod directory is not.
    assert!(
        mounts_under(&pod_dir).is_empty(),
        "{:?}",
        mounts_under(&pod_dir)
    );
    assert!(pod_dir.is_dir());
    a.finish().await;
}
