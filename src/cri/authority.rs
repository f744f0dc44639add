//! An HTTP/2 front layer for the CRI socket that drops an `:authority` the `h2` server refuses.
//!
//! gRPC clients on a unix socket (grpc-go before 1.52, so every kubelet before 1.26, and
//! grpc-java, grpc-python) send the socket's path as `:authority`. `h2` answers a request whose
//! `:authority` is no valid URI authority with RST_STREAM PROTOCOL_ERROR before the request
//! reaches Berth. On a unix socket the authority routes nothing, so this layer sits between the
//! socket and `h2` and rewrites the client's byte stream: every header block (HEADERS plus its
//! CONTINUATIONs) is decoded with the client's HPACK context and encoded again as literals that
//! never touch `h2`'s dynamic table, without an `:authority` that does not parse. Every other
//! frame passes through unchanged, and the server's direction is not touched at all.
//!
//! A client sends the same `:authority` on every request of a connection (it belongs to the
//! channel), so the first header block decides: when its `:authority` parses (or there is
//! none), that block and everything after it pass through untouched, and `h2` decodes exactly
//! what the client encoded; only a connection whose first request needed the rewrite is
//! rewritten from then on.
//!
//! What this layer cannot make sense of it leaves to `h2`: a frame-level error (padding longer
//! than the frame, a CONTINUATION missing) is passed through as it came, and a header block
//! that does not decode is replaced by one that does not decode for `h2` either, so the client
//! gets the GOAWAY it would have got; from then on the connection passes through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Length of the client connection preface (`PRI * HTTP/2.0...`).
const PREFACE_LEN: usize = 24;
/// Length of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_PUSH_PROMISE: u8 = 0x5;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Length of the priority fields of a HEADERS frame with the PRIORITY flag.
const PRIORITY_LEN: usize = 5;
/// Largest frame payload written: the initial SETTINGS_MAX_FRAME_SIZE, which every peer accepts.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The HPACK table size the server allows its clients (the initial SETTINGS_HEADER_TABLE_SIZE,
/// which Berth's server keeps).
const HEADER_TABLE_SIZE: usize = 4096;
/// Largest header block gathered (all its frames); a larger one is refused as undecodable.
const MAX_BLOCK: usize = 1 << 20;
/// The block sent to `h2` in place of one that does not decode: HPACK index 0 is invalid, so
/// `h2` ends the connection (GOAWAY) as it would have for the original block.
const UNDECODABLE_BLOCK: [u8; 1] = [0x80];
/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// The header of one frame.
#[derive(Clone, Copy, Debug)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(b: &[u8]) -> FrameHeader {
        FrameHeader {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    fn write(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
        let len = len.to_be_bytes();
        out.extend_from_slice(&len[len.len() - 3..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
    }
}

/// Where the rewriter is in the client's byte stream.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Passing the connection preface; this many bytes of it are left.
    Preface(usize),
    /// Waiting for a frame header.
    Header,
    /// Passing a frame's payload through; this many bytes are left.
    Payload(usize),
    /// Waiting for the whole of a HEADERS or CONTINUATION frame.
    BlockFrame(FrameHeader),
    /// Passing everything through unchanged (after an error left to `h2`, or once the first
    /// request showed an `:authority` that `h2` accepts).
    Opaque,
}

/// What the HEADERS frame that opens a header block says about it.
#[derive(Clone, Copy, Debug)]
struct BlockHead {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
}

/// A header block being gathered across HEADERS and CONTINUATION frames.
struct PendingBlock {
    head: BlockHead,
    fragment: Vec<u8>,
    /// The frames as they came, passed on unchanged if the block turns out malformed.
    raw: Vec<u8>,
}

/// The client-to-server stream rewriter: bytes in as the client sent them, bytes out as `h2`
/// accepts them.
pub(crate) struct Rewriter {
    decoder: Decoder<'static>,
    state: State,
    block: Option<PendingBlock>,
    /// Authorities dropped so far (for the log line when the connection ends).
    dropped: u64,
    /// The first header block needed the rewrite: every later one is rewritten too.
    rewriting: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Rewriter {
            decoder,
            state: State::Preface(PREFACE_LEN),
            block: None,
            dropped: 0,
            rewriting: false,
        }
    }
}

impl Rewriter {
    /// Consumes what it can of `input` and appends the rewritten bytes to `out`; what stays in
    /// `input` is an incomplete frame.
    pub(crate) fn process(&mut self, input: &mut BytesMut, out: &mut BytesMut) {
        loop {
            match self.state {
                State::Opaque => {
                    out.extend_from_slice(input);
                    input.clear();
                    return;
                }
                State::Preface(left) | State::Payload(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input.advance(n);
                    if n < left {
                        self.state = match self.state {
                            State::Preface(_) => State::Preface(left - n),
                            _ => State::Payload(left - n),
                        };
                        return;
                    }
                    self.state = State::Header;
                }
                State::Header => {
                    if input.len() < FRAME_HEADER_LEN {
                        return;
                    }
                    let header = FrameHeader::parse(&input[..FRAME_HEADER_LEN]);
                    let continues = self.block.as_ref().map(|b| {
                        header.kind == TYPE_CONTINUATION && header.stream == b.head.stream
                    });
                    match (continues, header.kind) {
                        // A frame other than the CONTINUATION the open block needs: `h2`
                        // refuses the sequence itself.
                        (Some(false), _) | (None, TYPE_PUSH_PROMISE) => self.give_up(out),
                        (Some(true), _) | (None, TYPE_HEADERS) => {
                            let gathered = self.block.as_ref().map_or(0, |b| b.raw.len());
                            if gathered + FRAME_HEADER_LEN + header.len > MAX_BLOCK {
                                self.undecodable(header.stream, out);
                            } else {
                                self.state = State::BlockFrame(header);
                            }
                        }
                        (None, _) => {
                            out.extend_from_slice(&input[..FRAME_HEADER_LEN]);
                            input.advance(FRAME_HEADER_LEN);
                            self.state = State::Payload(header.len);
                        }
                    }
                }
                State::BlockFrame(header) => {
                    if input.len() < FRAME_HEADER_LEN + header.len {
                        return;
                    }
                    let frame = input.split_to(FRAME_HEADER_LEN + header.len);
                    self.state = State::Header;
                    self.on_block_frame(header, &frame, out);
                }
            }
        }
    }

    /// Takes one HEADERS or CONTINUATION frame (header included) of a block.
    fn on_block_frame(&mut self, header: FrameHeader, frame: &[u8], out: &mut BytesMut) {
        let payload = &frame[FRAME_HEADER_LEN..];
        let end = header.flags & FLAG_END_HEADERS != 0;
        if let Some(mut block) = self.block.take() {
            block.fragment.extend_from_slice(payload);
            block.raw.extend_from_slice(frame);
            if end {
                self.finish_block(block.head, &block.fragment, &block.raw, out);
            } else {
                self.block = Some(block);
            }
            return;
        }
        let Some((priority, fragment)) = split_headers_payload(header.flags, payload) else {
            // Padding or priority longer than the frame: `h2` refuses the frame.
            out.extend_from_slice(frame);
            self.state = State::Opaque;
            return;
        };
        let head = BlockHead {
            stream: header.stream,
            end_stream: header.flags & FLAG_END_STREAM != 0,
            priority,
        };
        if end {
            // The usual case, a whole block in one HEADERS frame: decoded where it lies.
            self.finish_block(head, fragment, frame, out);
        } else {
            self.block = Some(PendingBlock {
                head,
                fragment: fragment.to_vec(),
                raw: frame.to_vec(),
            });
        }
    }

    /// Decodes a whole block (`raw`: its frames as they came) and writes it again without an
    /// unparsable `:authority`; the connection's first block, when it needs no change, is
    /// passed on as it came and the rest of the connection with it.
    fn finish_block(&mut self, head: BlockHead, fragment: &[u8], raw: &[u8], out: &mut BytesMut) {
        let mut encoded = Vec::with_capacity(fragment.len() + 64);
        let mut dropped = false;
        let decoded = self.decoder.decode_with_cb(fragment, |name, value| {
            if &name[..] == b":authority" && http::uri::Authority::try_from(&value[..]).is_err() {
                dropped = true;
                return;
            }
            encode_literal(&mut encoded, &name, &value);
        });
        match decoded {
            Ok(()) if !dropped && !self.rewriting => {
                out.extend_from_slice(raw);
                self.state = State::Opaque;
            }
            Ok(()) => {
                if dropped {
                    self.dropped += 1;
                    self.rewriting = true;
                    tracing::trace!(stream = head.stream, "dropped an unparsable :authority");
                }
                write_block(out, &head, &encoded);
            }
            Err(e) => {
                tracing::debug!(stream = head.stream, error = %e, "undecodable header block");
                self.undecodable(head.stream, out);
            }
        }
    }

    /// Hands the frames gathered so far to `h2` as they came and stops rewriting.
    fn give_up(&mut self, out: &mut BytesMut) {
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        self.state = State::Opaque;
    }

    /// Sends `h2` a header block it cannot decode on `stream` and stops rewriting.
    fn undecodable(&mut self, stream: u32, out: &mut BytesMut) {
        self.block = None;
        FrameHeader::write(
            out,
            UNDECODABLE_BLOCK.len(),
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            stream,
        );
        out.extend_from_slice(&UNDECODABLE_BLOCK);
        self.state = State::Opaque;
    }
}

/// Splits a HEADERS payload into its priority fields and header block fragment, without the
/// padding; None when the flags claim more than the payload holds.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; PRIORITY_LEN]>, &[u8])> {
    let mut rest = payload;
    if flags & FLAG_PADDED != 0 {
        let (&pad, after) = rest.split_first()?;
        rest = after.get(..after.len().checked_sub(usize::from(pad))?)?;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let fields = rest.get(..PRIORITY_LEN)?;
        let mut p = [0; PRIORITY_LEN];
        p.copy_from_slice(fields);
        priority = Some(p);
        rest = &rest[PRIORITY_LEN..];
    }
    Some((priority, rest))
}

/// Appends one field as a literal without indexing, with a literal name (RFC 7541 6.2.2).
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    encode_string(out, name);
    encode_string(out, value);
}

/// Appends an HPACK string literal without Huffman coding (RFC 7541 5.2).
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    // Writing into a Vec cannot fail.
    let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

/// Writes an encoded block as a HEADERS frame and as many CONTINUATION frames as it needs.
fn write_block(out: &mut BytesMut, block: &BlockHead, encoded: &[u8]) {
    let priority = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
    let first_len = encoded.len().min(MAX_FRAME_PAYLOAD - priority.len());
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    let len = priority.len() + first.len();
    FrameHeader::write(out, len, TYPE_HEADERS, flags, block.stream);
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME_PAYLOAD));
        rest = after;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        FrameHeader::write(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

/// A connection whose reads (the client's bytes) go through a [`Rewriter`]; writes pass as
/// they are.
pub struct AuthorityFilter<S> {
    inner: S,
    rewriter: Rewriter,
    /// Bytes read from the client, not yet rewritten (an incomplete frame).
    raw: BytesMut,
    /// Rewritten bytes not yet read by the server.
    ready: BytesMut,
    eof: bool,
}

impl<S> AuthorityFilter<S> {
    /// Wraps a freshly accepted connection (before the client preface).
    pub fn new(inner: S) -> Self {
        AuthorityFilter {
            inner,
            rewriter: Rewriter::default(),
            raw: BytesMut::new(),
            ready: BytesMut::new(),
            eof: false,
        }
    }
}

impl<S> Drop for AuthorityFilter<S> {
    fn drop(&mut self) {
        if self.rewriter.dropped > 0 {
            tracing::debug!(
                requests = self.rewriter.dropped,
                "connection sent a socket path as :authority; dropped it"
            );
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFilter<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            this.raw.reserve(READ_CHUNK);
            let n =
                match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.raw) {
                    Poll::Ready(Ok(n)) => n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
            if n == 0 {
                // The client went away mid-frame: `h2` sees the same truncated frame.
                this.eof = true;
                let rest = this.raw.split();
                this.ready.extend_from_slice(&rest);
                continue;
            }
            this.rewriter.process(&mut this.raw, &mut this.ready);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFilter<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        FrameHeader::write(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    /// Literal with incremental indexing, literal name (adds the field to the dynamic table).
    fn indexed_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        out.push(0x40);
        encode_string(out, name);
        encode_string(out, value);
    }

    /// Splits what the rewriter wrote into frames.
    fn frames(mut b: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            let h = FrameHeader::parse(&b[..FRAME_HEADER_LEN]);
            v.push((h, b[FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.len].to_vec()));
            b = &b[FRAME_HEADER_LEN + h.len..];
        }
        v
    }

    /// Decodes the header blocks of the rewritten stream with a fresh decoder, as `h2` would;
    /// checks that the rewritten blocks add nothing to the server's dynamic table.
    /// A decoded header list: (name, value) pairs.
    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn decode_blocks(out: &[u8]) -> Vec<(u32, Fields)> {
        assert_eq!(&out[..PREFACE_LEN], PREFACE);
        let mut decoder = Decoder::new();
        let mut blocks = Vec::new();
        let mut current: Option<(u32, Vec<u8>)> = None;
        for (h, payload) in frames(&out[PREFACE_LEN..]) {
            let fragment = match h.kind {
                TYPE_HEADERS => {
                    assert!(current.is_none());
                    split_headers_payload(h.flags, &payload)
                        .expect("valid")
                        .1
                        .to_vec()
                }
                TYPE_CONTINUATION => payload,
                _ => continue,
            };
            let (_, buf) = current.get_or_insert((h.stream, Vec::new()));
            buf.extend_from_slice(&fragment);
            if h.flags & FLAG_END_HEADERS != 0 {
                let (stream, buf) = current.take().expect("block");
                let fields = decoder.decode(&buf).expect("rewritten block decodes");
                assert!(
                    !buf.is_empty() && buf[0] & 0xc0 != 0x40,
                    "rewritten fields never index"
                );
                blocks.push((stream, fields));
            }
        }
        blocks
    }

    fn request_fields(authority: &[u8]) -> Fields {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/runtime.v1alpha2.RuntimeService/Version".to_vec(),
            ),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn without_authority(f: &[(Vec<u8>, Vec<u8>)]) -> Fields {
        f.iter()
            .filter(|(n, _)| n != b":authority")
            .cloned()
            .collect()
    }

    fn rewrite_all(input: &[u8]) -> Vec<u8> {
        let mut r = Rewriter::default();
        let mut inp = BytesMut::from(input);
        let mut out = BytesMut::new();
        r.process(&mut inp, &mut out);
        assert!(inp.is_empty(), "whole frames are all consumed");
        out.to_vec()
    }

    /// A socket path as `:authority`, first as a literal that indexes it, then as a reference
    /// to that dynamic-table entry: both blocks lose it, and nothing else changes.
    #[test]
    fn socket_path_authority_is_dropped_literal_and_indexed() {
        let fields = request_fields(b"/run/berth/berth.sock");
        let mut first = Vec::new();
        for (n, v) in &fields {
            indexed_literal(&mut first, n, v);
        }
        // The second request refers to the six entries the first added (62 = newest).
        let second: Vec<u8> = (62..68).rev().map(|i| 0x80 | i as u8).collect();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &second));
        let out = rewrite_all(&input);
        let blocks = decode_blocks(&out);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0], (1, without_authority(&fields)));
        assert_eq!(blocks[1], (3, without_authority(&fields)));
        // SETTINGS and DATA pass unchanged, in order.
        let kinds: Vec<u8> = frames(&out[PREFACE_LEN..])
            .iter()
            .map(|(h, _)| h.kind)
            .collect();
        assert_eq!(kinds, vec![0x4, TYPE_HEADERS, 0x0, TYPE_HEADERS]);
        let data = &frames(&out[PREFACE_LEN..])[2];
        assert_eq!(
            (data.0.flags, &data.1[..]),
            (FLAG_END_STREAM, &[0u8; 5][..])
        );
    }

    #[test]
    fn valid_authority_is_kept() {
        let fields = request_fields(b"localhost:1234");
        let mut block = Vec::new();
        for (n, v) in &fields {
            encode_literal(&mut block, n, v);
        }
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &block,
        ));
        let out = rewrite_all(&input);
        assert_eq!(decode_blocks(&out), vec![(1, fields)]);
        let (h, _) = &frames(&out[PREFACE_LEN..])[0];
        assert_eq!(h.flags & FLAG_END_STREAM, FLAG_END_STREAM);
    }

    #[test]
    fn a_connection_whose_first_authority_parses_passes_through_untouched() {
        // Indexed (so the client's dynamic table matters), then a later block with another
        // authority: all of it reaches h2 byte for byte.
        let mut first = Vec::new();
        for (n, v) in &request_fields(b"localhost") {
            indexed_literal(&mut first, n, v);
        }
        let mut later = Vec::new();
        for (n, v) in &request_fields(b"/run/berth/berth.sock") {
            encode_literal(&mut later, n, v);
        }
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &first));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"body"));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &later));
        assert_eq!(rewrite_all(&input), input);
        // Whereas a connection that starts with a socket path is rewritten throughout.
        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &later));
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &first));
        let out = rewrite_all(&input);
        assert_ne!(out, input);
        let blocks = decode_blocks(&out);
        assert_eq!(blocks[0].1, without_authority(&request_fields(b"x")));
        assert_eq!(blocks[1].1, request_fields(b"localhost"));
    }

    /// Padding, priority and CONTINUATION frames, fed one byte at a time: the same result as
    /// all at once, priority kept, padding gone.
    #[test]
    fn padded_prioritised_continued_block_byte_by_byte() {
        let fields = request_fields(b"/var/run/x.sock");
        let mut block = Vec::new();
        for (n, v) in &fields {
            indexed_literal(&mut block, n, v);
        }
        let (a, b) = block.split_at(10);
        let mut payload = vec![3u8];
        payload.extend_from_slice(&[0x80, 0, 0, 1, 16]);
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY,
            5,
            &payload,
        ));
        input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, b));
        let whole = rewrite_all(&input);

        let mut r = Rewriter::default();
        let mut out = BytesMut::new();
        let mut pending = BytesMut::new();
        for byte in &input {
            pending.extend_from_slice(&[*byte]);
            r.process(&mut pending, &mut out);
        }
        assert_eq!(out.to_vec(), whole);
        assert_eq!(decode_blocks(&whole), vec![(5, without_authority(&fields))]);
        let (h, p) = &frames(&whole[PREFACE_LEN..])[0];
        assert_eq!(h.flags & (FLAG_PRIORITY | FLAG_PADDED), FLAG_PRIORITY);
        assert_eq!(&p[..PRIORITY_LEN], &[0x80, 0, 0, 1, 16]);
    }

    /// A block too long for one frame once re-encoded goes out as HEADERS plus CONTINUATIONs.
    #[test]
    fn long_block_is_split_into_continuations() {
        let mut fields = request_fields(b"/run/berth/berth.sock");
        fields.push((b"x-long".to_vec(), vec![b'a'; 40_000]));
        let mut block = Vec::new();
        for (n, v) in &fields {
            encode_literal(&mut block, n, v);
        }
        let mut input = PREFACE.to_vec();
        for (i, chunk) in block.chunks(MAX_FRAME_PAYLOAD).enumerate() {
            let last = (i + 1) * MAX_FRAME_PAYLOAD >= block.len();
            let kind = if i == 0 {
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            input.extend(frame(
                kind,
                if last { FLAG_END_HEADERS } else { 0 },
                1,
                chunk,
            ));
        }
        let out = rewrite_all(&input);
        let fs = frames(&out[PREFACE_LEN..]);
        assert_eq!(fs.len(), 3);
        assert!(fs.iter().all(|(h, _)| h.len <= MAX_FRAME_PAYLOAD));
        assert_eq!(decode_blocks(&out), vec![(1, without_authority(&fields))]);
    }

    /// A block that does not decode becomes one `h2` cannot decode either; the rest passes.
    #[test]
    fn undecodable_block_is_left_to_h2() {
        let mut input = PREFACE.to_vec();
        // Index 200 is in neither table.
        input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0xff, 0x49]));
        let tail = frame(0x0, 0, 1, b"abc");
        input.extend(&tail);
        let out = rewrite_all(&input);
        let fs = frames(&out[PREFACE_LEN..]);
        assert_eq!(fs[0].0.kind, TYPE_HEADERS);
        assert_eq!(fs[0].1, UNDECODABLE_BLOCK.to_vec());
        assert!(out.ends_with(&tail));
        assert!(Decoder::new().decode(&UNDECODABLE_BLOCK).is_err());
    }

    /// A HEADERS frame whose padding is longer than it, or a block interrupted by another
    /// frame, is passed on as it came, for `h2` to refuse.
    #[test]
    fn frame_errors_pass_through_unchanged() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_END_HEADERS,
            1,
            &[9, 1],
        ));
        assert_eq!(rewrite_all(&input), input);

        let mut input = PREFACE.to_vec();
        input.extend(frame(TYPE_HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert_eq!(rewrite_all(&input), input);
    }

    /// Arbitrary bytes after the preface never panic the rewriter, whole or in pieces.
    #[test]
    fn random_input_never_panics() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..3000 {
            let mut input = PREFACE.to_vec();
            for _ in 0..(next() % 6) {
                let kind = [TYPE_HEADERS, TYPE_CONTINUATION, 0x0, 0x4][(next() % 4) as usize];
                let len = (next() % 40) as usize;
                let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                input.extend(frame(kind, next() as u8, (next() % 4) as u32, &payload));
            }
            let mut r = Rewriter::default();
            let mut out = BytesMut::new();
            let mut pending = BytesMut::new();
            let step = 1 + (next() % 17) as usize;
            for chunk in input.chunks(step) {
                pending.extend_from_slice(chunk);
                r.process(&mut pending, &mut out);
            }
        }
    }
}
