//! The agent's read-only HTTP endpoint: `/healthz`, `/pods`, `/pods/<namespace>/<name>`,
//! `/node`, `/node/reports`, `/manifests` (per-file manifest errors) and `/configz` (the
//! effective agent configuration).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

use super::AgentContext;
use super::config::AgentConfig;
use super::node::NodeStatus;

/// Serves the endpoint on `listener` forever.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctx: Arc<AgentContext>,
    node: Arc<NodeStatus>,
    config: Arc<AgentConfig>,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "agent endpoint: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let ctx = ctx.clone();
        let node = node.clone();
        let config = config.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                let node = node.clone();
                let config = config.clone();
                async move { Ok::<_, Infallible>(route(&req, &ctx, &node, &config)) }
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

fn route(
    req: &Request<Incoming>,
    ctx: &AgentContext,
    node: &NodeStatus,
    config: &AgentConfig,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the agent endpoint is read-only".into(),
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
        ["configz"] => json(StatusCode::OK, &serde_json::json!({ "agent": config })),
        ["manifests"] => {
            let errors: std::collections::BTreeMap<String, String> = ctx
                .pods
                .errors()
                .into_iter()
                .map(|(k, v)| (k.display().to_string(), v))
                .collect();
            json(StatusCode::OK, &serde_json::json!({ "errors": errors }))
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no such path {path:?}"),
        ),
    }
}
