//! httpGet probes: one GET over HTTP or HTTPS (certificates not verified), following
//! redirects on the same host as the kubelet does.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::HTTPGetAction;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::authority;

/// Redirects followed before the probe fails (Go's HTTP client's limit, which the kubelet's
/// probes use).
pub const MAX_REDIRECTS: usize = 10;

/// The largest response head read; a longer one is malformed for a probe.
const MAX_HEAD: usize = 16 * 1024;

/// Probes `host:port` with `http`: success for a final status 200–399. Redirects (301, 302,
/// 303, 307, 308 with a Location) to the same host are followed, up to [`MAX_REDIRECTS`]; one
/// to another host ends the probe as a success with a warning (returned), as the kubelet
/// counts it, because a probe never leaves the pod. Connecting, every request and every
/// redirect share `timeout`.
pub async fn check(
    http: &HTTPGetAction,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Option<String>, String> {
    let first = Target {
        scheme: Scheme::parse(http.scheme.as_deref())?,
        host: host.to_string(),
        port,
        path: http.path.clone().unwrap_or_else(|| "/".into()),
    };
    let headers: Vec<(String, String)> = http
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let url = first.url();
    let end = tokio::time::timeout(timeout, follow(first, &headers))
        .await
        .map_err(|_| {
            format!(
                "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )
        })??;
    let code = match end {
        End::Status(code) => code,
        End::Elsewhere(location) => {
            return Ok(Some(format!("Probe terminated redirects to {location}")));
        }
    };
    if (200..400).contains(&code) {
        Ok(None)
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// How a probe's GETs ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// A final status code.
    Status(u16),
    /// A redirect to another host (not followed), to this location.
    Elsewhere(String),
}

/// GETs `target`, following same-host redirects.
async fn follow(mut target: Target, headers: &[(String, String)]) -> Result<End, String> {
    for _ in 0..=MAX_REDIRECTS {
        let reply = get(&target, headers).await?;
        let location = match (reply.code, reply.location) {
            (301 | 302 | 303 | 307 | 308, Some(location)) => location,
            (code, _) => return Ok(End::Status(code)),
        };
        match target.redirect(&location) {
            Some(next) => target = next,
            None => {
                tracing::debug!(
                    from = %target.url(),
                    to = %location,
                    "probe redirected to another host: not followed, counted as success"
                );
                return Ok(End::Elsewhere(location));
            }
        }
    }
    Err(format!(
        "Get {:?}: stopped after {MAX_REDIRECTS} redirects",
        target.url()
    ))
}

/// Where one request of a probe goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    scheme: Scheme,
    host: String,
    port: u16,
    /// Path and query, starting with `/`.
    path: String,
}

impl Target {
    fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            authority(&self.host, self.port),
            self.path
        )
    }

    /// Where a redirect to `location` leads: an absolute path or a relative one on this
    /// target, or an absolute URL whose host name is this target's (any port or scheme);
    /// `None` for another host or a location that does not parse.
    fn redirect(&self, location: &str) -> Option<Target> {
        let location = location.trim();
        if let Some((scheme, rest)) = location.split_once("://") {
            let scheme = Scheme::parse(Some(scheme)).ok()?;
            let (auth, path) = match rest.find(['/', '?']) {
                Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
                Some(i) => (&rest[..i], rest[i..].to_string()),
                None => (rest, "/".to_string()),
            };
            let (host, port) = split_authority(auth, scheme)?;
            if !host.eq_ignore_ascii_case(&self.host) {
                return None;
            }
            return Some(Target {
                scheme,
                host: self.host.clone(),
                port,
                path,
            });
        }
        if location.starts_with("//") {
            // Scheme-relative: another authority, same scheme.
            return self.redirect(&format!("{}:{location}", self.scheme.as_str()));
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            // Relative to the current path's directory (query dropped).
            let current = self.path.split('?').next().unwrap_or("/");
            let dir = &current[..current.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{location}", if dir.is_empty() { "/" } else { dir })
        };
        Some(Target {
            path,
            ..self.clone()
        })
    }
}

/// `host[:port]` or `[v6][:port]` with the scheme's default port.
fn split_authority(auth: &str, scheme: Scheme) -> Option<(String, u16)> {
    let auth = auth.rsplit('@').next().unwrap_or(auth);
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => scheme.default_port(),
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// The scheme of an httpGet probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// `HTTP` (the default) or `HTTPS`, in any case, as the kubelet accepts them.
    fn parse(s: Option<&str>) -> Result<Self, String> {
        match s.unwrap_or("HTTP").to_ascii_uppercase().as_str() {
            "" | "HTTP" => Ok(Self::Http),
            "HTTPS" => Ok(Self::Https),
            other => Err(format!("unsupported httpGet scheme {other:?}")),
        }
    }

    /// The URL scheme.
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// The part of a response a probe looks at.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    code: u16,
    location: Option<String>,
}

/// One GET over plain TCP or TLS.
async fn get(target: &Target, headers: &[(String, String)]) -> Result<Reply, String> {
    let auth = authority(&target.host, target.port);
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("dial {auth}: {e}"))?;
    match target.scheme {
        Scheme::Http => exchange(tcp, &auth, &target.path, headers).await,
        Scheme::Https => {
            let tls = tls_handshake(tcp, &target.host).await?;
            exchange(tls, &auth, &target.path, headers).await
        }
    }
}

/// The TLS client configuration of every HTTPS probe (built once): no certificate verification
/// (see [`AcceptAnyCertificate`]), no client certificate, no session resumption; the error of a
/// failed setup otherwise.
static PROBE_TLS: LazyLock<Result<Arc<rustls::ClientConfig>, String>> = LazyLock::new(|| {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    // Every probe a full handshake, as when each built its own configuration (and as the
    // kubelet's probes, which keep no session cache).
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
});

/// TLS over `tcp` without verifying the server's certificate, as the kubelet's HTTPS probes do.
async fn tls_handshake(
    tcp: tokio::net::TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let config = PROBE_TLS.as_ref().map_err(Clone::clone)?;
    // An IP address gives no SNI; a name is sent as SNI.
    let server_name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("TLS server name {host:?}: {e}"))?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {host}: {e}"))
}

/// Accepts any server certificate, checking only that the server holds the key it presented.
///
/// SAFETY-style note (no `unsafe` here, but a deliberate weakening): the kubelet's HTTPS probes
/// skip certificate verification (`InsecureSkipVerify`), because a probe asks "does the
/// container answer?", not "is this peer who it claims to be?"; containers serve self-signed
/// or pod-IP certificates no node could verify. Probes send no secrets, so an impostor could
/// at most fake a health verdict it could fake with plain HTTP too. Never use this verifier
/// for anything but probes.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Sends the GET on `s` and reads the response head.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    authority: &str,
    path: &str,
    headers: &[(String, String)],
) -> Result<Reply, String> {
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("host") {
        req.push_str(&format!("Host: {authority}\r\n"));
    }
    if !has("user-agent") {
        req.push_str("User-Agent: kube-probe/1.37\r\n");
    }
    if !has("accept") {
        req.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("sending request: {e}"))?;
    s.flush()
        .await
        .map_err(|e| format!("sending request: {e}"))?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_HEAD {
        let n = s
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading response: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    parse_head(&String::from_utf8_lossy(&buf)).ok_or_else(|| "malformed HTTP response".into())
}

/// The status code and Location header of a response head.
fn parse_head(head: &str) -> Option<Reply> {
    let mut lines = head.split("\r\n");
    let code = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let location = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("location"))
        .map(|(_, v)| v.trim().to_string());
    Some(Reply { code, location })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str) -> Target {
        Target {
            scheme: Scheme::Http,
            host: "10.0.0.5".into(),
            port: 8080,
            path: path.into(),
        }
    }

    #[test]
    fn schemes_are_http_or_https_in_any_case() {
        assert_eq!(Scheme::parse(None), Ok(Scheme::Http));
        assert_eq!(Scheme::parse(Some("https")), Ok(Scheme::Https));
        assert_eq!(Scheme::parse(Some("HTTPS")), Ok(Scheme::Https));
        assert!(Scheme::parse(Some("ftp")).is_err());
    }

    #[test]
    fn redirects_on_the_same_host_are_followed_and_others_are_not() {
        let t = target("/a/b?x=1");
        assert_eq!(t.redirect("/healthz"), Some(target("/healthz")));
        assert_eq!(t.redirect("c"), Some(target("/a/c")));
        assert_eq!(target("/").redirect("c?y=2"), Some(target("/c?y=2")));
        // Same host name, other port and scheme: followed there.
        assert_eq!(
            t.redirect("https://10.0.0.5:8443/z"),
            Some(Target {
                scheme: Scheme::Https,
                port: 8443,
                ..target("/z")
            })
        );
        assert_eq!(
            t.redirect("http://10.0.0.5"),
            Some(Target {
                port: 80,
                ..target("/")
            })
        );
        assert_eq!(t.redirect("http://10.0.0.5:8080?q"), Some(target("/?q")));
        // Another host, by URL or scheme-relative: not followed.
        assert_eq!(t.redirect("http://example.invalid/"), None);
        assert_eq!(t.redirect("//example.invalid/x"), None);
        assert_eq!(
            t.redirect("//10.0.0.5:9000/x"),
            Some(Target {
                port: 9000,
                ..target("/x")
            })
        );
        // Unparseable: not followed.
        assert_eq!(t.redirect("http://10.0.0.5:notaport/"), None);
        assert_eq!(t.redirect("ftp://10.0.0.5/"), None);
        let v6 = Target {
            host: "fd00::5".into(),
            ..target("/")
        };
        assert_eq!(
            v6.redirect("http://[fd00::5]:81/x"),
            Some(Target {
                port: 81,
                path: "/x".into(),
                ..v6.clone()
            })
        );
    }

    #[test]
    fn response_heads_give_status_and_location() {
        assert_eq!(
            parse_head("HTTP/1.1 302 Found\r\nContent-Length: 0\r\nlocation:  /next \r\n\r\n"),
            Some(Reply {
                code: 302,
                location: Some("/next".into())
            })
        );
        assert_eq!(
            parse_head("HTTP/1.0 200 OK\r\n\r\nLocation: /body-not-head"),
            Some(Reply {
                code: 200,
                location: None
            })
        );
        assert_eq!(parse_head("garbage"), None);
        assert_eq!(parse_head(""), None);
    }
}
