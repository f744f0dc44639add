//! Raw HTTP/2 on berthd's CRI socket, framed and HPACK-encoded by hand exactly as grpc-go before
//! 1.52 (every kubelet before 1.26), grpc-java and grpc-python send it: the socket's path as
//! `:authority`, first as a literal that enters the HPACK dynamic table, then by reference to
//! that entry. Both calls must be answered (not reset with PROTOCOL_ERROR).

mod common;

use std::time::Duration;

use common::*;
use k8s_cri::{v1 as cri, v1alpha2 as a2};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK string literal, no Huffman coding (all strings here are shorter than 127 bytes).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    assert!(s.len() < 127);
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// Literal with incremental indexing, name from the static table at `name_index`.
fn indexed_name(out: &mut Vec<u8>, name_index: u8, value: &[u8]) {
    out.push(0x40 | name_index);
    string(out, value);
}

/// Literal with incremental indexing and a literal name.
fn new_name(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x40);
    string(out, name);
    string(out, value);
}

/// A gRPC message: uncompressed flag, big-endian length, the bytes.
fn grpc_message(body: &[u8]) -> Vec<u8> {
    let mut m = vec![0];
    m.extend_from_slice(&(body.len() as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// What the server sent on one stream.
#[derive(Default, Debug)]
struct Reply {
    headers: Vec<(String, String)>,
    data: Vec<u8>,
    reset: Option<u32>,
    ended: bool,
}

/// Reads frames until every stream in `streams` has ended (or was reset); answers SETTINGS.
async fn read_replies(sock: &mut UnixStream, streams: &[u32]) -> Vec<Reply> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut replies: Vec<Reply> = streams.iter().map(|_| Reply::default()).collect();
    let read = async {
        while !replies.iter().all(|r| r.ended) {
            let mut h = [0u8; 9];
            sock.read_exact(&mut h).await.expect("frame header");
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            sock.read_exact(&mut payload).await.expect("frame payload");
            if kind == SETTINGS && flags & ACK == 0 {
                sock.write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .expect("settings ack");
                continue;
            }
            assert_ne!(kind, GOAWAY, "server sent GOAWAY: {payload:?}");
            let Some(i) = streams.iter().position(|s| *s == stream) else {
                continue;
            };
            let r = &mut replies[i];
            match kind {
                HEADERS => {
                    assert_ne!(flags & END_HEADERS, 0, "server headers fit one frame");
                    for (n, v) in decoder.decode(&payload).expect("server HPACK") {
                        r.headers.push((
                            String::from_utf8_lossy(&n).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        ));
                    }
                }
                DATA => r.data.extend_from_slice(&payload),
                RST_STREAM => {
                    r.reset = Some(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]));
                    r.ended = true;
                }
                _ => {}
            }
            if flags & END_STREAM != 0 && (kind == HEADERS || kind == DATA) {
                r.ended = true;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("replies within 20 s");
    replies
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The message of a unary gRPC reply.
fn body(r: &Reply) -> &[u8] {
    assert!(r.data.len() >= 5, "reply has a gRPC message: {r:?}");
    &r.data[5..]
}

#[tokio::test]
async fn socket_path_authority_literal_and_indexed() {
    let d = Daemon::start();
    let socket = d.socket();
    let authority = socket.to_string_lossy().into_owned();
    let mut sock = UnixStream::connect(&socket).await.expect("connect");

    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));

    // Stream 1, as grpc-go encodes a first request: each field enters the dynamic table.
    // Static table: 2 = ":method GET", 3 = ":method POST", 6 = ":scheme http", 4 = ":path",
    // 1 = ":authority", 31 = "content-type".
    let mut first = vec![0x83, 0x86];
    indexed_name(&mut first, 4, b"/runtime.v1alpha2.RuntimeService/Version");
    indexed_name(&mut first, 1, authority.as_bytes());
    indexed_name(&mut first, 31, b"application/grpc");
    new_name(&mut first, b"user-agent", b"grpc-go/1.27.1");
    new_name(&mut first, b"te", b"trailers");
    out.extend(frame(HEADERS, END_HEADERS, 1, &first));
    let req = a2::VersionRequest {
        version: "0.1.0".into(),
    };
    out.extend(frame(
        DATA,
        END_STREAM,
        1,
        &grpc_message(&req.encode_to_vec()),
    ));

    // Stream 3: a new :path (entering the table as 62), everything else by dynamic-table
    // index: te (now 63), user-agent (64), content-type (65), :authority (66).
    let mut second = vec![0x83, 0x86];
    indexed_name(&mut second, 4, b"/runtime.v1.RuntimeService/Version");
    second.extend([0x80 | 66, 0x80 | 65, 0x80 | 64, 0x80 | 63]);
    out.extend(frame(HEADERS, END_HEADERS, 3, &second));
    let req = cri::VersionRequest {
        version: "v1".into(),
    };
    out.extend(frame(
        DATA,
        END_STREAM,
        3,
        &grpc_message(&req.encode_to_vec()),
    ));
    sock.write_all(&out).await.expect("send requests");

    let replies = read_replies(&mut sock, &[1, 3]).await;
    for (r, stream) in replies.iter().zip([1, 3]) {
        assert_eq!(r.reset, None, "stream {stream} was reset: {r:?}");
        assert_eq!(header(r, ":status"), Some("200"), "stream {stream}: {r:?}");
        assert_eq!(
            header(r, "grpc-status"),
            Some("0"),
            "stream {stream}: {r:?}"
        );
    }
    let v1alpha2 = a2::VersionResponse::decode(body(&replies[0])).expect("v1alpha2 reply");
    assert_eq!(
        (
            v1alpha2.runtime_name.as_str(),
            v1alpha2.runtime_api_version.as_str()
        ),
        ("berth", "v1alpha2")
    );
    let v1 = cri::VersionResponse::decode(body(&replies[1])).expect("v1 reply");
    assert_eq!(
        (v1.runtime_name.as_str(), v1.runtime_api_version.as_str()),
        ("berth", "v1")
    );
}

/// A header block that does not decode still gets the connection error `h2` gives one (GOAWAY
/// with PROTOCOL_ERROR), and the daemon goes on serving other clients.
#[tokio::test]
async fn undecodable_header_block_gets_goaway() {
    let d = Daemon::start();
    let mut sock = UnixStream::connect(d.socket()).await.expect("connect");
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    // Index 200: in neither HPACK table.
    out.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0xff, 0x49]));
    sock.write_all(&out).await.expect("send");
    let goaway = async {
        loop {
            let mut h = [0u8; 9];
            sock.read_exact(&mut h).await.expect("frame header");
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let mut payload = vec![0u8; len];
            sock.read_exact(&mut payload).await.expect("frame payload");
            if h[3] == GOAWAY {
                return u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            }
        }
    };
    let code = tokio::time::timeout(Duration::from_secs(10), goaway)
        .await
        .expect("GOAWAY within 10 s");
    assert_eq!(code, 0x1, "PROTOCOL_ERROR");

    let c = d.client().await;
    let v = c
        .runtime()
        .version(cri::VersionRequest::default())
        .await
        .expect("Version after the bad client")
        .into_inner();
    assert_eq!(v.runtime_name, "berth");
}
