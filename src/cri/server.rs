//! The unix socket server: one berthd per root (a lock file), stale sockets replaced, mode 0660,
//! gRPC deadlines answered with DeadlineExceeded, and a short grace period on shutdown.
//!
//! tonic's own `transport::Server` answers an expired `grpc-timeout` with `Cancelled`, which
//! the CRI (and critest) read as the wrong error; so Berth serves tonic's routes over hyper
//! itself and enforces the deadline in [`with_deadline`]. Each connection reaches hyper through
//! [`AuthorityFilter`], which drops the socket path that older gRPC clients send as `:authority`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use k8s_cri::v1::image_service_server::ImageServiceServer;
use k8s_cri::v1::runtime_service_server::RuntimeServiceServer;
use k8s_cri::v1alpha2 as a2;
use tonic::service::Routes;
use tower::{Service, ServiceExt};

use super::authority::AuthorityFilter;
use super::v1alpha2::{ImageV1Alpha2, RuntimeV1Alpha2};
use super::{ArchiveApi, ImageApi, RuntimeApi};
use super::{added_calls, encoded_lists};
use crate::archive_api::archives_server::ArchivesServer;

/// Largest CRI message accepted or sent (containerd uses 16 MiB too).
pub(super) const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// How long requests in flight may run after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Takes the root's lock, refusing to run beside another berthd on the same root.
pub fn lock_root(root: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(root)
        .with_context(|| format!("creating root dir {}", root.display()))?;
    let path = root.join("berthd.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening lock file {}", path.display()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another berthd (pid {}) is already running with root {}; stop it first or use another --root",
                pid.trim(),
                root.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("locking {}", path.display())),
    }
    file.set_len(0).ok();
    std::fs::write(&path, std::process::id().to_string()).ok();
    Ok(file)
}

/// Parses a gRPC `grpc-timeout` header value (`<digits><H|M|S|m|u|n>`).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Runs one request through the routes, answering DeadlineExceeded when the caller's
/// `grpc-timeout` runs out first.
async fn with_deadline(
    mut routes: Routes,
    apis: Apis,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<tonic::body::Body>, std::convert::Infallible> {
    let path = req.uri().path().to_string();
    let deadline = req
        .headers()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout);
    let list = encoded_lists::route(&path);
    let added = added_calls::route(&path);
    let span = tracing::debug_span!("cri", method = %path);
    let started = std::time::Instant::now();
    let call = tracing::Instrument::instrument(
        async move {
            if let Some(list) = list {
                return Ok(encoded_lists::serve(list, apis.runtime, req).await);
            }
            if let Some(call) = added {
                return Ok(added_calls::serve(call, apis.runtime, apis.images, req).await);
            }
            let ready = match ServiceExt::<http::Request<hyper::body::Incoming>>::ready(&mut routes)
                .await
            {
                Ok(r) => r,
                Err(never) => match never {},
            };
            ready.call(req).await
        },
        span,
    );
    let answer = match deadline {
        None => call.await,
        Some(d) => match tokio::time::timeout(d, call).await {
            Ok(resp) => resp,
            Err(_) => {
                tracing::debug!(method = %path, timeout = ?d, "deadline exceeded");
                Ok(
                    tonic::Status::deadline_exceeded(format!("{path}: deadline of {d:?} exceeded"))
                        .into_http(),
                )
            }
        },
    };
    if let Ok(resp) = &answer {
        // An error comes in the headers (trailers only); a unary answer is ready by now, and
        // its status, in the trailers, is OK.
        let code = resp
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(tonic::Code::Ok, tonic::Code::from_i32);
        crate::metrics::prometheus::runtime().cri_call(
            &path,
            code,
            started.elapsed().as_secs_f64(),
        );
    }
    answer
}

/// The services answered beside the router: the cached lists and the calls k8s-cri lacks.
#[derive(Clone)]
struct Apis {
    runtime: Arc<RuntimeApi>,
    images: Arc<ImageApi>,
}

/// The CRI services (v1 and v1alpha2) and Berth's archive service as one router.
fn routes(runtime: RuntimeApi, images: ImageApi) -> Routes {
    Routes::new(
        RuntimeServiceServer::new(runtime.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
    .add_service(
        ImageServiceServer::new(images.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
    .add_service(
        a2::runtime_service_server::RuntimeServiceServer::new(RuntimeV1Alpha2(runtime))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
    .add_service(
        ArchivesServer::new(ArchiveApi::new(images.manager()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
    .add_service(
        a2::image_service_server::ImageServiceServer::new(ImageV1Alpha2(images))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
}

/// Binds the socket (replacing a stale one) and serves until `shutdown` resolves.
pub async fn serve(
    lock: std::fs::File,
    socket: &Path,
    socket_gid: Option<u32>,
    runtime: RuntimeApi,
    images: ImageApi,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating socket dir {}", dir.display()))?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => tracing::info!(socket = %socket.display(), "replaced stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", socket.display()));
        }
    }
    let listener = crate::socket_access::bind(socket, socket_gid)
        .with_context(|| format!("binding CRI socket {}", socket.display()))?;
    tracing::info!(socket = %socket.display(), "serving CRI v1 and v1alpha2");
    // The socket accepts connections from here on: a `Type=notify` unit is started.
    crate::sd_notify::notify("READY=1");

    let apis = Apis {
        runtime: Arc::new(runtime.clone()),
        images: Arc::new(images.clone()),
    };
    let routes = routes(runtime, images);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(1000);
    let builder = builder.http2_only();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a CRI connection");
                        // An error that lasts (out of descriptors) must not spin a core.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (routes, apis) = (routes.clone(), apis.clone());
                let svc = tower::service_fn(move |req| {
                    with_deadline(routes.clone(), apis.clone(), req)
                });
                let conn = builder
                    .serve_connection(
                        TokioIo::new(AuthorityFilter::new(stream)),
                        TowerToHyperService::new(svc),
                    )
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "CRI connection ended");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(socket);
    // Clients such as the kubelet keep connections open forever: requests in flight get a
    // short grace period, then the server stops regardless.
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("grace period over: closing remaining connections");
    }
    drop(lock);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("1m"), Some(Duration::from_millis(1)));
        assert_eq!(parse_grpc_timeout("120S"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("500u"), Some(Duration::from_micros(500)));
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("1234567890S"), None);
    }
}
