//! Port-forward into a pod's network namespace through Berth's streaming server.

mod common;
mod stream_client;

use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use stream_client::{Spdy, Ws};

const T: Duration = Duration::from_secs(20);

/// httpd on 8080 and an echo server (nc -e cat) on 9000, inside the pod's network namespace.
const SERVERS: &str = "mkdir -p /www && echo hello-from-the-pod > /www/index.html && \
                       httpd -p 8080 -h /www && exec nc -ll -p 9000 -e cat";

async fn pod_with_servers(d: &Daemon) -> (berth::client::CriClient, String) {
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let pod_cfg = pod_config("pf", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &pod_cfg).await;
    let cfg = sh_container("servers", &busybox, SERVERS, cri::NamespaceMode::Container);
    let id = run_container(&c, &pod, &pod_cfg, cfg).await;
    // Both listeners up.
    for _ in 0..100 {
        let out = exec(&c, &id, &["netstat", "-ltn"], 5)
            .await
            .expect("netstat");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains(":8080") && text.contains(":9000") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (c, pod)
}

async fn forward_url(c: &berth::client::CriClient, pod: &str, ports: Vec<i32>) -> String {
    c.runtime()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.into(),
            port: ports,
        })
        .await
        .expect("PortForward")
        .into_inner()
        .url
}

#[tokio::test]
async fn spdy_port_forward_several_streams_and_errors() {
    let d = Daemon::start();
    let (c, pod) = pod_with_servers(&d).await;
    let url = forward_url(&c, &pod, vec![8080, 9000]).await;
    assert!(url.contains("/portforward/"), "{url}");
    let (mut s, proto) = Spdy::connect(&url, &["portforward.k8s.io"]).await;
    assert_eq!(proto, "portforward.k8s.io");

    // Two requests at once: the echo server and HTTP.
    let e1 = s
        .open(&[
            ("streamType", "error"),
            ("port", "9000"),
            ("requestID", "1"),
        ])
        .await;
    s.send(e1, b"", true).await;
    let d1 = s
        .open(&[("streamType", "data"), ("port", "9000"), ("requestID", "1")])
        .await;
    let e2 = s
        .open(&[
            ("streamType", "error"),
            ("port", "8080"),
            ("requestID", "2"),
        ])
        .await;
    s.send(e2, b"", true).await;
    let d2 = s
        .open(&[("streamType", "data"), ("port", "8080"), ("requestID", "2")])
        .await;
    s.send(d2, b"GET / HTTP/1.0\r\n\r\n", false).await;
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    s.send(d1, &big[..100_000], false).await;
    s.send(d1, &big[100_000..], true).await;
    assert!(
        s.read_until(T, |s| s.fin.contains(&d1)
            && s.fin.contains(&d2)
            && s.fin.contains(&e1)
            && s.fin.contains(&e2))
            .await,
        "both forwards finish: fin {:?} of d1 {d1} d2 {d2} e1 {e1} e2 {e2}; got {:?} bytes on d1, {:?} on d2, resets {:?}",
        s.fin,
        s.data.get(&d1).map(Vec::len),
        s.text(d2),
        s.resets
    );
    assert_eq!(s.data.get(&d1).map(Vec::len), Some(big.len()));
    assert!(s.data.get(&d1) == Some(&big), "echoed bytes differ");
    assert!(s.text(d2).contains("hello-from-the-pod"), "{}", s.text(d2));
    assert_eq!(s.text(e1), "");

    // A port nobody listens on: the error stream says so.
    let e3 = s
        .open(&[
            ("streamType", "error"),
            ("port", "9999"),
            ("requestID", "3"),
        ])
        .await;
    let d3 = s
        .open(&[("streamType", "data"), ("port", "9999"), ("requestID", "3")])
        .await;
    assert!(s.read_until(T, |s| s.fin.contains(&e3)).await);
    assert!(
        s.text(e3).contains("error forwarding port 9999"),
        "{}",
        s.text(e3)
    );
    let _ = d3;

    // The host does not listen on the pod's port: the forward went into the pod's namespace.
    assert!(std::net::TcpStream::connect("127.0.0.1:9000").is_err());
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn websocket_port_forward_channels() {
    let d = Daemon::start();
    let (c, pod) = pod_with_servers(&d).await;
    let url = forward_url(&c, &pod, vec![9000]).await;
    let mut w = Ws::connect(&format!("{url}?port=9000"), &["v4.channel.k8s.io"]).await;
    assert_eq!(w.protocol, "v4.channel.k8s.io");
    w.send_channel(0, b"through websocket").await;
    // The data channel: the port (2 bytes LE) then the echo. Closing our side ends it.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + T;
    while !got.ends_with(b"through websocket") && tokio::time::Instant::now() < deadline {
        let ch = w.read_channels(Duration::from_millis(500)).await;
        if let Some(d) = ch.get(&0) {
            got.extend_from_slice(d);
        }
    }
    assert!(got.starts_with(&9000u16.to_le_bytes()), "{got:?}");
    assert!(got.ends_with(b"through websocket"), "{got:?}");
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn port_forward_to_an_unknown_pod_is_not_found() {
    let d = Daemon::start();
    let c = d.client().await;
    let r = c
        .runtime()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: "nope".into(),
            port: vec![80],
        })
        .await;
    assert_eq!(r.expect_err("unknown").code(), tonic::Code::NotFound);
}
