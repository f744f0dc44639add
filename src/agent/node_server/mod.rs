//! The node server: the HTTPS endpoint the API server reaches the node at for `kubectl logs`,
//! `exec`, `attach`, `port-forward` and `top` (the kubelet's paths on :10250), with x509 and
//! token authentication and SubjectAccessReview authorization; and plain-HTTP `/healthz` on
//! loopback (the kubelet's :10248).

pub mod authn;
pub mod authz;
pub mod logs;
pub mod metrics;
pub mod serving;
pub mod stats;
pub mod streaming;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;

use crate::agent::AgentContext;
use crate::agent::config::AgentConfig;
use streaming::{query_flag, query_values};

/// A response body: whole, or streamed (logs).
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A body of `bytes`.
pub fn body_from(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Why the node server could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeServerError {
    #[error("node server: listening on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// A request that cannot be served.
#[derive(Debug)]
pub struct ServeError {
    pub status: StatusCode,
    pub message: String,
}

impl ServeError {
    pub fn bad_request(message: String) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
    pub fn not_found(message: String) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message,
        }
    }
    pub fn unavailable(message: String) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
        }
    }
    pub fn internal(message: String) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message,
        }
    }

    /// As the kubelet answers errors: the status and the message as plain text (the API
    /// server passes it on to the client).
    fn response(&self) -> Response<Body> {
        plain(self.status, self.message.clone())
    }
}

/// A JSON response.
pub fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Body> {
    let mut r = Response::new(body_from(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn plain(status: StatusCode, text: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(body_from(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// What the server serves from.
pub struct NodeServer {
    ctx: Arc<AgentContext>,
    authn: authn::Authenticator,
    authz: authz::Authorizer,
    stats: stats::Collector,
    client_ca: Option<tls::ClientCa>,
}

/// Starts the node server (and loopback `/healthz`) when the configuration asks for it and there
/// is a way to authenticate clients (an API server, or a client CA). Returns the port it listens
/// on, for the Node's `daemonEndpoints`.
pub async fn start(
    ctx: Arc<AgentContext>,
    cfg: &AgentConfig,
    root: &std::path::Path,
) -> Result<Option<u16>, NodeServerError> {
    if cfg.server_address.is_empty() {
        return Ok(None);
    }
    if ctx.cluster.is_none() && cfg.client_ca_file.is_none() {
        tracing::info!(
            "node server off: no API server to authenticate clients with and no agent.client_ca_file"
        );
        return Ok(None);
    }
    let mut names = vec![ctx.node.name.clone()];
    if ctx.node.hostname != ctx.node.name {
        names.push(ctx.node.hostname.clone());
    }
    if !ctx.node.internal_ip.is_empty() {
        names.push(ctx.node.internal_ip.clone());
    }
    let pki = cfg.cert_dir_in(root);
    let files = match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        _ => None,
    };
    // From the cluster when asked (once issued; stored across restarts), else the operator's
    // files or a self-made one.
    let from_cluster = match &ctx.cluster {
        Some(c) if cfg.rotate_server_certificates && files.is_none() => Some(c.clone()),
        _ => None,
    };
    let stored = from_cluster
        .as_ref()
        .and_then(|_| serving::stored(&pki))
        .and_then(|(c, k)| tls::parse_pair(&c, &k));
    let source = tls::ServingSource {
        files,
        pki_dir: pki.clone(),
        names: names.clone(),
    };
    let (cert, key) = match stored {
        Some(pair) => pair,
        None => tokio::task::spawn_blocking(move || tls::serving_certificate(&source))
            .await
            .map_err(|e| tls::TlsError::Config(format!("making the serving certificate: {e}")))??,
    };
    let serving_cert = tls::ServingCert::new(cert, key)?;
    if let Some(cluster) = from_cluster {
        tokio::spawn(serving::rotate(cluster, serving_cert.clone(), pki, names));
    }
    let client_ca = cfg
        .client_ca_file
        .as_deref()
        .map(tls::ClientCa::load)
        .transpose()?;
    let acceptor = tls::acceptor(serving_cert, client_ca.as_ref())?;
    let listener = tokio::net::TcpListener::bind(&cfg.server_address)
        .await
        .map_err(|error| NodeServerError::Listen {
            address: cfg.server_address.clone(),
            error,
        })?;
    let port = listener.local_addr().map(|a| a.port()).ok();
    let server = Arc::new(NodeServer {
        authn: authn::Authenticator::new(ctx.cluster.clone()),
        authz: authz::Authorizer::new(ctx.cluster.clone(), ctx.node.name.clone()),
        stats: stats::Collector::new(ctx.clone()),
        client_ca,
        ctx,
    });
    tracing::info!(address = %cfg.server_address, port = ?port, "node server listening (HTTPS)");
    tokio::spawn(server.accept_loop(listener, acceptor));
    if !cfg.healthz_address.is_empty() {
        match tokio::net::TcpListener::bind(&cfg.healthz_address).await {
            Ok(l) => {
                tokio::spawn(serve_healthz(l));
            }
            Err(e) => {
                tracing::warn!(address = %cfg.healthz_address, error = %e, "node server: healthz endpoint not started")
            }
        }
    }
    Ok(port)
}

/// Plain-HTTP `/healthz` (for local health checks).
async fn serve_healthz(listener: tokio::net::TcpListener) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                Ok::<_, std::convert::Infallible>(
                    if req.uri().path().trim_end_matches('/') == "/healthz" {
                        plain(StatusCode::OK, "ok")
                    } else {
                        plain(StatusCode::NOT_FOUND, "404 page not found\n")
                    },
                )
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

impl NodeServer {
    async fn accept_loop(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        acceptor: tokio_rustls::TlsAcceptor,
    ) {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "node server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            // The API server opens a connection per exec (upgrades are not pooled) and the
            // exec'd process will join the container's cgroups a few milliseconds later: the
            // cgroup-attach lock gets its head start now, not after the handshake.
            crate::runtime::cgroup_attach::prime();
            let (server, acceptor) = (self.clone(), acceptor.clone());
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "node server: TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                // A presented certificate is judged once per connection; a bad one makes every
                // request on it unauthenticated (401), as a missing one without a token.
                let identity = match (tls.get_ref().1.peer_certificates(), &server.client_ca) {
                    (Some(chain), Some(ca)) if !chain.is_empty() => Some(ca.identify(chain)),
                    _ => None,
                };
                server
                    .serve_connection(TokioIo::new(tls), peer, identity)
                    .await;
            });
        }
    }

    async fn serve_connection<I>(
        self: Arc<Self>,
        io: I,
        peer: SocketAddr,
        identity: Option<Result<(String, Vec<String>), String>>,
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let identity = Arc::new(identity);
        let service = hyper::service::service_fn(move |req| {
            let (server, identity) = (self.clone(), identity.clone());
            async move {
                let response = server.handle(req, identity.as_ref().as_ref()).await;
                Ok::<_, std::convert::Infallible>(response.unwrap_or_else(|e| e.response()))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .serve_connection(io, service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!(%peer, error = %e, "node server: connection ended");
        }
    }

    /// Authenticates, authorizes and routes one request.
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        identity: Option<&Result<(String, Vec<String>), String>>,
    ) -> Result<Response<Body>, ServeError> {
        let certificate = match identity {
            Some(Ok(id)) => Some(id),
            Some(Err(why)) => {
                tracing::debug!(error = %why, "node server: client certificate refused");
                return Ok(plain(StatusCode::UNAUTHORIZED, "Unauthorized"));
            }
            None => None,
        };
        let Some(user) = self.authn.authenticate(certificate, req.headers()).await else {
            return Ok(plain(StatusCode::UNAUTHORIZED, "Unauthorized"));
        };
        let path = req.uri().path().to_string();
        let action = authz::action(req.method(), &path);
        if let Err(authz::Denied(why)) = self.authz.authorize(&user, &action).await {
            tracing::debug!(user = %user.name, path, "node server: forbidden");
            return Ok(plain(StatusCode::FORBIDDEN, why));
        }
        let query = req.uri().query().unwrap_or("").to_string();
        tracing::debug!(user = %user.name, method = %req.method(), path, query, "node server: request");
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let method = req.method().clone();
        let get = method == Method::GET || method == Method::HEAD;
        match parts.as_slice() {
            ["healthz"] if get => Ok(plain(StatusCode::OK, "ok")),
            ["pods"] if get => Ok(json(
                StatusCode::OK,
                &k8s_openapi::List::<k8s_openapi::api::core::v1::Pod> {
                    items: self.ctx.pods.list(),
                    metadata: Default::default(),
                },
            )),
            ["configz"] if get => Ok(json(
                StatusCode::OK,
                &serde_json::json!({ "kubeletconfig": &*self.ctx.config }),
            )),
            ["containerLogs", ns, pod, container] if get => {
                logs::serve(self.ctx.clone(), ns, pod, container, &query).await
            }
            ["exec", ns, pod, container] | ["exec", ns, pod, _, container] => {
                // The exec'd process will join the container's cgroups: the head start.
                crate::runtime::cgroup_attach::prime();
                let id = self.running_container(ns, pod, container).await?;
                let cmd = query_values(&query, "command");
                if cmd.is_empty() {
                    return Err(ServeError::bad_request(
                        "no command given (command=...)".into(),
                    ));
                }
                let (stdin, stdout, stderr, tty) = streams(&query);
                let url = self
                    .ctx
                    .client
                    .runtime()
                    .exec(cri::ExecRequest {
                        container_id: id,
                        cmd,
                        tty,
                        stdin,
                        stdout,
                        stderr,
                    })
                    .await
                    .map_err(|e| runtime_error("Exec", e))?
                    .into_inner()
                    .url;
                streaming::proxy(req, &url).await
            }
            ["attach", ns, pod, container] | ["attach", ns, pod, _, container] => {
                let id = self.running_container(ns, pod, container).await?;
                let (stdin, stdout, stderr, tty) = streams(&query);
                let url = self
                    .ctx
                    .client
                    .runtime()
                    .attach(cri::AttachRequest {
                        container_id: id,
                        tty,
                        stdin,
                        stdout,
                        stderr,
                    })
                    .await
                    .map_err(|e| runtime_error("Attach", e))?
                    .into_inner()
                    .url;
                streaming::proxy(req, &url).await
            }
            ["portForward", ns, pod] | ["portForward", ns, pod, _] => {
                let sandbox = self.ready_sandbox(ns, pod).await?;
                let url = self
                    .ctx
                    .client
                    .runtime()
                    .port_forward(cri::PortForwardRequest {
                        pod_sandbox_id: sandbox,
                        port: Vec::new(),
                    })
                    .await
                    .map_err(|e| runtime_error("PortForward", e))?
                    .into_inner()
                    .url;
                streaming::proxy(req, &url).await
            }
            ["run", ns, pod, container] | ["run", ns, pod, _, container]
                if method == Method::POST =>
            {
                let id = self.running_container(ns, pod, container).await?;
                let cmd: Vec<String> = query_values(&query, "cmd")
                    .iter()
                    .flat_map(|c| c.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .collect();
                if cmd.is_empty() {
                    return Err(ServeError::bad_request("no command given (cmd=...)".into()));
                }
                let out = self
                    .ctx
                    .client
                    .runtime()
                    .exec_sync(cri::ExecSyncRequest {
                        container_id: id,
                        cmd,
                        timeout: 0,
                    })
                    .await
                    .map_err(|e| runtime_error("ExecSync", e))?
                    .into_inner();
                let mut text = out.stdout;
                text.extend_from_slice(&out.stderr);
                Ok(plain(StatusCode::OK, text))
            }
            ["stats", "summary"] if get => {
                let only = query_flag(&query, "only_cpu_and_memory");
                Ok(json(StatusCode::OK, &self.stats.summary(only).await?))
            }
            ["metrics", "resource"] if get => {
                let summary = self.stats.summary(true).await?;
                Ok(plain(StatusCode::OK, metrics::resource(&summary)))
            }
            ["metrics"] if get => Ok(plain(StatusCode::OK, metrics::agent(&self.ctx))),
            _ if !get && known_get_path(&parts) => Err(ServeError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                message: format!("{method} is not allowed on {path}"),
            }),
            _ => Ok(plain(StatusCode::NOT_FOUND, "404 page not found\n")),
        }
    }

    /// The running container `container` of pod `ns/pod`.
    async fn running_container(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
    ) -> Result<String, ServeError> {
        logs::check_pod(&self.ctx, ns, pod, container)?;
        let found = logs::instances(&self.ctx, ns, pod, container).await?;
        found
            .into_iter()
            .find(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .map(|c| c.id)
            .ok_or_else(|| {
                ServeError::not_found(format!(
                    "container \"{container}\" in pod \"{ns}/{pod}\" is not running"
                ))
            })
    }

    /// The ready sandbox of pod `ns/pod`.
    async fn ready_sandbox(&self, ns: &str, pod: &str) -> Result<String, ServeError> {
        if self
            .ctx
            .pods
            .get(&(ns.to_string(), pod.to_string()))
            .is_none()
        {
            return Err(ServeError::not_found(format!(
                "pod \"{ns}/{pod}\" does not exist on this node"
            )));
        }
        let selector = std::collections::HashMap::from([
            (
                crate::agent::runtime::labels::POD_NAMESPACE.to_string(),
                ns.to_string(),
            ),
            (
                crate::agent::runtime::labels::POD_NAME.to_string(),
                pod.to_string(),
            ),
        ]);
        let list = self
            .ctx
            .client
            .runtime()
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    label_selector: selector,
                    state: Some(cri::PodSandboxStateValue {
                        state: cri::PodSandboxState::SandboxReady as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|e| runtime_error("ListPodSandbox", e))?
            .into_inner();
        list.items
            .into_iter()
            .max_by_key(|s| s.created_at)
            .map(|s| s.id)
            .ok_or_else(|| {
                ServeError::not_found(format!("pod \"{ns}/{pod}\" has no ready sandbox"))
            })
    }
}

/// Paths served for GET only (another method there is 405, not 404).
fn known_get_path(parts: &[&str]) -> bool {
    matches!(
        parts.first().copied(),
        Some("healthz" | "pods" | "configz" | "containerLogs" | "stats" | "metrics")
    )
}

/// stdin, stdout, stderr and tty as the kubelet reads them from the query (`input`, `output`,
/// `error`, `tty`); a terminal has no separate stderr.
fn streams(query: &str) -> (bool, bool, bool, bool) {
    let tty = query_flag(query, "tty");
    (
        query_flag(query, "input"),
        query_flag(query, "output"),
        query_flag(query, "error") && !tty,
        tty,
    )
}

/// A CRI call's failure as an HTTP answer.
fn runtime_error(call: &str, status: tonic::Status) -> ServeError {
    let code = match status.code() {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ServeError {
        status: code,
        message: format!("runtime: {call}: {}", status.message()),
    }
}
