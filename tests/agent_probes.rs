//! The agent's probes: gRPC, HTTP(S) and TCP against servers run by the test itself
//! (host-network pods are probed on 127.0.0.1), and the startup probe's gate.

mod agent_support;
mod common;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use agent_support::*;
use berth::agent::probes::grpc::{
    CHECK_PATH, HealthCheckRequest, HealthCheckResponse, ServingStatus,
};
use common::{TempDir, tail};

/// Our own `grpc.health.v1.Health` service: Check answers each service's current status
/// (NOT_FOUND for a service it does not know).
#[derive(Clone, Default)]
struct Health {
    statuses: Arc<Mutex<HashMap<String, i32>>>,
}

impl Health {
    fn set(&self, service: &str, status: ServingStatus) {
        self.statuses
            .lock()
            .expect("lock")
            .insert(service.to_string(), status as i32);
    }

    fn status_of(&self, service: &str) -> Result<i32, tonic::Status> {
        self.statuses
            .lock()
            .expect("lock")
            .get(service)
            .copied()
            .ok_or_else(|| tonic::Status::not_found(format!("unknown service {service:?}")))
    }
}

impl tonic::server::NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Health {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let health = self.clone();
        Box::pin(async move {
            if req.uri().path() != CHECK_PATH {
                return Ok(tonic::Status::unimplemented("only Check").into_http());
            }
            let check = tower::service_fn(move |r: tonic::Request<HealthCheckRequest>| {
                let answer = health
                    .status_of(&r.get_ref().service)
                    .map(|status| tonic::Response::new(HealthCheckResponse { status }));
                std::future::ready(answer)
            });
            let codec =
                tonic_prost::ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(check, req).await)
        })
    }
}

/// Serves `health` on 127.0.0.1; returns the port.
async fn serve_health(health: Health) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_probes_follow_the_health_service() {
    let health = Health::default();
    health.set("", ServingStatus::Serving);
    health.set("ready", ServingStatus::Serving);
    let port = serve_health(health.clone()).await;
    let a = Agent::start();
    let probes = format!(
        "    livenessProbe:\n      grpc:\n        port: {port}\n      periodSeconds: 1\n      failureThreshold: 2\n    readinessProbe:\n      grpc:\n        port: {port}\n        service: ready\n      periodSeconds: 1\n      failureThreshold: 1\n"
    );
    a.write("grpc.yaml", &pod_yaml("grpc", "sleep 3600", "", &probes));
    a.wait_pod("default", "grpc", "ready through gRPC", |p| {
        running(p, "main")
            && container(p, "main")["ready"] == true
            && condition(p, "Ready") == "True"
    });

    health.set("ready", ServingStatus::NotServing);
    let p = a.wait_pod("default", "grpc", "not ready on NOT_SERVING", |p| {
        container(p, "main")["ready"] == false && condition(p, "Ready") == "False"
    });
    assert_eq!(restarts(&p, "main"), 0, "readiness never restarts");
    assert!(
        a.daemon
            .log()
            .contains("service unhealthy (responded with \"NOT_SERVING\")"),
        "the failure is logged with the kubelet's message"
    );

    health.set("ready", ServingStatus::Serving);
    a.wait_pod("default", "grpc", "ready again", |p| {
        container(p, "main")["ready"] == true
    });
    health.set("", ServingStatus::NotServing);
    a.wait_pod("default", "grpc", "a liveness restart", |p| {
        restarts(p, "main") >= 1
    });
    health.set("", ServingStatus::Serving);
    let p = a.wait_pod(
        "default",
        "grpc",
        "running and ready after the restart",
        |p| running(p, "main") && container(p, "main")["ready"] == true,
    );
    let restarted = restarts(&p, "main");
    // Healthy again: no further restarts.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let p = a.pod("default", "grpc").expect("pod");
    assert_eq!(restarts(&p, "main"), restarted, "{p}");
    a.finish().await;
}

/// A self-signed certificate and key made by the openssl CLI: (cert PEM path, key PEM path).
fn self_signed(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args([
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=probe.invalid",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}

/// An HTTP or HTTPS server for probes: a path with a route answers its (status, Location),
/// any other the current `code`; each request head is kept.
struct ProbeServer {
    port: u16,
    code: Arc<AtomicU16>,
    routes: Arc<Mutex<HashMap<String, (u16, String)>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl ProbeServer {
    /// `path` answers `status` with `Location: location`.
    fn route(&self, path: &str, status: u16, location: &str) {
        self.routes
            .lock()
            .expect("lock")
            .insert(path.to_string(), (status, location.to_string()));
    }

    fn saw(&self, request_line: &str) -> bool {
        let requests = self.requests.lock().expect("lock");
        requests.iter().any(|r| r.starts_with(request_line))
    }
}

/// TLS with a fresh self-signed certificate (made in `dir`).
fn tls_acceptor(dir: &TempDir) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let (cert, key) = self_signed(dir);
    let certs = vec![CertificateDer::from_pem_file(&cert).expect("cert")];
    let key = PrivateKeyDer::from_pem_file(&key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// Serves probes on 127.0.0.1, over TLS when `tls` is given.
async fn serve_probes(tls: Option<tokio_rustls::TlsAcceptor>) -> ProbeServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = ProbeServer {
        port: listener.local_addr().expect("addr").port(),
        code: Arc::new(AtomicU16::new(200)),
        routes: Default::default(),
        requests: Default::default(),
    };
    let (code, routes, requests) = (
        server.code.clone(),
        server.routes.clone(),
        server.requests.clone(),
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (tls, code, routes, requests) =
                (tls.clone(), code.clone(), routes.clone(), requests.clone());
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            answer(s, &code, &routes, &requests).await;
                        }
                    }
                    None => answer(tcp, &code, &routes, &requests).await,
                }
            });
        }
    });
    server
}

/// Reads one request head from `s`, keeps it and answers it.
async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    code: &AtomicU16,
    routes: &Mutex<HashMap<String, (u16, String)>>,
    requests: &Mutex<Vec<String>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut head = Vec::new();
    let mut chunk = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    requests.lock().expect("lock").push(head);
    let route = routes.lock().expect("lock").get(&path).cloned();
    let answer = match route {
        Some((status, location)) => format!(
            "HTTP/1.1 {status} X\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        None => format!(
            "HTTP/1.1 {} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            code.load(Ordering::SeqCst)
        ),
    };
    let _ = s.write_all(answer.as_bytes()).await;
    let _ = s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_readiness_skips_certificate_checks_and_follows_the_status() {
    let certs = TempDir::new("probe-tls");
    let server = serve_probes(Some(tls_acceptor(&certs))).await;
    let a = Agent::start();
    let port = server.port;
    let probe = format!(
        "    readinessProbe:\n      httpGet:\n        scheme: HTTPS\n        path: /healthz\n        port: {port}\n        httpHeaders:\n        - name: X-Probe\n          value: berth\n      periodSeconds: 1\n      failureThreshold: 1\n"
    );
    a.write("tls.yaml", &pod_yaml("tls", "sleep 3600", "", &probe));
    a.wait_pod("default", "tls", "ready through HTTPS", |p| {
        running(p, "main")
            && container(p, "main")["ready"] == true
            && condition(p, "Ready") == "True"
    });
    let first = server.requests.lock().expect("lock").first().cloned();
    let first = first.expect("a request reached the server");
    assert!(first.starts_with("GET /healthz HTTP/1.1\r\n"), "{first}");
    assert!(
        first.contains(&format!("Host: 127.0.0.1:{port}\r\n")),
        "{first}"
    );
    assert!(first.contains("X-Probe: berth\r\n"), "{first}");

    server.code.store(500, Ordering::SeqCst);
    let p = a.wait_pod("default", "tls", "not ready on 500", |p| {
        container(p, "main")["ready"] == false && condition(p, "Ready") == "False"
    });
    assert_eq!(restarts(&p, "main"), 0);
    assert!(
        a.daemon
            .log()
            .contains("HTTP probe failed with statuscode: 500"),
        "the failure is logged with the status code"
    );
    server.code.store(302, Ordering::SeqCst);
    a.wait_pod("default", "tls", "ready again on a redirect status", |p| {
        container(p, "main")["ready"] == true
    });
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_probes_follow_redirects_on_the_same_host_only() {
    let server = serve_probes(None).await;
    server.route("/start", 302, "/healthz");
    let a = Agent::start();
    let port = server.port;
    let probe = format!(
        "    readinessProbe:\n      httpGet:\n        path: /start\n        port: {port}\n      periodSeconds: 1\n      failureThreshold: 1\n"
    );
    a.write(
        "redirect.yaml",
        &pod_yaml("redirect", "sleep 3600", "", &probe),
    );
    a.wait_pod("default", "redirect", "ready through a redirect", |p| {
        container(p, "main")["ready"] == true
    });
    assert!(
        server.saw("GET /healthz HTTP/1.1"),
        "the redirect was followed"
    );

    // The redirect's target decides: a 500 there is a failure, not the 302's success.
    server.code.store(500, Ordering::SeqCst);
    a.wait_pod("default", "redirect", "not ready: the target fails", |p| {
        container(p, "main")["ready"] == false
    });

    // A redirect to another host is not followed and counts as success, as in the kubelet.
    server.route("/start", 302, "http://probe-elsewhere.invalid/healthz");
    a.wait_pod(
        "default",
        "redirect",
        "ready: another host ends the probe",
        |p| container(p, "main")["ready"] == true,
    );

    // A loop ends after 10 redirects, as a failure.
    server.route("/start", 307, "/start");
    a.wait_pod("default", "redirect", "not ready: redirect loop", |p| {
        container(p, "main")["ready"] == false
    });
    assert!(
        a.daemon.log().contains("stopped after 10 redirects"),
        "the loop is named in the log"
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_probe_gates_liveness_and_readiness_and_restarts_when_it_fails() {
    let a = Agent::start();
    // Liveness always fails, but only counts once the startup probe has passed.
    let gated = "    startupProbe:\n      exec:\n        command: [\"cat\", \"/tmp/started\"]\n      periodSeconds: 1\n      failureThreshold: 60\n    livenessProbe:\n      exec:\n        command: [\"false\"]\n      periodSeconds: 1\n      failureThreshold: 1\n    readinessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 1\n";
    a.write("gated.yaml", &pod_yaml("gated", "sleep 3600", "", gated));
    // A startup probe that never passes restarts its container after failureThreshold.
    let never = "    startupProbe:\n      exec:\n        command: [\"false\"]\n      periodSeconds: 1\n      failureThreshold: 2\n";
    a.write("never.yaml", &pod_yaml("never", "sleep 3600", "", never));

    let p = a.wait_pod("default", "gated", "gated running", |p| running(p, "main"));
    // Three periods of failing liveness and passing readiness change nothing while the
    // startup probe has not passed.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let p2 = a.pod("default", "gated").expect("gated");
    assert_eq!(restarts(&p2, "main"), 0, "{p2}");
    assert_eq!(container(&p2, "main")["started"], false, "{p2}");
    assert_eq!(container(&p2, "main")["ready"], false, "{p2}");

    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    common::exec_ok(&c, &id, &["touch", "/tmp/started"]).await;
    // Started: liveness now counts, fails and restarts the container (whose fresh /tmp has no
    // /tmp/started, so the new instance is gated again).
    a.wait_pod("default", "gated", "restarted by liveness", |p| {
        restarts(p, "main") >= 1
    });
    assert!(
        a.daemon
            .log()
            .contains("container failed liveness probe, will be restarted"),
        "{}",
        tail(&a.daemon.log(), 20)
    );

    a.wait_pod("default", "never", "restarted by its startup probe", |p| {
        restarts(p, "main") >= 1
    });
    assert!(
        a.daemon
            .log()
            .contains("container failed startup probe, will be restarted")
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_liveness_restarts_the_container_when_the_port_closes() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let a = Agent::start();
    let probe = format!(
        "    livenessProbe:\n      tcpSocket:\n        port: {port}\n      periodSeconds: 1\n      failureThreshold: 2\n"
    );
    a.write("tcp.yaml", &pod_yaml("tcp", "sleep 3600", "", &probe));
    a.wait_pod("default", "tcp", "tcp running", |p| running(p, "main"));
    // The port answers: three periods without a restart.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let p = a.pod("default", "tcp").expect("tcp");
    assert_eq!(restarts(&p, "main"), 0, "{p}");

    drop(listener);
    a.wait_pod("default", "tcp", "restarted once the port closed", |p| {
        restarts(p, "main") >= 1
    });
    let log = a.daemon.log();
    assert!(
        log.contains(&format!("dial tcp 127.0.0.1:{port}: ")),
        "the refused dial is named: {}",
        tail(&log, 20)
    );
    a.finish().await;
}
