//! Exec, attach and port-forward through the node server: the runtime is asked for a streaming
//! URL (CRI Exec, Attach, PortForward), and the client's upgraded connection (SPDY or WebSocket,
//! as the API server sends it) is joined byte for byte to the runtime's streaming server.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::{Body, ServeError, body_from};

/// Seconds to wait for the runtime's streaming server to accept and answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Joins `req` (still carrying its upgrade) to the streaming server at `url`.
pub async fn proxy(mut req: Request<Incoming>, url: &str) -> Result<Response<Body>, ServeError> {
    let target: Uri = url.parse().map_err(|e| {
        ServeError::internal(format!("runtime gave a bad streaming URL {url:?}: {e}"))
    })?;
    if target.scheme_str() != Some("http") {
        return Err(ServeError::internal(format!(
            "runtime's streaming URL {url:?} is not plain HTTP: the node server proxies to a loopback http streaming server only"
        )));
    }
    let authority = target
        .authority()
        .ok_or_else(|| ServeError::internal(format!("streaming URL {url:?} has no host")))?
        .clone();
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(authority.as_str()),
    )
    .await
    .map_err(|_| {
        ServeError::unavailable(format!(
            "streaming server {authority} did not accept in time"
        ))
    })?
    .map_err(|e| ServeError::unavailable(format!("streaming server {authority}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| ServeError::unavailable(format!("streaming server {authority}: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "node server: streaming backend connection");
        }
    });
    let path = target
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(path)
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| ServeError::internal(e.to_string()))?;
    for (name, value) in req.headers() {
        // The client's credentials were for this server; the backend trusts its token.
        if name == http::header::AUTHORIZATION || name == http::header::HOST {
            continue;
        }
        out.headers_mut().append(name.clone(), value.clone());
    }
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        out.headers_mut().insert(http::header::HOST, host);
    }
    let mut answer = tokio::time::timeout(CONNECT_TIMEOUT, sender.send_request(out))
        .await
        .map_err(|_| {
            ServeError::unavailable(format!(
                "streaming server {authority} did not answer in time"
            ))
        })?
        .map_err(|e| ServeError::unavailable(format!("streaming server {authority}: {e}")))?;
    let status = answer.status();
    let mut reply = Response::builder().status(status);
    for (name, value) in answer.headers() {
        reply = reply.header(name, value);
    }
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // A refusal (unsupported protocol, expired token): passed on as it is.
        let body = answer
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return reply
            .body(body_from(body))
            .map_err(|e| ServeError::internal(e.to_string()));
    }
    let client_side = hyper::upgrade::on(&mut req);
    let backend_side = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_side, backend_side) {
            (Ok(c), Ok(b)) => (c, b),
            (c, b) => {
                tracing::debug!(client = ?c.err(), backend = ?b.err(), "node server: stream upgrade failed");
                return;
            }
        };
        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
        // Ends when either side closes; dropping both then closes the other, so a client that
        // hangs up ends the runtime's session (and its exec process) too.
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
            tracing::debug!(error = %e, "node server: stream ended");
        }
    });
    reply
        .body(body_from(Bytes::new()))
        .map_err(|e| ServeError::internal(e.to_string()))
}

/// The query's values of `name`, in order.
pub fn query_values(query: &str, name: &str) -> Vec<String> {
    form_pairs(query)
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v)
        .collect()
}

/// A boolean query parameter as the kubelet reads them (`1`, `true`; absent: false).
pub fn query_flag(query: &str, name: &str) -> bool {
    query_values(query, name)
        .last()
        .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "True" | "TRUE"))
}

/// `application/x-www-form-urlencoded` pairs of a query string.
pub fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_decode_as_forms() {
        let q =
            "command=sh&command=-c&command=echo+a%20b%3B&input=1&tty=true&output=0&bad=%zz&end=%4";
        assert_eq!(query_values(q, "command"), ["sh", "-c", "echo a b;"]);
        assert!(query_flag(q, "input"));
        assert!(query_flag(q, "tty"));
        assert!(!query_flag(q, "output"));
        assert!(!query_flag(q, "error"));
        assert_eq!(
            query_values(q, "bad"),
            ["%zz"],
            "a bad escape stays as written"
        );
        assert_eq!(query_values(q, "end"), ["%4"]);
    }
}
