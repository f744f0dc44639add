//! Exec and attach over the Kubernetes remote command protocols (channel.k8s.io v1-v5).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::fdio::{FdIo, set_winsize};
use super::websocket as ws;
use super::{Activity, Pending, StreamServer, spdy};
use crate::runtime::container_stream::ShimSession;

/// SPDY protocol versions, preferred first.
pub const SPDY_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// WebSocket subprotocols.
pub const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
/// How long a SPDY client may take to open the streams it asked for.
const STREAM_SETUP: Duration = Duration::from_secs(30);
/// After the process exits, how long its output may take to drain (descendants may hold it).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// WebSocket channel numbers.
const CH_STDIN: u8 = 0;
const CH_STDOUT: u8 = 1;
const CH_STDERR: u8 = 2;
const CH_ERROR: u8 = 3;
const CH_RESIZE: u8 = 4;
const CH_CLOSE: u8 = 255;

/// Protocol generations: how errors and exit codes are reported.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Version {
    V1,
    V2,
    V3,
    V4,
    V5,
}

fn version_of(protocol: &str) -> Version {
    if protocol.starts_with("v5.") {
        Version::V5
    } else if protocol.starts_with("v4.") {
        Version::V4
    } else if protocol.starts_with("v3.") {
        Version::V3
    } else if protocol.starts_with("v2.") {
        Version::V2
    } else {
        Version::V1
    }
}

/// Messages for the WebSocket writer task.
enum WsOut {
    Data(u8, Bytes),
    Close,
}

/// One output channel of the client connection.
#[derive(Clone)]
enum Sink {
    Spdy(spdy::StreamWriter),
    Ws(u8, mpsc::Sender<WsOut>),
}

impl Sink {
    async fn write(&self, data: Bytes) -> bool {
        match self {
            Sink::Spdy(w) => w.write_bytes(data).await,
            Sink::Ws(ch, tx) => tx.send(WsOut::Data(*ch, data)).await.is_ok(),
        }
    }

    async fn close(&self) {
        if let Sink::Spdy(w) = self {
            w.close().await;
        }
    }
}

/// The client side of a session, whatever the transport.
struct Channels {
    stdin: Option<mpsc::Receiver<Bytes>>,
    stdout: Option<Sink>,
    stderr: Option<Sink>,
    error: Option<Sink>,
    resize: Option<mpsc::Receiver<Bytes>>,
    /// True once the client's connection ended.
    gone: watch::Receiver<bool>,
    version: Version,
}

/// What the session runs.
struct Target {
    container_id: String,
    /// Empty for attach.
    cmd: Vec<String>,
    tty: bool,
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

fn target(p: Pending) -> Option<Target> {
    match p {
        Pending::Exec(e) => Some(Target {
            container_id: e.container_id,
            cmd: e.cmd,
            tty: e.tty,
            stdin: e.stdin,
            stdout: e.stdout,
            stderr: e.stderr,
        }),
        Pending::Attach(a) => Some(Target {
            container_id: a.container_id,
            cmd: Vec::new(),
            tty: a.tty,
            stdin: a.stdin,
            stdout: a.stdout,
            stderr: a.stderr,
        }),
        Pending::PortForward(_) => None,
    }
}

/// Serves exec/attach over a SPDY session.
pub async fn serve_spdy(
    server: Arc<StreamServer>,
    pending: Pending,
    protocol: &str,
    mut session: spdy::Session,
    activity: Activity,
) {
    let Some(t) = target(pending) else { return };
    let version = version_of(protocol);
    // The streams the client opens for this request: error always; resize with a tty (v3+).
    let mut want_stdin = t.stdin;
    let mut want_stdout = t.stdout;
    let mut want_stderr = t.stderr && !t.tty;
    let mut want_resize = t.tty && version >= Version::V3;
    let mut want_error = true;
    let mut ch = Channels {
        stdin: None,
        stdout: None,
        stderr: None,
        error: None,
        resize: None,
        gone: session.closed.clone(),
        version,
    };
    let deadline = tokio::time::sleep(STREAM_SETUP);
    tokio::pin!(deadline);
    while want_stdin || want_stdout || want_stderr || want_resize || want_error {
        let stream = tokio::select! {
            s = session.streams.recv() => s,
            _ = &mut deadline => {
                tracing::debug!(container = %t.container_id, "client did not open its streams in time");
                if let Some(e) = &ch.error {
                    e.write(Bytes::from("timed out waiting for client to create streams")).await;
                }
                session.finish().await;
                return;
            }
        };
        let Some(s) = stream else {
            return;
        };
        let kind = s.header("streamtype").unwrap_or("").to_ascii_lowercase();
        match kind.as_str() {
            "error" => {
                ch.error = Some(Sink::Spdy(s.tx));
                want_error = false;
            }
            "stdin" => {
                ch.stdin = Some(s.rx);
                want_stdin = false;
            }
            "stdout" => {
                ch.stdout = Some(Sink::Spdy(s.tx));
                want_stdout = false;
            }
            "stderr" => {
                ch.stderr = Some(Sink::Spdy(s.tx));
                want_stderr = false;
            }
            "resize" => {
                ch.resize = Some(s.rx);
                want_resize = false;
            }
            other => {
                tracing::debug!(stream = other, "unknown stream type");
                s.tx.reset(spdy::RST_PROTOCOL_ERROR).await;
            }
        }
    }
    run(&server, t, ch, activity).await;
    session.finish().await;
}

/// Serves exec/attach over a WebSocket connection.
pub async fn serve_websocket<T>(server: Arc<StreamServer>, pending: Pending, protocol: &str, io: T)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(t) = target(pending) else { return };
    let version = version_of(protocol);
    let base64 = protocol.contains("base64");
    let activity = Activity::default();
    let (rd, wr) = ws::server(io).await;
    let (out_tx, out_rx) = mpsc::channel::<WsOut>(64);
    let writer = tokio::spawn(ws_write_loop(wr, out_rx, base64, activity.clone()));
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(32);
    let (resize_tx, resize_rx) = mpsc::channel::<Bytes>(8);
    let (gone_tx, gone_rx) = watch::channel(false);
    let act = activity.clone();
    let reader = tokio::spawn(async move {
        ws_read_loop(rd, stdin_tx, resize_tx, base64, act).await;
        let _ = gone_tx.send(true);
    });
    let sink = |c: u8| Some(Sink::Ws(c, out_tx.clone()));
    let ch = Channels {
        stdin: t.stdin.then_some(stdin_rx),
        stdout: if t.stdout { sink(CH_STDOUT) } else { None },
        stderr: if t.stderr && !t.tty {
            sink(CH_STDERR)
        } else {
            None
        },
        error: sink(CH_ERROR),
        resize: t.tty.then_some(resize_rx),
        gone: gone_rx,
        version,
    };
    run(&server, t, ch, activity).await;
    let _ = out_tx.send(WsOut::Close).await;
    drop(out_tx);
    if tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .is_err()
    {
        tracing::debug!("websocket writer did not finish");
    }
    reader.abort();
}

async fn ws_write_loop<T: AsyncRead + AsyncWrite + Unpin>(
    mut w: ws::Writer<T>,
    mut rx: mpsc::Receiver<WsOut>,
    base64: bool,
    activity: Activity,
) {
    while let Some(m) = rx.recv().await {
        let r = match m {
            WsOut::Data(ch, data) => {
                if base64 {
                    let mut s = String::with_capacity(data.len() * 4 / 3 + 8);
                    s.push(char::from(b'0' + ch));
                    s.push_str(&ws::base64_encode(&data));
                    w.send(ws::OP_TEXT, s.as_bytes()).await
                } else {
                    let mut b = Vec::with_capacity(data.len() + 1);
                    b.push(ch);
                    b.extend_from_slice(&data);
                    w.send(ws::OP_BINARY, &b).await
                }
            }
            WsOut::Close => {
                w.close().await;
                return;
            }
        };
        if r.is_err() {
            return;
        }
        activity.touch();
    }
    w.close().await;
}

async fn ws_read_loop<T: AsyncRead + AsyncWrite + Unpin>(
    mut r: ws::Reader<T>,
    stdin: mpsc::Sender<Bytes>,
    resize: mpsc::Sender<Bytes>,
    base64: bool,
    activity: Activity,
) {
    let mut stdin = Some(stdin);
    loop {
        let m = match r.next().await {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "websocket read");
                return;
            }
        };
        activity.touch();
        let (ch, data) = match decode_message(m, base64) {
            ChannelMessage::Data(ch, data) => (ch, data),
            ChannelMessage::Ignored => continue,
            ChannelMessage::End => return,
        };
        match ch {
            CH_STDIN => {
                if let Some(tx) = &stdin
                    && !data.is_empty()
                    && tx.send(data).await.is_err()
                {
                    stdin = None;
                }
            }
            CH_RESIZE => {
                let _ = resize.send(data).await;
            }
            CH_CLOSE if data.first() == Some(&CH_STDIN) => stdin = None,
            _ => {}
        }
    }
}

/// A client's WebSocket message of the channel protocol, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum ChannelMessage {
    /// Data for channel `.0`.
    Data(u8, Bytes),
    /// Nothing to act on (a ping, a pong, an empty message).
    Ignored,
    /// The client is done (a close, or base64 that does not decode).
    End,
}

/// Decodes a client message: a channel byte then data (`base64`: an ASCII digit then base64).
pub fn decode_message(m: ws::Message, base64: bool) -> ChannelMessage {
    match m.opcode {
        ws::OP_CLOSE => ChannelMessage::End,
        ws::OP_PING | ws::OP_PONG => ChannelMessage::Ignored,
        ws::OP_TEXT if base64 => {
            let Some((&c, rest)) = m.data.split_first() else {
                return ChannelMessage::Ignored;
            };
            let Some(decoded) = ws::base64_decode(rest) else {
                tracing::debug!("websocket: bad base64 message");
                return ChannelMessage::End;
            };
            ChannelMessage::Data(c.wrapping_sub(b'0'), Bytes::from(decoded))
        }
        _ => {
            let Some(&c) = m.data.first() else {
                return ChannelMessage::Ignored;
            };
            ChannelMessage::Data(c, m.data.slice(1..))
        }
    }
}

/// A terminal size as the clients encode it.
#[derive(Deserialize)]
struct TermSize {
    #[serde(rename = "Width", alias = "width")]
    width: u16,
    #[serde(rename = "Height", alias = "height")]
    height: u16,
}

/// Applies resize messages (concatenated JSON objects) to the pty.
async fn resize_loop(mut rx: mpsc::Receiver<Bytes>, pty: std::os::fd::OwnedFd) {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(data) = rx.recv().await {
        buf.extend_from_slice(&data);
        for (width, height) in take_resizes(&mut buf) {
            if let Err(e) = set_winsize(&pty, width, height) {
                tracing::debug!(error = %e, "TIOCSWINSZ");
            }
        }
    }
}

/// Takes the complete resize messages (width, height) off the front of `buf`, leaving an
/// incomplete one for more data; a malformed message drops the buffer, and so does an incomplete
/// one over 4 KiB.
pub fn take_resizes(buf: &mut Vec<u8>) -> Vec<(u16, u16)> {
    let mut sizes = Vec::new();
    let mut consumed = 0;
    {
        let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<TermSize>();
        loop {
            match it.next() {
                Some(Ok(size)) => {
                    consumed = it.byte_offset();
                    sizes.push((size.width, size.height));
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "bad resize message");
                    consumed = buf.len();
                    break;
                }
                None => break,
            }
        }
    }
    buf.drain(..consumed);
    if buf.len() > 4096 {
        buf.clear();
    }
    sizes
}

/// Copies a process output descriptor to a client channel until EOF.
async fn copy_out<R: AsyncRead + Unpin>(mut r: R, sink: Sink) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !sink.write(Bytes::copy_from_slice(&buf[..n])).await {
                    return;
                }
            }
        }
    }
}

/// Copies client input to the process's stdin; closing it at the client's end of input.
async fn copy_in<W: AsyncWrite + Unpin>(mut rx: mpsc::Receiver<Bytes>, mut w: W) {
    while let Some(data) = rx.recv().await {
        if w.write_all(&data).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// The Kubernetes Status object reporting an exit code (v4 and later).
fn status_json(exit: Option<i32>, cmd: &[String], message: Option<&str>) -> String {
    match (exit, message) {
        (Some(0), None) | (None, None) => {
            serde_json::json!({"metadata": {}, "status": "Success"}).to_string()
        }
        (Some(code), None) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command {cmd:?}, exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        })
        .to_string(),
        (_, Some(msg)) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": msg,
            "reason": "InternalError",
            "details": {"causes": [{"message": msg}]},
            "code": 500,
        })
        .to_string(),
    }
}

/// The error channel's message (None: nothing to send, which older versions read as success).
fn error_message(
    version: Version,
    exit: Option<i32>,
    cmd: &[String],
    failure: Option<&str>,
) -> Option<String> {
    if version >= Version::V4 {
        return Some(status_json(exit, cmd, failure));
    }
    match (exit, failure) {
        (_, Some(f)) => Some(f.to_string()),
        (Some(code), None) if code != 0 => Some(format!(
            "command terminated with non-zero exit code: error executing command {cmd:?}, exit code {code}"
        )),
        _ => None,
    }
}

/// Opens the shim session, wires its descriptors to the client and waits for the end.
async fn run(server: &StreamServer, t: Target, mut ch: Channels, activity: Activity) {
    let exec = !t.cmd.is_empty();
    let opened = if exec {
        server
            .containers
            .exec_stream(
                &t.container_id,
                &t.cmd,
                t.tty,
                ch.stdin.is_some(),
                ch.stdout.is_some(),
                ch.stderr.is_some(),
            )
            .await
    } else {
        server
            .containers
            .attach_stream(
                &t.container_id,
                ch.stdin.is_some(),
                ch.stdout.is_some(),
                ch.stderr.is_some(),
            )
            .await
    };
    let mut session = match opened {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            tracing::info!(container = %t.container_id, error = %msg, "stream session failed");
            if let (Some(err), Some(m)) = (
                &ch.error,
                error_message(ch.version, None, &t.cmd, Some(&msg)),
            ) {
                err.write(Bytes::from(m)).await;
                err.close().await;
            }
            return;
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    let (stdin_done_tx, mut stdin_done) = tokio::sync::oneshot::channel::<()>();
    let outputs = wire(&mut session, &mut ch, &mut tasks, exec, stdin_done_tx);
    let mut gone = ch.gone.clone();
    let idle = server.idle_timeout;
    let mut watch_stdin = session.close_stdin;
    let exit = loop {
        tokio::select! {
            code = session.wait() => break code,
            r = &mut stdin_done, if watch_stdin => {
                watch_stdin = false;
                if r.is_ok() {
                    session.close_stdin().await;
                }
            }
            _ = async { gone.wait_for(|g| *g).await.map(|_| ()) } => {
                tracing::info!(container = %t.container_id, pid = session.pid, "client went away: ending the session");
                break None;
            }
            _ = activity.idle(idle) => {
                tracing::info!(container = %t.container_id, "stream idle for {idle:?}: closing");
                break None;
            }
        }
    };
    let client_gone = *ch.gone.borrow();
    // Closing the shim connection kills an exec process still running.
    drop(session);
    if !client_gone {
        // Output written just before the exit is still in the pipes.
        let mut outputs = outputs;
        let _ = tokio::time::timeout(OUTPUT_DRAIN, async {
            while outputs.join_next().await.is_some() {}
        })
        .await;
        outputs.abort_all();
        let message = if exec {
            if exit.is_none() {
                error_message(
                    ch.version,
                    None,
                    &t.cmd,
                    Some("the exec session ended without an exit code"),
                )
            } else {
                error_message(ch.version, exit, &t.cmd, None)
            }
        } else {
            error_message(ch.version, None, &t.cmd, None)
        };
        if let (Some(err), Some(m)) = (&ch.error, message) {
            err.write(Bytes::from(m)).await;
        }
        for s in [&ch.stdout, &ch.stderr, &ch.error].into_iter().flatten() {
            s.close().await;
        }
    }
    tasks.abort_all();
}

/// Starts the copy tasks; returns the output copies (joined before the status is sent).
/// With `pty_output` the pty master is the output too (exec); an attacher's pty descriptor is
/// for input and resizing only (the shim copies the output to it through a pipe).
fn wire(
    session: &mut ShimSession,
    ch: &mut Channels,
    tasks: &mut tokio::task::JoinSet<()>,
    pty_output: bool,
    stdin_done: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinSet<()> {
    let mut outputs = tokio::task::JoinSet::new();
    if let Some(pty) = session.take("pty") {
        let resize_fd = pty.try_clone().ok();
        match FdIo::new(pty) {
            Ok(io) => {
                let (r, w) = tokio::io::split(io);
                match ch.stdout.clone() {
                    Some(sink) if pty_output => {
                        outputs.spawn(copy_out(r, sink));
                    }
                    _ if !pty_output => drop(r),
                    // Nobody reads the output: drain it so the process never blocks.
                    None | Some(_) => {
                        outputs.spawn(async move {
                            let _ = tokio::io::copy(&mut { r }, &mut tokio::io::sink()).await;
                        });
                    }
                }
                if let Some(rx) = ch.stdin.take() {
                    tasks.spawn(copy_in(rx, w));
                } else {
                    // Keep the write half (and so the master) open for the session.
                    tasks.spawn(async move {
                        let _w = w;
                        std::future::pending::<()>().await;
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "pty"),
        }
        if let (Some(rx), Some(fd)) = (ch.resize.take(), resize_fd) {
            tasks.spawn(resize_loop(rx, fd));
        }
    }
    if let Some(fd) = session.take("stdin") {
        match (FdIo::new(fd), ch.stdin.take()) {
            (Ok(io), Some(rx)) => {
                tasks.spawn(async move {
                    copy_in(rx, io).await;
                    let _ = stdin_done.send(());
                });
            }
            (Err(e), _) => tracing::warn!(error = %e, "stdin"),
            _ => {}
        }
    }
    for (name, sink) in [("stdout", ch.stdout.clone()), ("stderr", ch.stderr.clone())] {
        if let (Some(fd), Some(sink)) = (session.take(name), sink) {
            match FdIo::new(fd) {
                Ok(io) => {
                    outputs.spawn(copy_out(io, sink));
                }
                Err(e) => tracing::warn!(error = %e, "{name}"),
            }
        }
    }
    // Resize messages for a container without a tty are read and dropped.
    if let Some(mut rx) = ch.resize.take() {
        tasks.spawn(async move { while rx.recv().await.is_some() {} });
    }
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_become_status_objects() {
        let cmd = vec!["sh".to_string()];
        let ok: serde_json::Value =
            serde_json::from_str(&status_json(Some(0), &cmd, None)).expect("json");
        assert_eq!(ok["status"], "Success");
        let bad: serde_json::Value =
            serde_json::from_str(&status_json(Some(3), &cmd, None)).expect("json");
        assert_eq!(bad["status"], "Failure");
        assert_eq!(bad["reason"], "NonZeroExitCode");
        assert_eq!(bad["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(bad["details"]["causes"][0]["message"], "3");
        assert_eq!(error_message(Version::V2, Some(0), &cmd, None), None);
        assert!(
            error_message(Version::V1, Some(2), &cmd, None)
                .is_some_and(|m| m.contains("exit code 2"))
        );
        assert_eq!(version_of("v4.base64.channel.k8s.io"), Version::V4);
        assert_eq!(version_of("channel.k8s.io"), Version::V1);
    }
}
