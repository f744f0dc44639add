//! A small plain-HTTP registry for tests, serving what no real registry would (sizes that lie, bodies generated as they are sent) and recording every request.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response body.
pub enum Body {
    Bytes(Vec<u8>),
    /// `head`, then `zeros` zero bytes, generated while they are sent.
    Lazy {
        head: Vec<u8>,
        zeros: u64,
    },
    /// `head` of a body of `len` bytes, then nothing more: the connection is held open,
    /// silent, until the registry stops or the client goes away.
    Stall {
        head: Vec<u8>,
        len: u64,
    },
}

/// A response.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Response {
    /// 200 with `body` of `content_type`.
    pub fn ok(content_type: &str, body: Vec<u8>) -> Self {
        Self {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: Body::Bytes(body),
        }
    }

    /// The registry's "unknown" answer.
    pub fn not_found() -> Self {
        Self {
            status: 404,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: Body::Bytes(
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#
                    .to_vec(),
            ),
        }
    }

    fn len(&self) -> u64 {
        match &self.body {
            Body::Bytes(b) => b.len() as u64,
            Body::Lazy { head, zeros } => head.len() as u64 + zeros,
            Body::Stall { len, .. } => *len,
        }
    }
}

type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A registry on 127.0.0.1 answering with a handler; stops when dropped.
pub struct FakeRegistry {
    pub port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl FakeRegistry {
    /// Serves `handler` on a free port. `GET /v2/` answers 200 unless the handler says otherwise.
    pub fn start(handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake registry");
        let port = listener.local_addr().expect("local addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        {
            let requests = requests.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let handler = handler.clone();
                            let requests = requests.clone();
                            let stop = stop.clone();
                            std::thread::spawn(move || serve(conn, &*handler, &requests, &stop));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => return,
                    }
                }
            });
        }
        Self {
            port,
            requests,
            stop,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(conn: TcpStream, handler: &Handler, requests: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    let mut out = write_half;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default();
        let path = target.split('?').next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let length: u64 = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let _ = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
        let request = Request {
            method,
            path,
            headers,
        };
        requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.clone());
        let response = if request.path == "/v2/" || request.path == "/v2" {
            let r = handler(&request);
            if r.status == 404 {
                Response::ok("application/json", b"{}".to_vec())
            } else {
                r
            }
        } else {
            handler(&request)
        };
        let mut head = format!("HTTP/1.1 {} X\r\n", response.status);
        for (n, v) in &response.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", response.len()));
        if out.write_all(head.as_bytes()).is_err() {
            return;
        }
        if request.method == "HEAD" {
            continue;
        }
        let sent = match response.body {
            Body::Bytes(b) => out.write_all(&b),
            Body::Lazy { head, zeros } => out.write_all(&head).and_then(|()| {
                let zero = vec![0u8; 256 * 1024];
                let mut left = zeros;
                while left > 0 {
                    if stop.load(Ordering::Relaxed) {
                        return Err(std::io::Error::other("stopped"));
                    }
                    let n = left.min(zero.len() as u64) as usize;
                    out.write_all(&zero[..n])?;
                    left -= n as u64;
                }
                Ok(())
            }),
            Body::Stall { head, .. } => out.write_all(&head).and_then(|()| {
                out.flush()?;
                let mut probe = [0u8; 1];
                let _ = out.set_read_timeout(Some(Duration::from_millis(100)));
                while !stop.load(Ordering::Relaxed) {
                    // A read of 0 bytes: the client closed the connection.
                    match (&out).read(&mut probe) {
                        Ok(0) => break,
                        _ => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
                Err(std::io::Error::other("stalled"))
            }),
        };
        if sent.is_err() || out.flush().is_err() {
            return;
        }
    }
}
