//! `berthctl exec` and `attach` against real containers through berthd's streaming server:
//! stdout and stderr apart, stdin with `-i`, a terminal with `-it` (berthctl itself on a pty made
//! by `script`), and the command's exit code as berthctl's; `berthctl events` following the
//! runtime's container events.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::*;
use k8s_cri::v1 as cri;

fn berthctl(d: &Daemon) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berthctl"));
    cmd.arg("-r").arg(d.socket());
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_passes_output_stdin_a_terminal_and_the_exit_code() {
    let d = Daemon::start();
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("exec", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    let ct = run_container(
        &c,
        &pod,
        &cfg,
        sh_container(
            "main",
            &image("busybox"),
            "exec sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;

    // Output on its own streams, the exit code passed through.
    let out = berthctl(&d)
        .args(["exec", &ct, "sh", "-c", "echo out; echo err >&2; exit 3"])
        .output()
        .expect("berthctl exec");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    // stdin with -i, ended by EOF.
    let mut child = berthctl(&d)
        .args(["exec", "-i", &ct, "sh", "-c", "tr a-z A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("berthctl exec -i");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"hello from stdin\n")
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO FROM STDIN\n");

    // -it from a terminal: berthctl runs on a pty (script), the command sees a terminal.
    let inner = format!(
        "{} -r {} exec -it {ct} sh -c 'test -t 0 && echo on-a-terminal; exit 5'",
        env!("CARGO_BIN_EXE_berthctl"),
        d.socket().display()
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("on-a-terminal"), "{text:?}");
    assert_eq!(out.status.code(), Some(5), "{out:?}");

    // A container that does not exist: a clear error, not a hang.
    let out = berthctl(&d)
        .args(["exec", "no-such-container", "true"])
        .output()
        .expect("berthctl exec");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-container"),
        "{out:?}"
    );
    remove_pod(&c, &pod).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_feeds_a_containers_stdin_and_events_follow_its_life() {
    let d = Daemon::start();
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let mut events = berthctl(&d)
        .args(["-o", "json", "events"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("berthctl events");
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("attach", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    let mut config = sh_container(
        "upper",
        &image("busybox"),
        "tr a-z A-Z",
        cri::NamespaceMode::Container,
    );
    config.stdin = true;
    config.stdin_once = true;
    let ct = run_container(&c, &pod, &cfg, config).await;
    let mut child = berthctl(&d)
        .args(["attach", "-i", &ct])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("berthctl attach");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"attached\n")
        .expect("write stdin");
    // stdin ends (stdin_once): the container's input closes, tr ends, and so does the session.
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ATTACHED\n");
    let status = wait_exited(&c, &ct).await;
    assert_eq!(status.exit_code, 0);
    remove_pod(&c, &pod).await;

    // The container's life as events, in order.
    let stdout = events.stdout.take().expect("events stdout");
    let kinds = tokio::task::spawn_blocking(move || {
        use std::io::BufRead as _;
        let mut kinds = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(&line.expect("line")).expect("json");
            if v["container_id"] == ct.as_str() {
                let kind = v["type"].as_str().unwrap_or_default().to_string();
                let done = kind == "CONTAINER_DELETED_EVENT";
                kinds.push(kind);
                if done {
                    break;
                }
            }
        }
        kinds
    });
    let kinds = tokio::time::timeout(std::time::Duration::from_secs(30), kinds)
        .await
        .expect("events in time")
        .expect("reader");
    let _ = events.kill();
    let _ = events.wait();
    assert_eq!(
        kinds,
        [
            "CONTAINER_CREATED_EVENT",
            "CONTAINER_STARTED_EVENT",
            "CONTAINER_STOPPED_EVENT",
            "CONTAINER_DELETED_EVENT"
        ]
    );
}

/// One HTTP GET of `path` over `port` on loopback; the whole response.
fn http_get(port: u16, path: &str) -> String {
    use std::io::Read as _;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n").expect("request");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_reaches_a_server_in_the_pods_network() {
    use std::io::BufRead as _;
    let d = Daemon::start();
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("forward", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    run_container(
        &c,
        &pod,
        &cfg,
        sh_container(
            "web",
            &image("busybox"),
            "echo forwarded > /tmp/page; exec httpd -f -p 8080 -h /tmp",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    let mut pf = berthctl(&d)
        .args(["port-forward", &pod, ":8080", ":9999"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berthctl port-forward");
    let mut lines = std::io::BufReader::new(pf.stdout.take().expect("stdout")).lines();
    let mut local = |remote: &str| -> u16 {
        let line = lines.next().expect("a line").expect("read");
        assert!(line.ends_with(&format!("-> {remote}")), "{line}");
        line.split(' ')
            .nth(2)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a local port in {line:?}"))
    };
    let (web, nothing) = (local("8080"), local("9999"));
    // Two connections, each its own session; httpd may still be starting for the first.
    let mut first = String::new();
    for _ in 0..50 {
        first = http_get(web, "/page");
        if first.contains("forwarded") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        first.starts_with("HTTP/1.") && first.contains("forwarded"),
        "{first:?}"
    );
    assert!(http_get(web, "/page").contains("forwarded"));
    // Nothing listens on 9999 in the pod: the connection ends, and berthctl says why (its
    // message may follow the connection's end by a moment).
    let stderr = pf.stderr.take().expect("stderr");
    let (said, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if said.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(http_get(nothing, "/"), "");
    let mut err = String::new();
    while let Ok(line) = heard.recv_timeout(std::time::Duration::from_secs(10)) {
        err.push_str(&line);
        err.push('\n');
        if line.contains("9999") {
            break;
        }
    }
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(err.contains("9999"), "{err}");
    remove_pod(&c, &pod).await;
}
