//! The streaming server: one-time URLs for Exec, Attach and PortForward, served over SPDY/3.1 and WebSocket.

pub mod fdio;
pub mod portforward;
pub mod remotecommand;
pub mod spdy;
pub mod websocket;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;

use crate::config::StreamConfig;
use crate::runtime::container::ContainerManager;
use crate::runtime::sandbox::SandboxManager;

/// Why the streaming server could not start or a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("stream server: bind {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("stream server: TLS: {0}")]
    Tls(String),
}

/// What a token stands for.
#[derive(Debug, Clone)]
pub enum Pending {
    Exec(cri::ExecRequest),
    Attach(cri::AttachRequest),
    PortForward(cri::PortForwardRequest),
}

impl Pending {
    fn kind(&self) -> &'static str {
        match self {
            Pending::Exec(_) => "exec",
            Pending::Attach(_) => "attach",
            Pending::PortForward(_) => "portforward",
        }
    }
}

/// One-time tokens (128 random bits), each valid once, for one verb, until it expires.
struct Tokens {
    map: Mutex<HashMap<String, (Pending, Instant)>>,
    expiry: Duration,
}

/// Why a streaming URL was refused.
#[derive(Debug, PartialEq, Eq)]
enum TokenRefusal {
    /// Never issued, already used, or expired.
    Unknown,
    /// Issued for another verb; the token is spent all the same.
    OtherVerb(&'static str),
}

impl Tokens {
    /// A new token for `p`; None when the kernel gives no randomness (no guessable token is
    /// ever issued).
    fn insert(&self, p: Pending) -> Option<String> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).ok()?;
        let token = hex::encode(raw);
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (_, t)| now.duration_since(*t) < self.expiry);
        map.insert(token.clone(), (p, now));
        Some(token)
    }

    /// What `token` stands for, if it is live and was issued for `verb`; spent either way.
    fn take(&self, verb: &str, token: &str) -> Result<Pending, TokenRefusal> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (p, t) = map.remove(token).ok_or(TokenRefusal::Unknown)?;
        if t.elapsed() >= self.expiry {
            return Err(TokenRefusal::Unknown);
        }
        if p.kind() != verb {
            return Err(TokenRefusal::OtherVerb(p.kind()));
        }
        Ok(p)
    }
}

/// Time of the last traffic on a connection (for the idle timeout).
#[derive(Clone)]
pub struct Activity(Arc<(Instant, AtomicU64)>);

impl Default for Activity {
    fn default() -> Self {
        Self(Arc::new((Instant::now(), AtomicU64::new(0))))
    }
}

impl Activity {
    pub fn touch(&self) {
        let ms = self.0.0.elapsed().as_millis() as u64;
        self.0.1.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.0.1.load(Ordering::Relaxed));
        self.0.0.elapsed().saturating_sub(last)
    }

    /// Resolves once there was no traffic for `limit`.
    pub async fn idle(&self, limit: Duration) {
        loop {
            let idle = self.idle_for();
            if idle >= limit {
                return;
            }
            tokio::time::sleep(limit - idle).await;
        }
    }
}

/// The streaming server.
pub struct StreamServer {
    base_url: String,
    tokens: Tokens,
    pub(crate) idle_timeout: Duration,
    pub(crate) containers: Arc<ContainerManager>,
    pub(crate) sandboxes: Arc<SandboxManager>,
}

type Body = Full<Bytes>;

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(msg.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    r
}

/// Every value of header `name`, split at commas, trimmed.
pub(crate) fn header_list(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

impl StreamServer {
    /// Binds the configured address and serves in the background.
    pub async fn start(
        cfg: &StreamConfig,
        containers: Arc<ContainerManager>,
        sandboxes: Arc<SandboxManager>,
    ) -> Result<Arc<Self>, StreamError> {
        let listener = tokio::net::TcpListener::bind(&cfg.address)
            .await
            .map_err(|source| StreamError::Bind {
                address: cfg.address.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| StreamError::Bind {
            address: cfg.address.clone(),
            source,
        })?;
        let tls = match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
            _ => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let host = match local {
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
            SocketAddr::V4(a) => a.to_string(),
        };
        let server = Arc::new(Self {
            base_url: format!("{scheme}://{host}"),
            tokens: Tokens {
                map: Mutex::new(HashMap::new()),
                expiry: Duration::from_secs(cfg.token_expiry_secs),
            },
            idle_timeout: Duration::from_secs(cfg.idle_timeout_secs.max(1)),
            containers,
            sandboxes,
        });
        tracing::info!(url = %server.base_url, "streaming server listening");
        let s = server.clone();
        tokio::spawn(async move { s.accept_loop(listener, tls).await });
        Ok(server)
    }

    /// `http://HOST:PORT` of the server.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// A one-time URL for `p`; None when no unguessable token can be made.
    pub fn url_for(&self, p: Pending) -> Option<String> {
        let kind = p.kind();
        let token = self.tokens.insert(p)?;
        Some(format!("{}/{kind}/{token}", self.base_url))
    }

    async fn accept_loop(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "stream server accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let server = self.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => server.serve_http(TokioIo::new(s), peer).await,
                            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake"),
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        }
                    }
                    None => server.serve_http(TokioIo::new(tcp), peer).await,
                }
            });
        }
    }

    async fn serve_http<I>(self: Arc<Self>, io: I, peer: SocketAddr)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| {
            let server = self.clone();
            async move { Ok::<_, std::convert::Infallible>(server.route(req)) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .serve_connection(io, service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!(%peer, error = %e, "stream server connection");
        }
    }

    fn route(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let Some((kind, token)) = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .filter(|(k, t)| {
                matches!(*k, "exec" | "attach" | "portforward") && !t.is_empty() && !t.contains('/')
            })
        else {
            return text(StatusCode::NOT_FOUND, "not found");
        };
        let pending = match self.tokens.take(kind, token) {
            Ok(p) => p,
            Err(TokenRefusal::Unknown) => {
                return text(
                    StatusCode::NOT_FOUND,
                    "unknown or expired streaming token (they are single-use and expire unused)",
                );
            }
            Err(TokenRefusal::OtherVerb(issued)) => {
                tracing::warn!(path = %path, issued, "streaming token used for another verb; spent");
                return text(
                    StatusCode::NOT_FOUND,
                    format!("streaming token was issued for {issued}, not {kind}; it is spent"),
                );
            }
        };
        let upgrade = header_list(req.headers(), "upgrade");
        let ws = upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket"));
        let spdy = upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1"));
        if ws {
            self.upgrade_websocket(req, pending)
        } else if spdy {
            self.upgrade_spdy(req, pending)
        } else {
            text(
                StatusCode::BAD_REQUEST,
                "expected an upgrade to SPDY/3.1 or websocket",
            )
        }
    }

    fn upgrade_spdy(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        pending: Pending,
    ) -> Response<Body> {
        let supported: &[&str] = match pending {
            Pending::PortForward(_) => portforward::SPDY_PROTOCOLS,
            _ => remotecommand::SPDY_PROTOCOLS,
        };
        let offered = header_list(req.headers(), "x-stream-protocol-version");
        let chosen = if offered.is_empty() {
            // Old clients send none: the first protocol version is implied.
            String::new()
        } else {
            match offered.iter().find(|o| supported.contains(&o.as_str())) {
                Some(p) => p.clone(),
                None => {
                    return text(
                        StatusCode::FORBIDDEN,
                        format!(
                            "unable to upgrade: none of the requested protocols {offered:?} is supported ({supported:?})"
                        ),
                    );
                }
            }
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        let server = self.clone();
        let protocol = chosen.clone();
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(up) => {
                    let _open =
                        crate::metrics::prometheus::runtime().stream_session(pending.kind());
                    let activity = Activity::default();
                    let session = spdy::Session::start(TokioIo::new(up), activity.clone());
                    match pending {
                        Pending::PortForward(p) => {
                            portforward::serve_spdy(server, p, session, activity).await
                        }
                        other => {
                            remotecommand::serve_spdy(server, other, &protocol, session, activity)
                                .await
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "spdy upgrade"),
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("Upgrade"),
        );
        h.insert(http::header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        if let Ok(v) = HeaderValue::from_str(&chosen)
            && !chosen.is_empty()
        {
            h.insert("x-stream-protocol-version", v);
        }
        r
    }

    fn upgrade_websocket(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        pending: Pending,
    ) -> Response<Body> {
        let Some(key) = req
            .headers()
            .get("sec-websocket-key")
            .and_then(|k| k.to_str().ok())
            .map(str::to_string)
        else {
            return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        let offered = header_list(req.headers(), "sec-websocket-protocol");
        let supported: &[&str] = match pending {
            Pending::PortForward(_) => portforward::WS_PROTOCOLS,
            _ => remotecommand::WS_PROTOCOLS,
        };
        let chosen = offered
            .iter()
            .find(|o| supported.contains(&o.as_str()))
            .cloned();
        let chosen = match chosen {
            Some(c) => c,
            None if offered.is_empty() => String::new(),
            None => {
                return text(
                    StatusCode::FORBIDDEN,
                    format!("none of the websocket protocols {offered:?} is supported"),
                );
            }
        };
        let query = req.uri().query().unwrap_or("").to_string();
        let on_upgrade = hyper::upgrade::on(&mut req);
        let server = self.clone();
        let protocol = chosen.clone();
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(up) => {
                    let _open =
                        crate::metrics::prometheus::runtime().stream_session(pending.kind());
                    let io = TokioIo::new(up);
                    match pending {
                        Pending::PortForward(p) => {
                            portforward::serve_websocket(server, p, &protocol, &query, io).await
                        }
                        other => remotecommand::serve_websocket(server, other, &protocol, io).await,
                    }
                }
                Err(e) => tracing::debug!(error = %e, "websocket upgrade"),
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("Upgrade"),
        );
        h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&websocket::accept_key(&key)) {
            h.insert("sec-websocket-accept", v);
        }
        if !chosen.is_empty()
            && let Ok(v) = HeaderValue::from_str(&chosen)
        {
            h.insert("sec-websocket-protocol", v);
        }
        r
    }
}

/// A TLS acceptor from PEM files.
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, StreamError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StreamError::Tls(format!("{}: {e}", cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| StreamError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StreamError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| StreamError::Tls(e.to_string()))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_resolves_only_after_a_quiet_period() {
        let a = Activity::default();
        a.touch();
        let t = Instant::now();
        let ticker = {
            let a = a.clone();
            tokio::spawn(async move {
                for _ in 0..5 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    a.touch();
                }
            })
        };
        a.idle(Duration::from_millis(60)).await;
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        ticker.await.expect("ticker");
    }

    #[test]
    fn tokens_are_single_use_bound_to_their_verb_and_expire() {
        let t = Tokens {
            map: Mutex::new(HashMap::new()),
            expiry: Duration::from_millis(50),
        };
        let p = || Pending::PortForward(cri::PortForwardRequest::default());
        let a = t.insert(p()).expect("token");
        let b = t.insert(p()).expect("token");
        let c = t.insert(p()).expect("token");
        assert_ne!(a, b);
        assert_eq!(a.len(), 32, "128 bits");
        assert!(t.take("portforward", &a).is_ok());
        assert_eq!(
            t.take("portforward", &a).err(),
            Some(TokenRefusal::Unknown),
            "second use"
        );
        assert_eq!(
            t.take("exec", &c).err(),
            Some(TokenRefusal::OtherVerb("portforward"))
        );
        assert_eq!(
            t.take("portforward", &c).err(),
            Some(TokenRefusal::Unknown),
            "a token tried on another verb is spent"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            t.take("portforward", &b).err(),
            Some(TokenRefusal::Unknown),
            "expired"
        );
        assert!(t.take("portforward", "nope").is_err());
    }
}
