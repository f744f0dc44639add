//! The agent's read-only HTTP endpoint: `/healthz`, `/pods`, `/pods/<namespace>/<name>`,
//! `/node`, `/node/reports`, `/gc` (garbage collection counters), `/manifests` (per-file
//! manifest errors and warnings), `/configz` (the effective agent configuration) and `/metrics`
//! (Prometheus), on TCP for anyone who reaches its address (only when `agent.address` is set:
//! off by default, as the kubelet's read-only port); the same routes and `POST /node/shutdown`
//! (a graceful node shutdown, answered with its report when every pod has ended) on the
//! control socket, which only root and the CRI socket's group may use.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

use crate::agent::AgentContext;
use crate::agent::node::status::NodeStatus;
use crate::agent::shutdown::{ShutdownError, ShutdownManager};

/// What the endpoint serves from.
pub struct Endpoint {
    /// The agent.
    pub ctx: Arc<AgentContext>,
    /// The node status loop.
    pub node: Arc<NodeStatus>,
    /// Graceful node shutdown.
    pub shutdown: Arc<ShutdownManager>,
    /// The agent's Prometheus metrics.
    pub metrics: prometheus_client::registry::Registry,
    /// The control socket (named in the TCP endpoint's refusals).
    pub control_socket: std::path::PathBuf,
}

/// Serves the read-only endpoint on `listener` (TCP) forever.
pub async fn serve(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, endpoint.clone(), Access::ReadOnly),
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Serves the control socket (unix, mode 0660): the read-only routes and `POST /node/shutdown`.
pub async fn serve_control(listener: tokio::net::UnixListener, endpoint: Arc<Endpoint>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, endpoint.clone(), Access::Control),
            Err(e) => accept_failed(e).await,
        }
    }
}

/// What a connection may do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Reads only: the TCP endpoint, reachable by any local user.
    ReadOnly,
    /// Reads and node actions: the control socket, reachable by root and the socket group.
    Control,
}

async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "agent endpoint: accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn spawn_connection<S>(stream: S, endpoint: Arc<Endpoint>, access: Access)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let endpoint = endpoint.clone();
            async move {
                if req.method() == Method::POST
                    && req.uri().path().trim_end_matches('/') == "/node/shutdown"
                {
                    return Ok::<_, Infallible>(match access {
                        Access::Control => shutdown(&endpoint).await,
                        Access::ReadOnly => error(
                            StatusCode::FORBIDDEN,
                            "Forbidden",
                            format!(
                                "the agent's TCP endpoint is read-only; node shutdown is accepted on its control socket {}",
                                endpoint.control_socket.display()
                            ),
                        ),
                    });
                }
                if req.uri().path() == "/metrics" {
                    return Ok(crate::metrics::endpoint::respond(
                        &endpoint.metrics,
                        req.method(),
                        "/metrics",
                    ));
                }
                Ok(route(&req, &endpoint.ctx, &endpoint.node))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(std::time::Duration::from_secs(10))
            .serve_connection(TokioIo::new(stream), service);
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "agent endpoint: connection ended");
        }
    });
}

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A v1 Status for errors.
fn error(status: StatusCode, reason: &str, message: String) -> Response<Full<Bytes>> {
    json(
        status,
        &serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": status.as_u16(),
        }),
    )
}

/// `POST /node/shutdown`: runs the graceful node shutdown and answers with its report.
async fn shutdown(endpoint: &Endpoint) -> Response<Full<Bytes>> {
    // Its own task: a client that hangs up must not cancel a shutdown half-way through.
    let manager = endpoint.shutdown.clone();
    let outcome = match tokio::spawn(async move { manager.shutdown().await }).await {
        Ok(outcome) => outcome,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("node shutdown task failed: {e}"),
            );
        }
    };
    match outcome {
        Ok(report) => json(StatusCode::OK, &report),
        Err(e @ ShutdownError::Disabled) => {
            error(StatusCode::PRECONDITION_FAILED, "Disabled", e.to_string())
        }
        Err(e @ ShutdownError::InProgress) => {
            error(StatusCode::CONFLICT, "InProgress", e.to_string())
        }
    }
}

fn route(req: &Request<Incoming>, ctx: &AgentContext, node: &NodeStatus) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the agent endpoint is read-only (POST /node/shutdown goes to its control socket)"
                .into(),
        );
    }
    let path = req.uri().path().trim_end_matches('/');
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["healthz"] => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"ok")));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain"),
            );
            r
        }
        ["pods"] => {
            let list = k8s_openapi::List::<Pod> {
                items: ctx.pods.list(),
                metadata: Default::default(),
            };
            json(StatusCode::OK, &list)
        }
        ["pods", ns, name] => match ctx.pods.get(&(ns.to_string(), name.to_string())) {
            Some(p) => json(StatusCode::OK, &p),
            None => error(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("pods \"{name}\" not found in namespace \"{ns}\""),
            ),
        },
        ["node"] => match node.current() {
            Some(n) => json(StatusCode::OK, &n),
            None => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "node status not computed yet".into(),
            ),
        },
        ["node", "reports"] => json(StatusCode::OK, &node.counters()),
        ["gc"] => json(StatusCode::OK, &crate::agent::gc::counters(&ctx.gc)),
        ["configz"] => json(
            StatusCode::OK,
            &serde_json::json!({ "agent": &*ctx.config }),
        ),
        ["manifests"] => {
            let errors: std::collections::BTreeMap<String, String> = ctx
                .pods
                .errors()
                .into_iter()
                .map(|(k, v)| (k.display().to_string(), v))
                .collect();
            let warnings: std::collections::BTreeMap<String, String> = ctx
                .pods
                .warnings()
                .into_iter()
                .map(|(k, v)| (k.display().to_string(), v))
                .collect();
            json(
                StatusCode::OK,
                &serde_json::json!({ "errors": errors, "warnings": warnings }),
            )
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no such path {path:?}"),
        ),
    }
}
