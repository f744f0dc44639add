//! Test clients for Berth's streaming server: HTTP/1.1 upgrade, SPDY/3.1 and WebSocket.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use berth::stream::spdy::{self, HeaderCompressor, HeaderDecompressor};
use berth::stream::websocket as ws;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Splits `http://HOST:PORT/path` into address and path.
pub fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').expect("path");
    (host.to_string(), format!("/{path}"))
}

/// Sends an upgrade request; returns the status code, the response headers (lower-case
/// names) and the connection.
pub async fn upgrade(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
) -> (u16, HashMap<String, String>, TcpStream) {
    let (host, path) = split_url(url);
    let mut s = TcpStream::connect(&host).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("write request");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await.expect("read response");
        assert!(n > 0, "connection closed in the response head: {head:?}");
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let mut h = HashMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            h.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    (status, h, s)
}

/// A SPDY client session.
pub struct Spdy {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    z_out: HeaderCompressor,
    z_in: HeaderDecompressor,
    next: u32,
    /// Data received per stream.
    pub data: HashMap<u32, Vec<u8>>,
    /// Streams the server finished.
    pub fin: Vec<u32>,
    pub replies: Vec<u32>,
    pub resets: Vec<u32>,
}

impl Spdy {
    /// Upgrades to SPDY/3.1 offering `protocols`; panics unless the server switches.
    pub async fn connect(url: &str, protocols: &[&str]) -> (Spdy, String) {
        let list = protocols.join(", ");
        let mut hdrs = vec![("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")];
        if !protocols.is_empty() {
            hdrs.push(("X-Stream-Protocol-Version", list.as_str()));
        }
        let (status, h, s) = upgrade(url, "POST", &hdrs).await;
        assert_eq!(status, 101, "upgrade refused: {h:?}");
        let chosen = h
            .get("x-stream-protocol-version")
            .cloned()
            .unwrap_or_default();
        let (rd, wr) = s.into_split();
        (
            Spdy {
                rd,
                wr,
                z_out: HeaderCompressor::new(),
                z_in: HeaderDecompressor::new(),
                next: 1,
                data: HashMap::new(),
                fin: Vec::new(),
                replies: Vec::new(),
                resets: Vec::new(),
            },
            chosen,
        )
    }

    /// Opens a stream with `headers`; returns its id.
    pub async fn open(&mut self, headers: &[(&str, &str)]) -> u32 {
        let id = self.next;
        self.next += 2;
        let h: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let f = spdy::syn_stream_frame(&mut self.z_out, id, 0, &h).expect("syn");
        self.wr.write_all(&f).await.expect("write syn");
        id
    }

    pub async fn send(&mut self, id: u32, data: &[u8], fin: bool) {
        let f = spdy::data_frame(id, if fin { spdy::FLAG_FIN } else { 0 }, data);
        self.wr.write_all(&f).await.expect("write data");
    }

    /// Reads frames until `done` holds or the connection ends (false) or `limit` passes.
    pub async fn read_until(&mut self, limit: Duration, done: impl Fn(&Spdy) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if done(self) {
                return true;
            }
            let frame =
                match tokio::time::timeout_at(deadline, spdy::read_frame(&mut self.rd)).await {
                    Err(_) => return false,
                    Ok(Ok(Some(f))) => f,
                    Ok(_) => return done(self),
                };
            match frame {
                spdy::Frame::Data {
                    stream,
                    flags,
                    data,
                } => {
                    self.data
                        .entry(stream)
                        .or_default()
                        .extend_from_slice(&data);
                    if flags & spdy::FLAG_FIN != 0 {
                        self.fin.push(stream);
                    }
                }
                spdy::Frame::Control { kind, payload, .. } => match kind {
                    2 => {
                        let (id, _) =
                            spdy::parse_syn(&mut self.z_in, kind, &payload).expect("reply");
                        self.replies.push(id);
                    }
                    3 => {
                        let id =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        self.resets.push(id);
                    }
                    _ => {}
                },
            }
        }
    }

    /// Reads until the server closes the connection (or `limit`); true if it closed.
    pub async fn read_to_end(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, spdy::read_frame(&mut self.rd)).await {
                Err(_) => return false,
                Ok(Ok(Some(spdy::Frame::Data {
                    stream,
                    flags,
                    data,
                }))) => {
                    self.data
                        .entry(stream)
                        .or_default()
                        .extend_from_slice(&data);
                    if flags & spdy::FLAG_FIN != 0 {
                        self.fin.push(stream);
                    }
                }
                Ok(Ok(Some(spdy::Frame::Control {
                    kind: 2, payload, ..
                }))) => {
                    let (id, _) = spdy::parse_syn(&mut self.z_in, 2, &payload).expect("reply");
                    self.replies.push(id);
                }
                Ok(Ok(Some(_))) => {}
                Ok(_) => return true,
            }
        }
    }

    /// Counts (and drops) the bytes of stream `id` until its FIN, `max` bytes or `limit`.
    pub async fn read_bytes_until_fin(&mut self, id: u32, max: usize, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        let mut n = 0;
        while n < max {
            match tokio::time::timeout_at(deadline, spdy::read_frame(&mut self.rd)).await {
                Ok(Ok(Some(spdy::Frame::Data {
                    stream,
                    flags,
                    data,
                }))) if stream == id => {
                    n += data.len();
                    if flags & spdy::FLAG_FIN != 0 {
                        break;
                    }
                }
                Ok(Ok(Some(spdy::Frame::Control {
                    kind: 2, payload, ..
                }))) => {
                    let _ = spdy::parse_syn(&mut self.z_in, 2, &payload);
                }
                Ok(Ok(Some(_))) => {}
                _ => break,
            }
        }
        n
    }

    pub fn text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.data.get(&id).map(Vec::as_slice).unwrap_or(&[])).to_string()
    }
}

/// A WebSocket client: tungstenite in the client role (it masks its frames), after the HTTP
/// upgrade above.
pub struct Ws {
    ws: WebSocketStream<TcpStream>,
    pub protocol: String,
    /// The status code of the server's close frame, once it came (None: no status given).
    pub close_code: Option<u16>,
}

impl Ws {
    pub async fn connect(url: &str, protocols: &[&str]) -> Ws {
        let list = protocols.join(", ");
        let (status, h, s) = upgrade(
            url,
            "GET",
            &[
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("Sec-WebSocket-Protocol", &list),
            ],
        )
        .await;
        assert_eq!(status, 101, "websocket upgrade refused: {h:?}");
        assert_eq!(
            h.get("sec-websocket-accept").map(String::as_str),
            Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        );
        Ws {
            ws: WebSocketStream::from_raw_socket(s, Role::Client, None).await,
            close_code: None,
            protocol: h.get("sec-websocket-protocol").cloned().unwrap_or_default(),
        }
    }

    /// Sends `data` on channel `ch` (binary protocols).
    pub async fn send_channel(&mut self, ch: u8, data: &[u8]) {
        let mut b = vec![ch];
        b.extend_from_slice(data);
        self.ws.send(Message::binary(b)).await.expect("ws write");
    }

    /// Collects channel data until the server closes (or `limit`).
    pub async fn read_channels(&mut self, limit: Duration) -> HashMap<u8, Vec<u8>> {
        let mut out: HashMap<u8, Vec<u8>> = HashMap::new();
        let deadline = tokio::time::Instant::now() + limit;
        let base64 = self.protocol.contains("base64");
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Ok(Some(Ok(Message::Binary(d)))) if !d.is_empty() => {
                    out.entry(d[0]).or_default().extend_from_slice(&d[1..]);
                }
                Ok(Some(Ok(Message::Text(t)))) if base64 && !t.is_empty() => {
                    let t = t.as_bytes();
                    let d = ws::base64_decode(&t[1..]).expect("base64");
                    out.entry(t[0] - b'0').or_default().extend_from_slice(&d);
                }
                Ok(Some(Ok(Message::Close(frame)))) => {
                    self.close_code = frame.map(|f| u16::from(f.code));
                    return out;
                }
                Ok(Some(Ok(_))) => {}
                _ => return out,
            }
        }
    }
}
