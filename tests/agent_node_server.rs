//! The agent's node server through a real API server 1.20 and kubectl 1.20, as a cluster's users
//! reach a node: `kubectl logs` (tail, limit, timestamps, follow, previous), `kubectl exec` (exit
//! code, stdin, a terminal), `kubectl attach`, `kubectl port-forward` moving bytes over the pod
//! network, `/stats/summary` and `/metrics/resource` through the API server's node proxy with
//! values that match the pod's cgroup; and the node server's own checks: 401 without
//! credentials or with a certificate from another CA, 403 for a token without `nodes/proxy`,
//! 404 naming an unknown pod. The API server verifies the node server's certificate
//! (`--kubelet-certificate-authority`) and authenticates with its kubelet client certificate.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod kubelet_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster_node::{AgentNode, service_account_token};
use common::*;
use kubelet_support::control_plane::PlaneOptions;

/// A control plane whose API server verifies nodes' serving certificates.
fn verifying() -> PlaneOptions {
    PlaneOptions {
        verify_kubelets: true,
        ..Default::default()
    }
}

/// A node whose server has a certificate from the cluster CA and takes the API server's client
/// certificate.
fn node() -> AgentNode {
    AgentNode::start_with("", &verifying(), |cp, _| {
        let (crt, key) = cp.issue("node-serving", "/CN=node-serving", Some("IP:127.0.0.1"));
        (
            cp.node_kubeconfig(),
            vec![
                "--tls-cert-file".into(),
                crt.display().to_string(),
                "--tls-private-key-file".into(),
                key.display().to_string(),
                "--client-ca-file".into(),
                cp.ca().display().to_string(),
            ],
        )
    })
}

/// Deletes the test's pods and waits until the agent has removed them.
async fn finish(n: &AgentNode) {
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pods", "--all", "--wait=false"]);
    n.agent.finish().await;
}

/// A pod of `n`'s namespace bound to its node, on the pod network unless `host_network`.
fn create(n: &AgentNode, name: &str, script: &str, extra_spec: &str) {
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n{extra_spec}  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, {script:?}]\n",
        ns = n.ns,
        node = n.node,
        image = image("busybox:latest"),
    ));
}

fn kubectl(n: &AgentNode) -> Command {
    let mut c = n.cp.kubectl_command();
    c.args(["-n", &n.ns]);
    c
}

/// Runs `c` to its end within 60 s: (exit code, stdout, stderr).
fn run(c: &mut Command, stdin: &[u8]) -> (i32, String, String) {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{c:?} did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The first `count` lines a long-running command prints (it is killed then), within 30 s.
fn first_lines(c: &mut Command, count: usize, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines.len() < count && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200))
            && keep(&l)
        {
            lines.push(l);
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        lines.len(),
        count,
        "{c:?}: {lines:?}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

const TALKER: &str = "echo one; echo two >&2; echo three; i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.3; done";

#[tokio::test]
async fn kubectl_logs_exec_attach_and_port_forward_reach_the_pods_through_the_node_server() {
    let n = node();
    create(&n, "talker", TALKER, "  hostNetwork: true\n");
    create(
        &n,
        "crasher",
        "echo run-$(cat /proc/sys/kernel/random/uuid); sleep 1; exit 1",
        "  hostNetwork: true\n",
    );
    create(
        &n,
        "web",
        "mkdir -p /www && echo hello-through-the-node > /www/index.html && exec httpd -f -p 8080 -h /www",
        "",
    );
    for pod in ["talker", "web"] {
        n.wait_pod("Running", pod, "{.status.phase}", "Running");
    }

    // Logs: stdout and stderr in order, tail, limit, timestamps, since. The stderr line may
    // reach the log after the first ticks (two pipes), so the checks of the log's end wait
    // until three ticks stand after it.
    let mut all = String::new();
    for _ in 0..100 {
        all = n.cp.kubectl_ok(&["-n", &n.ns, "logs", "talker"]);
        let after_two = all.lines().skip_while(|l| *l != "two").skip(1);
        if after_two.filter(|l| l.starts_with("tick ")).count() >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // stdout in order, stderr among it (two streams: their order between them is the shim's).
    let stdout: Vec<&str> = all.lines().filter(|l| *l != "two").take(3).collect();
    assert_eq!(stdout, ["one", "three", "tick 0"], "{all}");
    assert!(all.lines().any(|l| l == "two"), "stderr missing: {all}");
    let tail =
        n.cp.kubectl_ok(&["-n", &n.ns, "logs", "talker", "--tail=1"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");
    assert!(tail.starts_with("tick "), "{tail}");
    let limited =
        n.cp.kubectl_ok(&["-n", &n.ns, "logs", "talker", "--limit-bytes=3"]);
    assert_eq!(limited, "one");
    let stamped =
        n.cp.kubectl_ok(&["-n", &n.ns, "logs", "talker", "--timestamps", "--tail=2"]);
    for line in stamped.lines() {
        let (time, text) = line.split_once(' ').expect("time and text");
        assert!(time.starts_with("20") && time.ends_with('Z'), "{line}");
        assert!(text.starts_with("tick "), "{line}");
    }
    let recent =
        n.cp.kubectl_ok(&["-n", &n.ns, "logs", "talker", "--since=1h"]);
    assert!(recent.lines().take(2).any(|l| l == "one"), "{recent}");

    // Follow: new lines arrive as the container writes them.
    let followed = first_lines(
        kubectl(&n).args(["logs", "-f", "--tail=1", "talker"]),
        4,
        |_| true,
    );
    let numbers: Vec<u64> = followed
        .iter()
        .map(|l| {
            l.strip_prefix("tick ")
                .and_then(|v| v.parse().ok())
                .expect("tick N")
        })
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{followed:?}");

    // No previous instance yet: the kubelet's 400.
    let (ok, _, err) = n.cp.kubectl(&["-n", &n.ns, "logs", "-p", "talker"]);
    assert!(!ok);
    assert!(
        err.contains("previous terminated container \"main\" in pod \"talker\" not found"),
        "{err}"
    );
    // After a restart, -p shows the instance before the current one.
    n.cp.wait("crasher restarted", Duration::from_secs(90), |_| {
        n.pod_path("crasher", "{.status.containerStatuses[0].restartCount}")
            .parse::<u32>()
            .is_ok_and(|c| c >= 1)
    });
    let previous = n.cp.kubectl_ok(&["-n", &n.ns, "logs", "-p", "crasher"]);
    let current = n.cp.kubectl_ok(&["-n", &n.ns, "logs", "crasher"]);
    assert!(previous.starts_with("run-") && current.starts_with("run-"));
    assert_ne!(previous, current, "two instances, two runs");

    // Exec: output, exit code, stdin, a terminal.
    let (code, out, err) = run(
        kubectl(&n).args([
            "exec",
            "talker",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ]),
        b"",
    );
    assert_eq!((code, out.as_str()), (3, "out\n"), "{err}");
    assert!(err.contains("err"), "{err}");
    let (code, out, err) = run(
        kubectl(&n).args(["exec", "-i", "talker", "--", "cat"]),
        b"through stdin\n",
    );
    assert_eq!((code, out.as_str()), (0, "through stdin\n"), "{err}");
    let kubectl_line = format!(
        "{} --kubeconfig={} -n {} exec -it talker -- tty",
        kubelet_support::kube_bin("BERTH_TEST_KUBECTL").display(),
        n.cp.admin.display(),
        n.ns
    );
    let (code, out, err) = run(
        Command::new("script").args(["-qec", &kubectl_line, "/dev/null"]),
        b"",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("/dev/pts/"), "{out}");

    // A client that goes away mid-stream leaves no process behind in the container.
    let mut held = kubectl(&n)
        .args(["exec", "talker", "--", "sleep", "4242"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("exec sleep");
    let sleeping = |n: &AgentNode| {
        let (_, out, _) = run(kubectl(n).args(["exec", "talker", "--", "ps"]), b"");
        out.lines().any(|l| l.ends_with("sleep 4242"))
    };
    n.cp.wait("the exec'd sleep running", Duration::from_secs(30), |_| {
        sleeping(&n)
    });
    let _ = held.kill();
    let _ = held.wait();
    n.cp.wait(
        "the exec'd sleep gone with its client",
        Duration::from_secs(30),
        |_| !sleeping(&n),
    );

    // Attach: the running container's output.
    let attached = first_lines(kubectl(&n).args(["attach", "talker"]), 2, |l| {
        l.starts_with("tick ")
    });
    assert_eq!(attached.len(), 2);

    // Port-forward: bytes to the pod's port over the pod network and back.
    let mut pf = kubectl(&n)
        .args(["port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("port-forward");
    let mut line = String::new();
    BufReader::new(pf.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let local: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {line:?}"));
    let mut body = String::new();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", local)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .expect("request");
    conn.read_to_string(&mut body).expect("response");
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(body.contains("hello-through-the-node"), "{body}");
    finish(&n).await;
}

/// The pod cgroup's CPU time (ns), from the v1 cpuacct hierarchy or cgroup v2.
fn pod_cpu_ns(cgroup_root: &str, uid: &str) -> u64 {
    let name = format!("pod{uid}");
    for base in [
        format!("/sys/fs/cgroup/cpu,cpuacct{cgroup_root}"),
        format!("/sys/fs/cgroup/cpuacct{cgroup_root}"),
        format!("/sys/fs/cgroup{cgroup_root}"),
    ] {
        for qos in ["", "besteffort", "burstable"] {
            let dir = std::path::Path::new(&base).join(qos).join(&name);
            if let Ok(v) = std::fs::read_to_string(dir.join("cpuacct.usage")) {
                return v.trim().parse().expect("cpuacct.usage");
            }
            if let Ok(v) = std::fs::read_to_string(dir.join("cpu.stat")) {
                let usec: u64 = v
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("usage_usec");
                return usec * 1000;
            }
        }
    }
    panic!("no cgroup {name} under {cgroup_root}");
}

/// curl to the node server: (HTTP status, body).
fn curl(port: u16, path: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test]
async fn stats_match_the_cgroups_and_the_node_server_refuses_who_it_must() {
    let n = node();
    create(&n, "talker", TALKER, "  hostNetwork: true\n");
    n.wait_pod("Running", "talker", "{.status.phase}", "Running");
    let uid = n.pod_path("talker", "{.metadata.uid}");
    let port: u16 = n
        .node_path("{.status.daemonEndpoints.kubeletEndpoint.Port}")
        .parse()
        .expect("the Node names the node server's port");

    // The Summary API through the API server's node proxy.
    let cgroup_root = n.agent.cgroup_root();
    let before = pod_cpu_ns(&cgroup_root, &uid);
    let raw = n.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/stats/summary", n.node),
    ]);
    let after = pod_cpu_ns(&cgroup_root, &uid);
    let summary: serde_json::Value = serde_json::from_str(&raw).expect("summary JSON");
    assert_eq!(summary["node"]["nodeName"], n.node.as_str());
    let node = &summary["node"];
    for (what, v) in [
        ("node memory", &node["memory"]["workingSetBytes"]),
        ("node cpu", &node["cpu"]["usageCoreNanoSeconds"]),
        ("node fs", &node["fs"]["capacityBytes"]),
        ("image fs", &node["runtime"]["imageFs"]["capacityBytes"]),
        ("pid limit", &node["rlimit"]["maxpid"]),
    ] {
        assert!(v.as_u64().is_some_and(|v| v > 0), "{what}: {node}");
    }
    let pod = summary["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["uid"] == uid.as_str()))
        .unwrap_or_else(|| panic!("talker missing: {raw}"));
    assert_eq!(pod["podRef"]["name"], "talker");
    let cpu = pod["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .expect("pod cpu");
    assert!(
        before <= cpu && cpu <= after,
        "pod CPU {cpu} outside the cgroup's {before}..{after}"
    );
    let main = pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "main"))
        .unwrap_or_else(|| panic!("container main missing: {pod}"));
    assert!(
        main["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{main}"
    );
    assert!(
        main["logs"]["usedBytes"].as_u64().is_some_and(|v| v > 0),
        "{main}"
    );
    assert!(
        pod["ephemeral-storage"]["usedBytes"].as_u64().is_some(),
        "{pod}"
    );
    assert!(
        pod["process_stats"]["process_count"]
            .as_u64()
            .is_some_and(|v| v >= 1),
        "{pod}"
    );

    let metrics = n.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/metrics/resource", n.node),
    ]);
    let series = format!(
        "container_memory_working_set_bytes{{container=\"main\",namespace=\"{}\",pod=\"talker\"}} ",
        n.ns
    );
    assert!(metrics.lines().any(|l| l.starts_with(&series)), "{metrics}");
    let health = n.cp.kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{}/proxy/healthz", n.node),
    ]);
    assert_eq!(health, "ok");

    // No credentials, or a certificate from another CA: 401.
    assert_eq!(curl(port, "/pods", &[]).0, 401);
    let other = TempDir::new("otherca");
    let status = Command::new("openssl")
        .current_dir(other.path())
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "o.key",
            "-out",
            "o.crt",
            "-days",
            "1",
            "-subj",
            "/O=system:masters/CN=intruder",
        ])
        .output()
        .expect("openssl");
    assert!(status.status.success());
    let (code, body) = curl(
        port,
        "/pods",
        &[
            "--cert",
            &other.path().join("o.crt").display().to_string(),
            "--key",
            &other.path().join("o.key").display().to_string(),
        ],
    );
    assert_eq!(code, 401, "{body}");

    // A token the API server vouches for, without nodes/proxy: 403 naming what was refused;
    // with the kubelet API role: served.
    let viewer = service_account_token(&n.cp, "viewer", "view");
    let (code, body) = curl(
        port,
        "/pods",
        &["-H", &format!("Authorization: Bearer {viewer}")],
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("user=system:serviceaccount:kube-system:viewer")
            && body.contains("subresource=proxy"),
        "{body}"
    );
    let admin = service_account_token(&n.cp, "nodeadmin", "system:kubelet-api-admin");
    let bearer = format!("Authorization: Bearer {admin}");
    let (code, body) = curl(port, "/pods", &["-H", &bearer]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"talker\""), "{body}");
    let (code, body) = curl(port, "/stats/summary", &["-H", &bearer]);
    assert_eq!(code, 200, "{body}");
    let (code, _) = curl(port, "/pods", &["-H", "Authorization: Bearer not-a-token"]);
    assert_eq!(code, 401);

    // Unknown pod or container: 404 naming it.
    let (code, body) = curl(
        port,
        &format!("/containerLogs/{}/nope/main", n.ns),
        &["-H", &bearer],
    );
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nope"), "{body}");
    let (code, body) = curl(
        port,
        &format!("/containerLogs/{}/talker/other", n.ns),
        &["-H", &bearer],
    );
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("container \"other\""), "{body}");
    finish(&n).await;
}

/// With `rotate_server_certificates`, the node asks the cluster for its serving certificate:
/// the API server (which verifies nodes' certificates) refuses the self-made one, and reaches
/// the node once an operator approves the node's `kubelet-serving` CSR.
#[tokio::test]
async fn a_serving_certificate_from_the_cluster_is_served_once_approved() {
    let n = AgentNode::start_with(
        "rotate_server_certificates = true",
        &verifying(),
        |cp, _| {
            (
                cp.node_kubeconfig(),
                vec!["--client-ca-file".into(), cp.ca().display().to_string()],
            )
        },
    );
    let healthz = format!("/api/v1/nodes/{}/proxy/healthz", n.node);
    let (ok, _, err) = n.cp.kubectl(&["get", "--raw", &healthz]);
    assert!(!ok, "the self-made certificate was accepted");
    assert!(err.contains("x509") || err.contains("certificate"), "{err}");
    let mut csr = String::new();
    n.cp.wait("the node's serving CSR", Duration::from_secs(60), |cp| {
        let list: serde_json::Value =
            serde_json::from_str(&cp.kubectl_ok(&["get", "csr", "-o", "json"])).unwrap_or_default();
        csr = list["items"]
            .as_array()
            .and_then(|items| {
                items.iter().find(|c| {
                    c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
                        && c["spec"]["username"] == n.user().as_str()
                })
            })
            .and_then(|c| c["metadata"]["name"].as_str())
            .unwrap_or("")
            .to_string();
        !csr.is_empty()
    });
    n.cp.kubectl_ok(&["certificate", "approve", &csr]);
    n.cp.wait(
        "the API server reaching the node with the signed certificate",
        Duration::from_secs(60),
        |cp| cp.kubectl(&["get", "--raw", &healthz]).1 == "ok",
    );
    let logs = n.agent.daemon.log();
    assert!(
        logs.contains("now serving the certificate the cluster signed"),
        "{}",
        agent_support::important_lines(&logs)
    );
    finish(&n).await;
}
