//! berthd's side of the shim API (proto/shim.proto): one framed request per connection, every
//! call under a deadline so a hung or stopped shim never blocks berthd.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The shim API messages, generated from proto/shim.proto.
#[allow(missing_docs, clippy::all)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/berth.shim.v1.rs"));
}

/// Largest frame accepted (the shim refuses larger ones too).
const MAX_FRAME: u32 = 16 << 20;

/// Why a shim call failed.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The shim is gone (no socket, connection refused or reset).
    #[error("shim {socket}: unavailable: {reason}")]
    Unavailable { socket: PathBuf, reason: String },
    /// The shim did not answer in time (hung or stopped).
    #[error("shim {socket}: no answer within {deadline:?}")]
    DeadlineExceeded { socket: PathBuf, deadline: Duration },
    /// The shim answered with an error.
    #[error("shim {socket}: {message}")]
    Remote { socket: PathBuf, message: String },
    /// The answer does not decode or is not the expected kind.
    #[error("shim {socket}: bad answer: {reason}")]
    Protocol { socket: PathBuf, reason: String },
}

/// A client for one shim's socket.
#[derive(Debug, Clone)]
pub struct ShimClient {
    socket: PathBuf,
}

impl ShimClient {
    /// A client for the shim listening on `socket`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_owned(),
        }
    }

    /// Sends one request and reads the answer, all within `deadline`.
    pub async fn call(
        &self,
        request: api::request::Request,
        deadline: Duration,
    ) -> Result<api::response::Result, ShimError> {
        match tokio::time::timeout(deadline, self.exchange(request)).await {
            Ok(r) => r,
            Err(_) => Err(ShimError::DeadlineExceeded {
                socket: self.socket.clone(),
                deadline,
            }),
        }
    }

    async fn exchange(
        &self,
        request: api::request::Request,
    ) -> Result<api::response::Result, ShimError> {
        let unavailable = |e: std::io::Error| ShimError::Unavailable {
            socket: self.socket.clone(),
            reason: e.to_string(),
        };
        let mut stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(unavailable)?;
        let body = api::Request {
            request: Some(request),
        }
        .encode_to_vec();
        let len = u32::try_from(body.len()).map_err(|_| ShimError::Protocol {
            socket: self.socket.clone(),
            reason: "request too large".into(),
        })?;
        stream
            .write_all(&len.to_be_bytes())
            .await
            .map_err(unavailable)?;
        stream.write_all(&body).await.map_err(unavailable)?;
        let mut len_buf = [0u8; 4];
        stream.read_exact(&mut len_buf).await.map_err(unavailable)?;
        let len = u32::from_be_bytes(len_buf);
        if len > MAX_FRAME {
            return Err(ShimError::Protocol {
                socket: self.socket.clone(),
                reason: format!("frame of {len} bytes"),
            });
        }
        let mut buf = vec![0u8; len as usize];
        stream.read_exact(&mut buf).await.map_err(unavailable)?;
        let response = api::Response::decode(buf.as_slice()).map_err(|e| ShimError::Protocol {
            socket: self.socket.clone(),
            reason: e.to_string(),
        })?;
        if !response.error.is_empty() {
            return Err(ShimError::Remote {
                socket: self.socket.clone(),
                message: response.error,
            });
        }
        response.result.ok_or_else(|| ShimError::Protocol {
            socket: self.socket.clone(),
            reason: "answer without a result".into(),
        })
    }

    /// The container's state.
    pub async fn state(&self, deadline: Duration) -> Result<api::StateResponse, ShimError> {
        match self
            .call(api::request::Request::State(api::StateRequest {}), deadline)
            .await?
        {
            api::response::Result::State(s) => Ok(s),
            other => Err(self.unexpected(&other)),
        }
    }

    fn unexpected(&self, got: &api::response::Result) -> ShimError {
        ShimError::Protocol {
            socket: self.socket.clone(),
            reason: format!("unexpected answer {got:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_socket(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("berth-shimc-{tag}-{}.sock", std::process::id()))
    }

    /// A peer speaking the framing: answers every request with `answer`.
    async fn serve_once(listener: tokio::net::UnixListener, answer: api::Response) {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.expect("len");
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.expect("body");
        let req = api::Request::decode(body.as_slice()).expect("request decodes");
        assert!(matches!(req.request, Some(api::request::Request::State(_))));
        let out = answer.encode_to_vec();
        s.write_all(&(out.len() as u32).to_be_bytes())
            .await
            .expect("write");
        s.write_all(&out).await.expect("write");
    }

    #[tokio::test]
    async fn state_round_trip_and_remote_errors() {
        let path = temp_socket("ok");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let answer = api::Response {
            error: String::new(),
            result: Some(api::response::Result::State(api::StateResponse {
                id: "c1".into(),
                status: api::Status::Running as i32,
                pid: 42,
                ..Default::default()
            })),
        };
        let server = tokio::spawn(serve_once(listener, answer));
        let s = ShimClient::new(&path)
            .state(Duration::from_secs(5))
            .await
            .expect("state");
        assert_eq!((s.id.as_str(), s.pid), ("c1", 42));
        server.await.expect("server");

        let listener = tokio::net::UnixListener::bind({
            let _ = std::fs::remove_file(&path);
            &path
        })
        .expect("bind");
        let answer = api::Response {
            error: "container c1 is gone".into(),
            result: None,
        };
        let server = tokio::spawn(serve_once(listener, answer));
        let e = ShimClient::new(&path)
            .state(Duration::from_secs(5))
            .await
            .expect_err("remote error");
        assert!(matches!(e, ShimError::Remote { .. }), "{e}");
        assert!(e.to_string().contains("container c1 is gone"));
        server.await.expect("server");
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn a_hung_shim_hits_the_deadline_and_a_missing_one_is_unavailable() {
        let path = temp_socket("hung");
        let _ = std::fs::remove_file(&path);
        // Accepts (the kernel does, via the backlog) but never answers: like a SIGSTOPped shim.
        let _listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let e = ShimClient::new(&path)
            .state(Duration::from_millis(200))
            .await
            .expect_err("hung");
        assert!(matches!(e, ShimError::DeadlineExceeded { .. }), "{e}");
        let _ = std::fs::remove_file(&path);
        let e = ShimClient::new(&path)
            .state(Duration::from_millis(200))
            .await
            .expect_err("missing");
        assert!(matches!(e, ShimError::Unavailable { .. }), "{e}");
    }
}
