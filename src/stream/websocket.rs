//! WebSocket (RFC 6455) for the streaming server: the handshake key, and message framing.
//!
//! The server reads masked frames and writes unmasked ones; fragmented messages are joined;
//! pings are answered; a close frame ends the connection. `client` mode (masking) is there
//! for the tests and the SPDY-over-WebSocket tunnel needs none.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The GUID RFC 6455 appends to the client's key.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest message accepted.
const MAX_MESSAGE: usize = 16 << 20;

pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Why a WebSocket connection failed.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error("websocket: i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("websocket: protocol error: {0}")]
    Protocol(String),
}

/// SHA-1 (FIPS 180-4), needed only for the handshake's accept key.
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6u32),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Standard base64 (padding optional); None when malformed.
pub fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &ch in s {
        let v = match ch {
            b'A'..=b'Z' => ch - b'A',
            b'a'..=b'z' => ch - b'a' + 26,
            b'0'..=b'9' => ch - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b'\r' | b'\n' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The `Sec-WebSocket-Accept` value for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    base64_encode(&sha1(format!("{}{GUID}", key.trim()).as_bytes()))
}

/// One frame, unmasked on the wire when `mask` is None.
pub fn encode_frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 14);
    f.push(0x80 | opcode);
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n <= 0xffff => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    f
}

/// A complete message.
#[derive(Debug)]
pub struct Message {
    pub opcode: u8,
    pub data: Bytes,
}

/// Reads messages; answers pings through `pong` (frames to send back).
pub struct Reader<R> {
    r: R,
    /// A fragmented message being joined (control frames may come in between).
    partial: Option<(u8, BytesMut)>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(r: R) -> Self {
        Self { r, partial: None }
    }

    /// The next data message (text or binary), or a control message (close, ping, pong);
    /// `Ok(None)` at the end of the connection.
    pub async fn next(&mut self) -> Result<Option<Message>, WsError> {
        loop {
            let mut head = [0u8; 2];
            match self.r.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.r.read_exact(&mut b).await?;
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.r.read_exact(&mut b).await?;
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_MESSAGE)
                .ok_or_else(|| WsError::Protocol(format!("frame of {len} bytes")))?;
            let mut key = [0u8; 4];
            if masked {
                self.r.read_exact(&mut key).await?;
            }
            let mut data = BytesMut::zeroed(len);
            self.r.read_exact(&mut data).await?;
            if masked {
                for (i, b) in data.iter_mut().enumerate() {
                    *b ^= key[i % 4];
                }
            }
            if opcode >= 0x8 {
                return Ok(Some(Message {
                    opcode,
                    data: data.freeze(),
                }));
            }
            match (&mut self.partial, opcode) {
                (None, OP_CONT) => return Err(WsError::Protocol("stray continuation".into())),
                (None, op) => self.partial = Some((op, data)),
                (Some(_), OP_CONT) => {
                    if let Some((_, buf)) = &mut self.partial {
                        if buf.len() + data.len() > MAX_MESSAGE {
                            return Err(WsError::Protocol("message too large".into()));
                        }
                        buf.extend_from_slice(&data);
                    }
                }
                (Some(_), _) => return Err(WsError::Protocol("interleaved message".into())),
            }
            if fin && let Some((op, buf)) = self.partial.take() {
                return Ok(Some(Message {
                    opcode: op,
                    data: buf.freeze(),
                }));
            }
        }
    }
}

/// Writes frames (unmasked: server side).
pub struct Writer<W> {
    w: W,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(w: W) -> Self {
        Self { w }
    }

    pub async fn send(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        self.w
            .write_all(&encode_frame(opcode, payload, None))
            .await?;
        self.w.flush().await
    }

    pub async fn close(&mut self) {
        let _ = self.send(OP_CLOSE, &1000u16.to_be_bytes()).await;
        let _ = self.w.shutdown().await;
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
        assert_eq!(
            hex::encode(sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn base64_round_trips() {
        for s in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\x00\x10"] {
            assert_eq!(
                base64_decode(base64_encode(s).as_bytes()).as_deref(),
                Some(s)
            );
        }
        assert!(base64_decode(b"a$b").is_none());
    }

    #[tokio::test]
    async fn masked_fragments_join_into_one_message() {
        let mut wire = Vec::new();
        let mut f1 = encode_frame(OP_BINARY, b"hel", Some([1, 2, 3, 4]));
        f1[0] &= 0x7f; // not final
        wire.extend_from_slice(&f1);
        wire.extend_from_slice(&encode_frame(OP_PING, b"p", Some([9, 9, 9, 9])));
        wire.extend_from_slice(&encode_frame(OP_CONT, b"lo", Some([5, 6, 7, 8])));
        let big = vec![7u8; 70_000];
        wire.extend_from_slice(&encode_frame(OP_TEXT, &big, None));
        let mut r = Reader::new(wire.as_slice());
        let m = r.next().await.expect("ping").expect("msg");
        assert_eq!((m.opcode, &m.data[..]), (OP_PING, &b"p"[..]));
        let m = r.next().await.expect("read").expect("msg");
        assert_eq!((m.opcode, &m.data[..]), (OP_BINARY, &b"hello"[..]));
        let m = r.next().await.expect("read").expect("msg");
        assert_eq!((m.opcode, m.data.len()), (OP_TEXT, 70_000));
        assert!(r.next().await.expect("eof").is_none());
    }
}
