//! WebSocket (RFC 6455) for the streaming server: the handshake's accept key (RustCrypto's
//! `sha1`, the `base64` crate) and messages over an upgraded connection (`tungstenite`).
//!
//! The HTTP upgrade itself is hyper's; tungstenite then speaks the frames: masked from the
//! client, unmasked from the server, fragments joined, pings answered, messages and frames
//! bounded in size. The callers see whole messages as (opcode, bytes).

use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use sha1::Digest as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// The GUID RFC 6455 appends to the client's key.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest message accepted (a frame announcing more is refused before it is read).
pub const MAX_MESSAGE: usize = 16 << 20;

pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Why a WebSocket connection failed.
#[derive(Debug, thiserror::Error)]
#[error("websocket: {0}")]
pub struct WsError(#[from] tokio_tungstenite::tungstenite::Error);

/// The `Sec-WebSocket-Accept` value for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let digest = sha1::Sha1::digest(format!("{}{GUID}", key.trim()).as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// Standard base64 with padding.
pub fn base64_encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Standard base64 that takes input with or without padding.
const PADDING_OPTIONAL: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Standard base64 (padding optional, line breaks ignored); None when malformed.
pub fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let clean: Vec<u8> = s
        .iter()
        .copied()
        .filter(|b| !matches!(b, b'\r' | b'\n'))
        .collect();
    PADDING_OPTIONAL.decode(clean).ok()
}

/// A complete message (a ping or pong carries no data: the connection answers pings itself).
#[derive(Debug)]
pub struct Message {
    pub opcode: u8,
    pub data: Bytes,
}

/// Reads messages; pings are answered by the connection itself.
pub struct Reader<T> {
    stream: SplitStream<WebSocketStream<T>>,
}

/// Writes messages (unmasked: server side).
pub struct Writer<T> {
    sink: SplitSink<WebSocketStream<T>, WsMessage>,
}

fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// The server's side of an upgraded connection.
pub async fn server<T>(io: T) -> (Reader<T>, Writer<T>)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config())).await;
    let (sink, stream) = ws.split();
    (Reader { stream }, Writer { sink })
}

impl<T: AsyncRead + AsyncWrite + Unpin> Reader<T> {
    /// The next message (text, binary, close, ping or pong); `Ok(None)` at the end of the
    /// connection.
    pub async fn next(&mut self) -> Result<Option<Message>, WsError> {
        loop {
            let m = match self.stream.next().await {
                None => return Ok(None),
                Some(Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed)) => {
                    return Ok(None);
                }
                Some(m) => m?,
            };
            let (opcode, data) = match m {
                WsMessage::Text(t) => (OP_TEXT, Bytes::from(t)),
                WsMessage::Binary(b) => (OP_BINARY, b),
                WsMessage::Close(_) => (OP_CLOSE, Bytes::new()),
                WsMessage::Ping(_) => (OP_PING, Bytes::new()),
                WsMessage::Pong(_) => (OP_PONG, Bytes::new()),
                WsMessage::Frame(_) => continue,
            };
            return Ok(Some(Message { opcode, data }));
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Writer<T> {
    /// Sends one text or binary message.
    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> Result<(), WsError> {
        let m = if opcode == OP_TEXT {
            match std::str::from_utf8(payload) {
                Ok(s) => WsMessage::text(s),
                Err(_) => WsMessage::binary(payload.to_vec()),
            }
        } else {
            WsMessage::binary(payload.to_vec())
        };
        Ok(self.sink.send(m).await?)
    }

    /// Sends a normal close (status 1000: Kubernetes' clients take a close without a status
    /// for an error) and shuts the connection down.
    pub async fn close(&mut self) {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
        let normal = WsMessage::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        }));
        let _ = self.sink.send(normal).await;
        let _ = self.sink.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_matches_rfc_6455_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn base64_round_trips_with_and_without_padding() {
        for s in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\x00\x10"] {
            let enc = base64_encode(s);
            assert_eq!(base64_decode(enc.as_bytes()).as_deref(), Some(s));
            assert_eq!(
                base64_decode(enc.trim_end_matches('=').as_bytes()).as_deref(),
                Some(s)
            );
        }
        assert!(base64_decode(b"a$b").is_none());
    }

    #[tokio::test]
    async fn a_frame_announcing_more_than_the_limit_is_refused_unread() {
        let (client, server_io) = tokio::io::duplex(1024);
        let (mut r, _w) = server(server_io).await;
        let mut client = client;
        // A masked binary frame announcing 4 GiB, with only its header sent.
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(4u64 << 30).to_be_bytes());
        head.extend_from_slice(&[1, 2, 3, 4]);
        tokio::io::AsyncWriteExt::write_all(&mut client, &head)
            .await
            .expect("write");
        assert!(r.next().await.is_err());
    }
}
