//! SPDY/3.1 framing and a server-side session (streams opened by the client, as Kubernetes uses it).
//!
//! Only what the Kubernetes streaming protocols use: SYN_STREAM from the client, SYN_REPLY,
//! DATA with FIN, RST_STREAM, PING and GOAWAY. Header blocks are zlib-compressed with the
//! dictionary from the SPDY/3 specification (one compression context per direction). Flow
//! control (WINDOW_UPDATE, SETTINGS) is not enforced: the Kubernetes clients do not use it.

use std::collections::HashMap;

use bytes::{Buf, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The protocol version carried in control frames.
const VERSION: u16 = 3;
/// Control frame types.
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
/// Frame flag: the sender's last frame on the stream.
pub const FLAG_FIN: u8 = 0x01;
/// Largest frame payload accepted (a 24-bit length allows 16 MiB; Kubernetes sends 32 KiB).
const MAX_PAYLOAD: usize = 1 << 20;
/// Largest payload of the DATA frames we send.
const DATA_CHUNK: usize = 32 * 1024;
/// Largest decompressed header block accepted.
const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// RST_STREAM status codes.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_CANCEL: u32 = 5;

/// Why a SPDY session failed.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy: i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("spdy: protocol error: {0}")]
    Protocol(String),
    #[error("spdy: header compression: {0}")]
    Compression(String),
}

/// Header words of the SPDY/3 compression dictionary (specification §2.6.10.1), each stored
/// with a 4-byte big-endian length in front.
const DICT_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail: status codes, reason phrases, dates and common values, unprefixed.
const DICT_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information",
    "204 No Content",
    "301 Moved Permanently",
    "400 Bad Request",
    "401 Unauthorized",
    "403 Forbidden",
    "404 Not Found",
    "500 Internal Server Error",
    "501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
    "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0."
);

/// The SPDY/3 header compression dictionary.
pub fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1424);
    for w in DICT_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICT_TAIL.as_bytes());
    d
}

/// Header names and values of one block (names lower-case; a value may hold several,
/// NUL-separated).
pub type Headers = Vec<(String, String)>;

/// Encodes a header block (uncompressed).
fn encode_headers(headers: &[(String, String)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (k, v) in headers {
        b.extend_from_slice(&(k.len() as u32).to_be_bytes());
        b.extend_from_slice(k.to_ascii_lowercase().as_bytes());
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

/// Decodes an uncompressed header block.
fn decode_headers(mut b: &[u8]) -> Result<Headers, SpdyError> {
    let bad = || SpdyError::Protocol("truncated header block".into());
    let take = |b: &mut &[u8]| -> Result<String, SpdyError> {
        if b.len() < 4 {
            return Err(bad());
        }
        let n = b.get_u32() as usize;
        if b.len() < n {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.len() < 4 {
        return Err(bad());
    }
    let count = b.get_u32() as usize;
    if count > 1024 {
        return Err(SpdyError::Protocol(format!("{count} headers")));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let k = take(&mut b)?;
        let v = take(&mut b)?;
        out.push((k.to_ascii_lowercase(), v));
    }
    Ok(out)
}

/// One direction's header compression context.
pub struct HeaderCompressor {
    z: Compress,
}

impl Default for HeaderCompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderCompressor {
    pub fn new() -> Self {
        let mut z = Compress::new(Compression::default(), true);
        // Cannot fail on a fresh stream.
        let _ = z.set_dictionary(&dictionary());
        Self { z }
    }

    /// Compresses one header block (sync-flushed, so the peer can decode it at once).
    pub fn compress(&mut self, headers: &[(String, String)]) -> Result<Vec<u8>, SpdyError> {
        let input = encode_headers(headers);
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut consumed = 0usize;
        loop {
            out.reserve(256);
            let before_in = self.z.total_in();
            self.z
                .compress_vec(&input[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            consumed += (self.z.total_in() - before_in) as usize;
            // Done once all input is in and the flush left spare room in the output.
            if consumed >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// One direction's header decompression context.
pub struct HeaderDecompressor {
    z: Decompress,
}

impl Default for HeaderDecompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDecompressor {
    pub fn new() -> Self {
        Self {
            z: Decompress::new(true),
        }
    }

    /// Decompresses one header block.
    pub fn decompress(&mut self, input: &[u8]) -> Result<Headers, SpdyError> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut consumed = 0usize;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(SpdyError::Protocol("header block too large".into()));
                }
                out.reserve(out.len().max(256));
            }
            let before_in = self.z.total_in();
            let before_out = out.len();
            match self
                .z
                .decompress_vec(&input[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(status) => {
                    consumed += (self.z.total_in() - before_in) as usize;
                    if status == Status::StreamEnd {
                        break;
                    }
                    let progressed = out.len() > before_out || self.z.total_in() > before_in;
                    if consumed >= input.len() && out.len() < out.capacity() {
                        break;
                    }
                    if !progressed && out.len() < out.capacity() {
                        break;
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    consumed += (self.z.total_in() - before_in) as usize;
                    self.z
                        .set_dictionary(&dictionary())
                        .map_err(|e| SpdyError::Compression(e.to_string()))?;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
        }
        decode_headers(&out)
    }
}

/// A frame as read off the wire.
#[derive(Debug)]
pub enum Frame {
    Data {
        stream: u32,
        flags: u8,
        data: Bytes,
    },
    Control {
        kind: u16,
        flags: u8,
        payload: Bytes,
    },
}

/// Reads one frame; `Ok(None)` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(SpdyError::Protocol(format!("frame of {len} bytes")));
    }
    let mut payload = BytesMut::zeroed(len);
    r.read_exact(&mut payload).await?;
    let payload = payload.freeze();
    if head[0] & 0x80 != 0 {
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(SpdyError::Protocol(format!("SPDY version {version}")));
        }
        Ok(Some(Frame::Control {
            kind: u16::from_be_bytes([head[2], head[3]]),
            flags,
            payload,
        }))
    } else {
        let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
        Ok(Some(Frame::Data {
            stream,
            flags,
            data: payload,
        }))
    }
}

fn control_frame(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    let len = (payload.len() as u32).to_be_bytes();
    f.push(flags);
    f.extend_from_slice(&len[1..]);
    f.extend_from_slice(payload);
    f
}

/// Encodes a DATA frame.
pub fn data_frame(stream: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + data.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    let len = (data.len() as u32).to_be_bytes();
    f.push(flags);
    f.extend_from_slice(&len[1..]);
    f.extend_from_slice(data);
    f
}

/// Encodes a SYN_STREAM frame (used by clients: the tests).
pub fn syn_stream_frame(
    z: &mut HeaderCompressor,
    stream: u32,
    flags: u8,
    headers: &[(String, String)],
) -> Result<Vec<u8>, SpdyError> {
    let block = z.compress(headers)?;
    let mut p = Vec::with_capacity(10 + block.len());
    p.extend_from_slice(&stream.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&block);
    Ok(control_frame(SYN_STREAM, flags, &p))
}

/// Encodes a SYN_REPLY frame.
pub fn syn_reply_frame(
    z: &mut HeaderCompressor,
    stream: u32,
    headers: &[(String, String)],
) -> Result<Vec<u8>, SpdyError> {
    let block = z.compress(headers)?;
    let mut p = Vec::with_capacity(4 + block.len());
    p.extend_from_slice(&stream.to_be_bytes());
    p.extend_from_slice(&block);
    Ok(control_frame(SYN_REPLY, 0, &p))
}

/// Encodes a RST_STREAM frame.
pub fn rst_frame(stream: u32, status: u32) -> Vec<u8> {
    let mut p = stream.to_be_bytes().to_vec();
    p.extend_from_slice(&status.to_be_bytes());
    control_frame(RST_STREAM, 0, &p)
}

/// Encodes a GOAWAY frame.
fn goaway_frame(last: u32) -> Vec<u8> {
    let mut p = last.to_be_bytes().to_vec();
    p.extend_from_slice(&0u32.to_be_bytes());
    control_frame(GOAWAY, 0, &p)
}

/// Parses a SYN_STREAM or SYN_REPLY payload: stream id and header block.
pub fn parse_syn(
    z: &mut HeaderDecompressor,
    kind: u16,
    payload: &[u8],
) -> Result<(u32, Headers), SpdyError> {
    let skip = if kind == SYN_STREAM { 10 } else { 4 };
    if payload.len() < skip {
        return Err(SpdyError::Protocol("short SYN frame".into()));
    }
    let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
    Ok((id, z.decompress(&payload[skip..])?))
}

/// What the session writer sends.
enum Out {
    Reply(u32),
    Data(u32, Bytes, bool),
    Reset(u32, u32),
    Raw(Vec<u8>),
    /// Flush and close the connection.
    Shutdown,
}

/// A stream the client opened.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    /// Data from the client; closed at its FIN (or reset, or the end of the connection).
    pub rx: mpsc::Receiver<Bytes>,
    pub tx: StreamWriter,
}

impl Stream {
    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// The value of header `name` in `headers` (case-insensitive).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Writes to one stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Out>,
}

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends data; false once the connection is gone.
    pub async fn write(&self, data: &[u8]) -> bool {
        for chunk in data.chunks(DATA_CHUNK) {
            if self
                .out
                .send(Out::Data(self.id, Bytes::copy_from_slice(chunk), false))
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Sends owned data without copying when it fits in one frame.
    pub async fn write_bytes(&self, data: Bytes) -> bool {
        if data.len() > DATA_CHUNK {
            return self.write(&data).await;
        }
        self.out.send(Out::Data(self.id, data, false)).await.is_ok()
    }

    /// Half-closes the stream (FIN).
    pub async fn close(&self) {
        let _ = self.out.send(Out::Data(self.id, Bytes::new(), true)).await;
    }

    /// Resets the stream.
    pub async fn reset(&self, status: u32) {
        let _ = self.out.send(Out::Reset(self.id, status)).await;
    }
}

/// Server side of a SPDY connection: yields the streams the client opens. Dropping every
/// `Stream`, writer and the `Session` ends the connection.
pub struct Session {
    pub streams: mpsc::Receiver<Stream>,
    /// Becomes true when the client's side of the connection ended.
    pub closed: tokio::sync::watch::Receiver<bool>,
    out: mpsc::Sender<Out>,
    reader: tokio::task::JoinHandle<()>,
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl Session {
    /// Starts the reader and writer tasks over `io`; both bump `activity`.
    pub fn start<T>(io: T, activity: super::Activity) -> Session
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel::<Out>(64);
        let (streams_tx, streams_rx) = mpsc::channel::<Stream>(16);
        let (closed_tx, closed_rx) = tokio::sync::watch::channel(false);
        let writer = tokio::spawn(write_loop(wr, out_rx, activity.clone()));
        let out = out_tx.clone();
        let reader = tokio::spawn(async move {
            read_loop(rd, out, streams_tx, activity).await;
            let _ = closed_tx.send(true);
        });
        Session {
            streams: streams_rx,
            closed: closed_rx,
            out: out_tx,
            reader,
            writer: Some(writer),
        }
    }

    /// Tells the client no more streams are accepted, flushes what is queued and closes the
    /// connection (waiting at most 5 s for a slow client).
    pub async fn finish(mut self) {
        let _ = self.out.send(Out::Raw(goaway_frame(0))).await;
        let _ = self.out.send(Out::Shutdown).await;
        if let Some(w) = self.writer.take() {
            let abort = w.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(5), w)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(w) = &self.writer {
            w.abort();
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Out>,
    activity: super::Activity,
) {
    let mut z = HeaderCompressor::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        buf.clear();
        let mut next = Some(first);
        // Batch what is queued into one write.
        while let Some(o) = next.take() {
            match o {
                Out::Reply(id) => match syn_reply_frame(&mut z, id, &[]) {
                    Ok(f) => buf.extend_from_slice(&f),
                    Err(e) => {
                        tracing::warn!(error = %e, "spdy reply");
                        return;
                    }
                },
                Out::Data(id, data, fin) => {
                    let flags = if fin { FLAG_FIN } else { 0 };
                    buf.extend_from_slice(&data_frame(id, flags, &data));
                }
                Out::Reset(id, status) => buf.extend_from_slice(&rst_frame(id, status)),
                Out::Raw(f) => buf.extend_from_slice(&f),
                Out::Shutdown => {
                    let _ = wr.write_all(&buf).await;
                    let _ = wr.shutdown().await;
                    return;
                }
            }
            if buf.len() < 256 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            return;
        }
        activity.touch();
    }
    let _ = wr.shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    out: mpsc::Sender<Out>,
    streams: mpsc::Sender<Stream>,
    activity: super::Activity,
) {
    let mut z = HeaderDecompressor::new();
    let mut open: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    loop {
        let frame = match read_frame(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "spdy connection ends");
                return;
            }
        };
        activity.touch();
        match frame {
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                if let Some(tx) = open.get(&stream) {
                    // A handler that stopped reading loses the data, not the connection.
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        open.remove(&stream);
                    }
                }
                if flags & FLAG_FIN != 0 {
                    open.remove(&stream);
                }
            }
            Frame::Control {
                kind: SYN_STREAM,
                flags,
                payload,
            } => {
                let (id, headers) = match parse_syn(&mut z, SYN_STREAM, &payload) {
                    Ok(v) => v,
                    Err(e) => {
                        // The compression context is now out of step: the session is over.
                        tracing::debug!(error = %e, "spdy SYN_STREAM");
                        return;
                    }
                };
                let (tx, rx) = mpsc::channel(32);
                if flags & FLAG_FIN == 0 {
                    open.insert(id, tx);
                }
                if out.send(Out::Reply(id)).await.is_err() {
                    return;
                }
                let stream = Stream {
                    id,
                    headers,
                    rx,
                    tx: StreamWriter {
                        id,
                        out: out.clone(),
                    },
                };
                if streams.send(stream).await.is_err() {
                    let _ = out.send(Out::Reset(id, RST_CANCEL)).await;
                }
            }
            Frame::Control {
                kind: RST_STREAM,
                payload,
                ..
            } => {
                if payload.len() >= 4 {
                    let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                        & 0x7fff_ffff;
                    open.remove(&id);
                }
            }
            Frame::Control {
                kind: PING,
                payload,
                ..
            } => {
                let _ = out
                    .send(Out::Raw(control_frame(
                        PING,
                        0,
                        &payload[..payload.len().min(4)],
                    )))
                    .await;
            }
            Frame::Control { kind: GOAWAY, .. } => return,
            // SETTINGS, WINDOW_UPDATE, HEADERS and anything newer: nothing to do.
            Frame::Control { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_matches_the_specification() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Adler-32 of the SPDY/3 dictionary, as zlib stream headers carry it.
        let (mut a, mut b) = (1u32, 0u32);
        for &x in &d {
            a = (a + x as u32) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_round_trip_across_several_frames() {
        let mut c = HeaderCompressor::new();
        let mut d = HeaderDecompressor::new();
        for i in 0..5 {
            let h = vec![
                ("streamType".to_string(), "stdout".to_string()),
                ("port".to_string(), format!("{}", 8000 + i)),
            ];
            let block = c.compress(&h).expect("compress");
            let got = d.decompress(&block).expect("decompress");
            assert_eq!(got[0], ("streamtype".to_string(), "stdout".to_string()));
            assert_eq!(got[1].1, format!("{}", 8000 + i));
        }
    }

    #[test]
    fn bad_header_blocks_are_errors_not_panics() {
        let mut d = HeaderDecompressor::new();
        assert!(d.decompress(b"\x78\xbb garbage").is_err());
        assert!(decode_headers(b"\0\0\0\x05\0\0").is_err());
        assert!(decode_headers(b"\0\0\0\x01\0\0\0\x09ab").is_err());
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let mut c = HeaderCompressor::new();
        let h = vec![("streamtype".to_string(), "error".to_string())];
        let mut wire = syn_stream_frame(&mut c, 1, 0, &h).expect("syn");
        wire.extend_from_slice(&data_frame(1, FLAG_FIN, b"hello"));
        let mut r = wire.as_slice();
        let mut d = HeaderDecompressor::new();
        match read_frame(&mut r).await.expect("read") {
            Some(Frame::Control { kind, payload, .. }) => {
                let (id, got) = parse_syn(&mut d, kind, &payload).expect("parse");
                assert_eq!((id, got), (1, h));
            }
            other => panic!("{other:?}"),
        }
        match read_frame(&mut r).await.expect("read") {
            Some(Frame::Data {
                stream,
                flags,
                data,
            }) => assert_eq!((stream, flags, &data[..]), (1, FLAG_FIN, &b"hello"[..])),
            other => panic!("{other:?}"),
        }
        assert!(read_frame(&mut r).await.expect("eof").is_none());
    }
}
