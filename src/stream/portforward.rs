//! Port-forward: TCP connections to ports inside a pod's network namespace, over SPDY
//! (`portforward.k8s.io`), SPDY tunneled in WebSocket, or WebSocket channels per port.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::remotecommand::ChannelMessage;
use super::websocket as ws;
use super::{Activity, StreamServer, spdy};

/// SPDY protocol versions.
pub const SPDY_PROTOCOLS: &[&str] = &["portforward.k8s.io"];
/// WebSocket subprotocols: SPDY tunneled in binary messages, or channels per port.
pub const WS_PROTOCOLS: &[&str] = &[
    "SPDY/3.1+portforward.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "portforward.k8s.io",
];
/// Connect timeout to a pod port.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most ports one WebSocket port-forward serves: each takes two one-byte channel numbers.
pub const MAX_WS_PORTS: usize = 128;

/// Connects to `port` on the pod's loopback from inside its network namespace (`None`: the
/// host's). A dedicated thread enters the namespace, so no runtime thread ever changes its own.
pub async fn connect_in_netns(
    netns: Option<PathBuf>,
    port: u16,
) -> io::Result<tokio::net::TcpStream> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("berth-portfwd".into())
        .spawn(move || {
            let _ = tx.send(connect_blocking(netns, port));
        })?;
    let stream = rx
        .await
        .map_err(|_| io::Error::other("connect thread ended without an answer"))??;
    stream.set_nonblocking(true)?;
    let _ = stream.set_nodelay(true);
    tokio::net::TcpStream::from_std(stream)
}

fn connect_blocking(netns: Option<PathBuf>, port: u16) -> io::Result<TcpStream> {
    if let Some(path) = netns {
        let f = std::fs::File::open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("open netns {}: {e}", path.display())))?;
        // This thread is ours alone and ends after the connect: entering another network
        // namespace affects nothing else. The socket keeps the namespace it was made in.
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&f),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| io::Error::other(format!("setns {}: {e}", path.display())))?;
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => Ok(s),
        Err(e4) => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e4)
        }
    }
}

/// The pod's network namespace (None for a host-network pod).
fn pod_netns(server: &StreamServer, sandbox_id: &str) -> Result<Option<PathBuf>, String> {
    let rec = server
        .sandboxes
        .get(sandbox_id)
        .map_err(|e| format!("pod sandbox {sandbox_id}: {e}"))?;
    Ok(rec.net_ns.clone())
}

/// Serves a SPDY port-forward session: each request is an error stream and a data stream
/// sharing a `requestID`.
pub async fn serve_spdy(
    server: Arc<StreamServer>,
    req: cri::PortForwardRequest,
    mut session: spdy::Session,
    activity: Activity,
) {
    let sandbox = req.pod_sandbox_id.clone();
    let mut halves: HashMap<String, (Option<spdy::Stream>, Option<spdy::Stream>)> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let idle = server.idle_timeout;
    loop {
        let stream = tokio::select! {
            s = session.streams.recv() => s,
            _ = activity.idle(idle) => {
                tracing::info!(sandbox = %sandbox, "port-forward idle for {idle:?}: closing");
                break;
            }
        };
        let Some(s) = stream else { break };
        let id = s.header("requestid").unwrap_or("").to_string();
        let kind = s.header("streamtype").unwrap_or("").to_ascii_lowercase();
        let entry = halves.entry(id.clone()).or_default();
        match kind.as_str() {
            "error" => entry.0 = Some(s),
            "data" => entry.1 = Some(s),
            other => {
                tracing::debug!(stream = other, "unknown port-forward stream type");
                s.tx.reset(spdy::RST_PROTOCOL_ERROR).await;
                continue;
            }
        }
        if let Some((Some(_), Some(_))) = halves.get(&id)
            && let Some((Some(err), Some(data))) = halves.remove(&id)
        {
            let server = server.clone();
            let sandbox = sandbox.clone();
            tasks.spawn(async move { forward_spdy(&server, &sandbox, err, data).await });
        }
        // Finished forwards are collected as they go.
        while tasks.try_join_next().is_some() {}
    }
    // The client is gone: every forward of the session ends with it.
    tasks.abort_all();
    session.finish().await;
}

async fn forward_spdy(server: &StreamServer, sandbox: &str, err: spdy::Stream, data: spdy::Stream) {
    let port = spdy_port(data.header("port"));
    let (etx, dtx) = (err.tx.clone(), data.tx.clone());
    let fail = |msg: String| async move {
        tracing::info!("{msg}");
        etx.write(msg.as_bytes()).await;
        etx.close().await;
        dtx.close().await;
    };
    let Some(port) = port else {
        return fail(format!(
            "invalid port {:?} in port-forward to pod sandbox {sandbox}",
            data.header("port")
        ))
        .await;
    };
    let netns = match pod_netns(server, sandbox) {
        Ok(n) => n,
        Err(e) => return fail(e).await,
    };
    let tcp = match connect_in_netns(netns, port).await {
        Ok(t) => t,
        Err(e) => {
            return fail(format!(
                "error forwarding port {port} to pod sandbox {sandbox}: {e}"
            ))
            .await;
        }
    };
    let (mut rd, mut wr) = tcp.into_split();
    let spdy::Stream { mut rx, tx, .. } = data;
    let to_pod = async move {
        while let Some(b) = rx.recv().await {
            if wr.write_all(&b).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    let from_pod = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !tx.write(&buf[..n]).await {
                        break;
                    }
                }
            }
        }
        tx.close().await;
    };
    // The forward ends when the pod closes its side (after answering a client that closed
    // its own); what the client still sends then has nowhere to go.
    let to_pod = tokio::spawn(to_pod);
    from_pod.await;
    to_pod.abort();
    err.tx.close().await;
}

/// A WebSocket connection as a byte stream: binary messages in both directions (for SPDY
/// tunneled in WebSocket).
async fn websocket_bytes<T>(io: T, activity: Activity) -> tokio::io::DuplexStream
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut r, mut w) = ws::server(io).await;
    let (mut d_rd, mut d_wr) = tokio::io::split(ours);
    let act = activity.clone();
    tokio::spawn(async move {
        while let Ok(Some(m)) = r.next().await {
            act.touch();
            match m.opcode {
                ws::OP_BINARY | ws::OP_TEXT if d_wr.write_all(&m.data).await.is_err() => break,
                ws::OP_CLOSE => break,
                _ => {}
            }
        }
        let _ = d_wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match d_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if w.send(ws::OP_BINARY, &buf[..n]).await.is_err() {
                        return;
                    }
                    activity.touch();
                }
            }
        }
        w.close().await;
    });
    theirs
}

/// Serves port-forward over WebSocket: SPDY tunneled in it (what client-go's WebSocket dialer
/// speaks), or one data and one error channel per port listed in the `port` query parameter.
pub async fn serve_websocket<T>(
    server: Arc<StreamServer>,
    req: cri::PortForwardRequest,
    protocol: &str,
    query: &str,
    io: T,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let activity = Activity::default();
    if protocol.starts_with("SPDY/3.1+") {
        let bytes = websocket_bytes(io, activity.clone()).await;
        let session = spdy::Session::start(bytes, activity.clone());
        serve_spdy(server, req, session, activity).await;
        return;
    }
    serve_ws_channels(server, req, protocol, query, io, activity).await;
}

/// Decodes a client message of the channel protocol: a channel byte then data (`base64`: an
/// ASCII digit then base64); text without base64, pings and pongs are ignored.
pub fn decode_message(m: ws::Message, base64: bool) -> ChannelMessage {
    match m.opcode {
        ws::OP_CLOSE => ChannelMessage::End,
        ws::OP_TEXT if base64 => {
            let Some((&c, rest)) = m.data.split_first() else {
                return ChannelMessage::Ignored;
            };
            let Some(d) = ws::base64_decode(rest) else {
                return ChannelMessage::End;
            };
            ChannelMessage::Data(c.wrapping_sub(b'0'), Bytes::from(d))
        }
        ws::OP_BINARY => {
            let Some(&c) = m.data.first() else {
                return ChannelMessage::Ignored;
            };
            ChannelMessage::Data(c, m.data.slice(1..))
        }
        _ => ChannelMessage::Ignored,
    }
}

/// The port a SPDY data stream's `port` header names (None: missing, malformed or 0).
pub fn spdy_port(header: Option<&str>) -> Option<u16> {
    header
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
}

/// Ports from the query (`port=80&port=8080` or `ports=80,8080`), else from the request.
pub fn query_ports(query: &str, req: &cri::PortForwardRequest) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for pair in query.split('&') {
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        if k == "port" || k == "ports" {
            for p in v.split([',', '+', ' ']) {
                let n = p
                    .parse::<u16>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("invalid port {p:?}"))?;
                ports.push(n);
            }
        }
    }
    if ports.is_empty() {
        ports = req
            .port
            .iter()
            .filter_map(|p| u16::try_from(*p).ok())
            .filter(|p| *p > 0)
            .collect();
    }
    if ports.is_empty() {
        return Err("port-forward: no ports given".into());
    }
    if ports.len() > MAX_WS_PORTS {
        return Err(format!(
            "port-forward: {} ports given, at most {MAX_WS_PORTS}",
            ports.len()
        ));
    }
    Ok(ports)
}

async fn serve_ws_channels<T>(
    server: Arc<StreamServer>,
    req: cri::PortForwardRequest,
    protocol: &str,
    query: &str,
    io: T,
    activity: Activity,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let base64 = protocol.contains("base64");
    let (mut r, mut w) = ws::server(io).await;
    let send = |ch: u8, data: &[u8]| {
        if base64 {
            // Past '9' the digit wraps, as the clients' decoding does.
            let mut s = vec![b'0'.wrapping_add(ch)];
            s.extend_from_slice(ws::base64_encode(data).as_bytes());
            (ws::OP_TEXT, s)
        } else {
            let mut b = vec![ch];
            b.extend_from_slice(data);
            (ws::OP_BINARY, b)
        }
    };
    let ports = match query_ports(query, &req) {
        Ok(p) => p,
        Err(e) => {
            let (op, m) = send(1, e.as_bytes());
            let _ = w.send(op, &m).await;
            w.close().await;
            return;
        }
    };
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    // Each channel starts with its port number (2 bytes, little-endian).
    for (i, p) in ports.iter().enumerate() {
        for ch in [2 * i as u8, 2 * i as u8 + 1] {
            let (op, m) = send(ch, &p.to_le_bytes());
            if w.send(op, &m).await.is_err() {
                return;
            }
        }
    }
    let mut to_pod: Vec<mpsc::Sender<Bytes>> = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (tx, mut rx) = mpsc::channel::<Bytes>(32);
        to_pod.push(tx);
        let out = out_tx.clone();
        let server = server.clone();
        let sandbox = req.pod_sandbox_id.clone();
        let (data_ch, err_ch) = (2 * i as u8, 2 * i as u8 + 1);
        tasks.spawn(async move {
            let tcp = match pod_netns(&server, &sandbox) {
                Ok(ns) => connect_in_netns(ns, port).await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let tcp = match tcp {
                Ok(t) => t,
                Err(e) => {
                    let msg = format!("error forwarding port {port} to pod sandbox {sandbox}: {e}");
                    let _ = out.send((err_ch, Bytes::from(msg))).await;
                    return;
                }
            };
            let (mut rd, mut wr) = tcp.into_split();
            let up = async move {
                while let Some(b) = rx.recv().await {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
                let _ = wr.shutdown().await;
            };
            let down = async {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if out
                                .send((data_ch, Bytes::copy_from_slice(&buf[..n])))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                }
            };
            tokio::select! {
                _ = down => {}
                _ = up => {}
            }
        });
    }
    drop(out_tx);
    let act = activity.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(m)) = r.next().await {
            act.touch();
            let (ch, data) = match decode_message(m, base64) {
                ChannelMessage::Data(ch, data) => (ch, data),
                ChannelMessage::Ignored => continue,
                ChannelMessage::End => break,
            };
            if ch % 2 == 0
                && let Some(tx) = to_pod.get(usize::from(ch / 2))
                && !data.is_empty()
            {
                let _ = tx.send(data).await;
            }
        }
    });
    let idle = server.idle_timeout;
    loop {
        tokio::select! {
            m = out_rx.recv() => match m {
                Some((ch, data)) => {
                    let (op, msg) = send(ch, &data);
                    if w.send(op, &msg).await.is_err() {
                        break;
                    }
                    activity.touch();
                }
                None => break,
            },
            _ = activity.idle(idle) => break,
        }
        if reader.is_finished() {
            break;
        }
    }
    reader.abort();
    tasks.abort_all();
    w.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_the_query_or_the_request() {
        let req = cri::PortForwardRequest {
            pod_sandbox_id: "p".into(),
            port: vec![80],
        };
        assert_eq!(
            query_ports("port=8080&port=9090", &req),
            Ok(vec![8080, 9090])
        );
        assert_eq!(query_ports("ports=1,2", &req), Ok(vec![1, 2]));
        assert_eq!(query_ports("", &req), Ok(vec![80]));
        assert!(query_ports("port=x", &req).is_err());
    }

    #[tokio::test]
    async fn connects_on_the_host_without_a_netns() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
        connect_in_netns(None, port).await.expect("connect");
        accept.await.expect("join").expect("accept");
    }
}
