//! The HTTP endpoint that serves a Prometheus registry: `GET /metrics` in the OpenMetrics text
//! format (what Prometheus asks for first), anything else 404.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The answer to one request.
pub fn respond(registry: &Registry, method: &hyper::Method, path: &str) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &str| {
        let mut r = Response::new(Full::new(Bytes::from(text.to_string())));
        *r.status_mut() = status;
        r
    };
    if path != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, registry) {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding the metrics: {e}\n"),
        );
    }
    let mut r = Response::new(Full::new(Bytes::from(text)));
    if let Ok(v) = http::HeaderValue::from_str(CONTENT_TYPE) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// Binds `address` and serves `registry` there until the process ends; returns the bound
/// address (port 0 picks one).
pub async fn serve(address: &str, registry: Registry) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the metrics endpoint {address}: {e}"),
        )
    })?;
    let bound = listener.local_addr()?;
    let registry = Arc::new(registry);
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let registry = registry.clone();
                        async move {
                            Ok::<_, Infallible>(respond(&registry, req.method(), req.uri().path()))
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(error = %e, "metrics endpoint connection");
                }
            });
        }
    });
    tracing::info!(address = %bound, "serving Prometheus metrics at /metrics");
    Ok(bound)
}
