//! `berthctl port-forward`: local TCP ports forwarded to a pod's ports, as `kubectl
//! port-forward` does. Each local connection gets its own CRI PortForward and WebSocket session
//! (the v4 channel protocol: data on channel 0, errors on channel 1, each opened by the port
//! number).

use anyhow::{Context, bail};
use berth::client::CriClient;
use futures_util::{SinkExt as _, StreamExt as _};
use k8s_cri::v1 as cri;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;

/// What to forward.
#[derive(clap::Args)]
pub struct PortForwardArgs {
    /// Pod sandbox id.
    pub pod: String,
    /// `LOCAL:REMOTE` or `PORT` (the same on both sides); `:REMOTE` picks a free local port.
    #[arg(required = true)]
    pub ports: Vec<String>,
    /// Local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
}

/// `LOCAL:REMOTE`, `PORT` or `:REMOTE` (local 0: any free port).
fn parse(spec: &str) -> anyhow::Result<(u16, u16)> {
    let port = |s: &str| {
        s.parse::<u16>()
            .with_context(|| format!("port mapping {spec:?}: {s:?} is not a port"))
    };
    match spec.split_once(':') {
        Some(("", remote)) => Ok((0, port(remote)?)),
        Some((local, remote)) => Ok((port(local)?, port(remote)?)),
        None => Ok((port(spec)?, port(spec)?)),
    }
    .and_then(|(l, r)| {
        if r == 0 {
            bail!("port mapping {spec:?}: the pod's port cannot be 0")
        }
        Ok((l, r))
    })
}

pub async fn forward(c: &CriClient, args: PortForwardArgs) -> anyhow::Result<()> {
    let mut listeners = tokio::task::JoinSet::new();
    for spec in &args.ports {
        let (local, remote) = parse(spec)?;
        let listener = tokio::net::TcpListener::bind((args.address.as_str(), local))
            .await
            .with_context(|| format!("listening on {}:{local}", args.address))?;
        let bound = listener.local_addr()?;
        println!("Forwarding from {bound} -> {remote}");
        let (c, pod) = (c.clone(), args.pod.clone());
        listeners.spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let (c, pod) = (c.clone(), pod.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(&c, &pod, remote, conn).await {
                        eprintln!("port-forward {pod}:{remote}: {e:#}");
                    }
                });
            }
        });
    }
    while listeners.join_next().await.is_some() {}
    Ok(())
}

/// One local connection, carried to `remote` in `pod` until either side closes.
async fn connection(
    c: &CriClient,
    pod: &str,
    remote: u16,
    conn: tokio::net::TcpStream,
) -> anyhow::Result<()> {
    let url = c
        .runtime()
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod.to_string(),
            port: vec![i32::from(remote)],
        })
        .await
        .map_err(crate::status_message)
        .with_context(|| format!("PortForward to {pod}"))?
        .into_inner()
        .url;
    let sep = if url.contains('?') { '&' } else { '?' };
    let (ws, _) =
        crate::exec::connect(&format!("{url}{sep}port={remote}"), "v4.channel.k8s.io").await?;
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = conn.into_split();
    let up = async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut frame = Vec::with_capacity(n + 1);
            frame.push(0u8);
            frame.extend_from_slice(&buf[..n]);
            if sink.send(Message::binary(frame)).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    };
    let down = async move {
        // The first message on each channel is the port number.
        let mut opened = [false; 2];
        while let Some(Ok(msg)) = stream.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&channel, body)) = data.split_first() else {
                continue;
            };
            let Some(seen) = opened.get_mut(usize::from(channel)) else {
                continue;
            };
            if !*seen {
                *seen = true;
                continue;
            }
            if channel == 0 {
                if wr.write_all(body).await.is_err() {
                    break;
                }
            } else if !body.is_empty() {
                return Err(anyhow::anyhow!("{}", String::from_utf8_lossy(body)));
            }
        }
        let _ = wr.shutdown().await;
        Ok(())
    };
    tokio::select! {
        r = down => r,
        () = up => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_mappings() {
        assert_eq!(parse("8080:80").ok(), Some((8080, 80)));
        assert_eq!(parse("80").ok(), Some((80, 80)));
        assert_eq!(parse(":80").ok(), Some((0, 80)));
        assert!(parse("x:80").is_err());
        assert!(parse("8080:0").is_err());
        assert!(parse("70000").is_err());
    }
}
