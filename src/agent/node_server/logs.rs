//! `/containerLogs/<namespace>/<pod>/<container>`: a container's log with the kubelet's options
//! (follow, tailLines, sinceSeconds, sinceTime, timestamps, limitBytes, previous), read from its
//! CRI log file and streamed as it is read.

use std::collections::HashMap;
use std::io::{self, Write};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;
use k8s_cri::v1 as cri;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::streaming::form_pairs;

/// Time between a log response's last data and its end. The API server's WebSocket log stream
/// (Kubernetes' `wsstream`) drops the bytes of a read that also returns the end of the body, and
/// Go's chunked reader returns both at once when the closing chunk arrived with the data; sent
/// apart, the last data is read alone, as from the kubelet, whose writes are flushed one by one.
const END_GAP: std::time::Duration = std::time::Duration::from_millis(20);
use super::{Body, ServeError};
use crate::agent::AgentContext;
use crate::agent::runtime::labels;
use crate::logs::LogOptions;

/// Bytes gathered before they are sent on.
const CHUNK: usize = 64 * 1024;

/// Reads the kubelet's log options from a query string.
pub fn options(query: &str, now: Timestamp) -> Result<(LogOptions, bool), ServeError> {
    let q: HashMap<String, String> = form_pairs(query).collect();
    let flag = |name: &str| {
        q.get(name)
            .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "True" | "TRUE"))
    };
    let number = |name: &str| -> Result<Option<i64>, ServeError> {
        match q.get(name) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ServeError::bad_request(format!("{name}={v:?} is not a whole number"))
            }),
        }
    };
    let tail = number("tailLines")?;
    let since_seconds = number("sinceSeconds")?;
    let limit = number("limitBytes")?;
    if tail.is_some_and(|t| t < 0) {
        return Err(ServeError::bad_request(
            "tailLines must be 0 or more".into(),
        ));
    }
    if since_seconds.is_some_and(|s| s < 1) {
        return Err(ServeError::bad_request(
            "sinceSeconds must be greater than 0".into(),
        ));
    }
    if limit.is_some_and(|l| l < 1) {
        return Err(ServeError::bad_request(
            "limitBytes must be greater than 0".into(),
        ));
    }
    let since_time = match q.get("sinceTime") {
        None => None,
        Some(t) => Some(t.parse::<Timestamp>().map_err(|e| {
            ServeError::bad_request(format!("sinceTime={t:?} is not an RFC 3339 time: {e}"))
        })?),
    };
    if since_time.is_some() && since_seconds.is_some() {
        return Err(ServeError::bad_request(
            "at most one of sinceTime or sinceSeconds may be specified".into(),
        ));
    }
    let since = match since_seconds {
        Some(s) => now.checked_sub(SignedDuration::from_secs(s)).ok(),
        None => since_time,
    };
    Ok((
        LogOptions {
            follow: flag("follow"),
            tail_lines: tail.map(|t| t as u64),
            since,
            timestamps: flag("timestamps"),
            limit_bytes: limit.map(|l| l as u64),
        },
        flag("previous"),
    ))
}

/// The pod's containers named `container` on the runtime, newest first.
pub async fn instances(
    ctx: &AgentContext,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<Vec<cri::Container>, ServeError> {
    let selector = HashMap::from([
        (labels::POD_NAMESPACE.to_string(), namespace.to_string()),
        (labels::POD_NAME.to_string(), pod.to_string()),
        (labels::CONTAINER_NAME.to_string(), container.to_string()),
    ]);
    let list = ctx
        .client
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await
        .map_err(|e| ServeError::unavailable(format!("runtime: ListContainers: {}", e.message())))?
        .into_inner();
    let mut found = list.containers;
    found
        .sort_by_key(|c| std::cmp::Reverse((c.created_at, c.metadata.as_ref().map(|m| m.attempt))));
    Ok(found)
}

/// The pod `namespace/pod` as the agent runs it, with `container` among its containers.
pub fn check_pod(
    ctx: &AgentContext,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<k8s_openapi::api::core::v1::Pod, ServeError> {
    let Some(p) = ctx.pods.get(&(namespace.to_string(), pod.to_string())) else {
        return Err(ServeError::not_found(format!(
            "pod \"{namespace}/{pod}\" does not exist on this node"
        )));
    };
    let spec = p.spec.as_ref();
    let known = spec.is_some_and(|s| {
        s.containers.iter().any(|c| c.name == container)
            || s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !known {
        return Err(ServeError::not_found(format!(
            "container \"{container}\" not found in pod \"{namespace}/{pod}\""
        )));
    }
    Ok(p)
}

/// Serves the log.
pub async fn serve(
    ctx: std::sync::Arc<AgentContext>,
    namespace: &str,
    pod: &str,
    container: &str,
    query: &str,
) -> Result<Response<Body>, ServeError> {
    let (opts, previous) = options(query, Timestamp::now())?;
    check_pod(&ctx, namespace, pod, container)?;
    let found = instances(&ctx, namespace, pod, container).await?;
    let chosen = if previous {
        found.get(1)
    } else {
        found.first()
    };
    let Some(chosen) = chosen else {
        return Err(ServeError::bad_request(if previous {
            format!("previous terminated container \"{container}\" in pod \"{pod}\" not found")
        } else {
            format!(
                "container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
            )
        }));
    };
    let status = ctx
        .client
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: chosen.id.clone(),
            verbose: false,
        })
        .await
        .map_err(|e| {
            ServeError::unavailable(format!(
                "runtime: ContainerStatus {}: {}",
                chosen.id,
                e.message()
            ))
        })?
        .into_inner()
        .status
        .unwrap_or_default();
    if status.log_path.is_empty() {
        return Err(ServeError::not_found(format!(
            "container \"{container}\" in pod \"{pod}\" has no log file"
        )));
    }
    let path = std::path::PathBuf::from(&status.log_path);
    let file_exists = tokio::fs::metadata(&path).await.is_ok();
    if !file_exists {
        return Err(ServeError::not_found(format!(
            "log file {} of container \"{container}\" in pod \"{pod}\" is gone",
            path.display()
        )));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, io::Error>>(4);
    let id = chosen.id.clone();
    let client = ctx.client.clone();
    let handle = tokio::runtime::Handle::current();
    let mut was_running = status.state == cri::ContainerState::ContainerRunning as i32;
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        let mut running = || {
            if !was_running {
                return false;
            }
            let state = handle.block_on(client.runtime().container_status(
                cri::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                },
            ));
            was_running = state.is_ok_and(|s| {
                s.into_inner()
                    .status
                    .is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32)
            });
            was_running
        };
        match crate::logs::copy(&path, &opts, &mut out, &mut running) {
            Ok(bytes) => {
                tracing::debug!(log = %path.display(), bytes, "node server: log served");
                if bytes > 0 {
                    // The body's end goes out apart from its last data: see END_GAP.
                    std::thread::sleep(END_GAP);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            Err(e) => {
                tracing::debug!(log = %path.display(), error = %e, "node server: reading a log");
                let _ = out.tx.blocking_send(Err(e));
            }
        }
    });
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = Response::new(body.boxed());
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    Ok(r)
}

/// Output that goes to the response body in chunks; fails once the client has gone.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // A follower waiting on a quiet log flushes nothing; it still learns here that the
        // client hung up, so its thread ends instead of waiting for the container to end.
        if self.buf.is_empty() {
            return if self.tx.is_closed() {
                Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the client went away",
                ))
            } else {
                Ok(())
            };
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(Frame::data(chunk)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_fails_once_the_client_is_gone_even_with_nothing_to_send() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut w = ChannelWriter {
            tx,
            buf: Vec::new(),
        };
        assert!(w.flush().is_ok(), "the client is still there");
        drop(rx);
        let e = w.flush().expect_err("the client went away");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn options_are_read_and_checked_as_the_kubelets() {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().expect("now");
        let (o, prev) = options(
            "follow=true&tailLines=5&sinceSeconds=60&timestamps=1&limitBytes=100&previous=true",
            now,
        )
        .expect("options");
        assert!(prev);
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                tail_lines: Some(5),
                since: Some("2026-12-03T09:59:00Z".parse().expect("t")),
                timestamps: true,
                limit_bytes: Some(100),
            }
        );
        let (o, prev) = options("sinceTime=2026-12-03T09%3A00%3A00%2B01%3A00", now).expect("time");
        assert!(!prev);
        assert_eq!(o.since, Some("2026-12-03T08:00:00Z".parse().expect("t")));
        for bad in [
            "tailLines=-1",
            "tailLines=x",
            "sinceSeconds=0",
            "limitBytes=0",
            "sinceTime=yesterday",
            "sinceSeconds=5&sinceTime=2026-12-03T09:00:00Z",
        ] {
            let e = options(bad, now).expect_err(bad);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
