//! `berthctl exec` and `berthctl attach`: a command in a running container (CRI Exec), or the
//! container's own streams (CRI Attach), through the runtime's streaming server, spoken over
//! WebSocket with the Kubernetes channel protocol (v5, else v4): stdin (`-i`), a terminal (`-t`,
//! raw mode, its size sent at start and on SIGWINCH), and the exit code as berthctl's own.

use anyhow::{Context, bail};
use base64::Engine as _;
use berth::client::CriClient;
use futures_util::{SinkExt as _, StreamExt as _};
use k8s_cri::v1 as cri;
use sha1::Digest as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

/// What to run.
#[derive(clap::Args)]
pub struct ExecArgs {
    /// Pass berthctl's stdin to the command.
    #[arg(long, short)]
    pub interactive: bool,
    /// Give the command a terminal (with -i: berthctl's terminal in raw mode).
    #[arg(long, short)]
    pub tty: bool,
    /// Container id.
    pub container: String,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Which streams to attach to.
#[derive(clap::Args)]
pub struct AttachArgs {
    /// Pass berthctl's stdin to the container (it must have been created with stdin open).
    #[arg(long, short)]
    pub interactive: bool,
    /// The container has a terminal (as it was created).
    #[arg(long, short)]
    pub tty: bool,
    /// Container id.
    pub container: String,
}

/// Runs the command; returns its exit code.
pub async fn exec(c: &CriClient, args: ExecArgs) -> anyhow::Result<i32> {
    let url = c
        .runtime()
        .exec(cri::ExecRequest {
            container_id: args.container.clone(),
            cmd: args.command.clone(),
            tty: args.tty,
            stdin: args.interactive,
            stdout: true,
            stderr: !args.tty,
        })
        .await
        .map_err(crate::status_message)
        .with_context(|| format!("Exec in {}", args.container))?
        .into_inner()
        .url;
    session(&url, args.interactive, args.tty).await
}

/// Attaches to the container's streams until they end; returns 0, or the error channel's code.
pub async fn attach(c: &CriClient, args: AttachArgs) -> anyhow::Result<i32> {
    let url = c
        .runtime()
        .attach(cri::AttachRequest {
            container_id: args.container.clone(),
            stdin: args.interactive,
            tty: args.tty,
            stdout: true,
            stderr: !args.tty,
        })
        .await
        .map_err(crate::status_message)
        .with_context(|| format!("Attach to {}", args.container))?
        .into_inner()
        .url;
    session(&url, args.interactive, args.tty).await
}

/// One streaming session at `url`: stdin (when `interactive`), stdout and stderr, the terminal
/// (when `tty`); returns the exit code the error channel gives.
async fn session(url: &str, interactive: bool, tty: bool) -> anyhow::Result<i32> {
    let (ws, protocol) = connect(url, "v5.channel.k8s.io, v4.channel.k8s.io").await?;
    let (mut sink, mut stream) = ws.split();
    let v5 = protocol == "v5.channel.k8s.io";
    let _raw = if tty && interactive {
        RawTerminal::enter()
    } else {
        None
    };
    if tty && let Some(size) = terminal_size() {
        sink.send(resize_message(size)).await?;
    }
    let (to_sink, mut outgoing) = tokio::sync::mpsc::channel::<Message>(16);
    if interactive {
        let to_sink = to_sink.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut frame = Vec::with_capacity(n + 1);
                        frame.push(STDIN);
                        frame.extend_from_slice(&buf[..n]);
                        if to_sink.send(Message::binary(frame)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            // v5 can say that stdin ended; v4 cannot.
            if v5 {
                let _ = to_sink.send(Message::binary(vec![CLOSE, STDIN])).await;
            }
        });
    }
    if tty {
        let to_sink = to_sink.clone();
        tokio::spawn(async move {
            let Ok(mut winch) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some(size) = terminal_size()
                    && to_sink.send(resize_message(size)).await.is_err()
                {
                    return;
                }
            }
        });
    }
    drop(to_sink);
    tokio::spawn(async move {
        while let Some(m) = outgoing.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut code = 0;
    while let Some(msg) = stream.next().await {
        let data = match msg.context("reading from the streaming server")? {
            Message::Binary(b) => b.to_vec(),
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((&channel, body)) = data.split_first() else {
            continue;
        };
        match channel {
            STDOUT => {
                stdout.write_all(body).await?;
                stdout.flush().await?;
            }
            STDERR => {
                stderr.write_all(body).await?;
                stderr.flush().await?;
            }
            ERROR if !body.is_empty() => code = exit_code(body)?,
            _ => {}
        }
    }
    Ok(code)
}

/// The exit code in the error channel's Status: 0 on Success, the ExitCode cause on
/// NonZeroExitCode, an error for any other failure.
fn exit_code(body: &[u8]) -> anyhow::Result<i32> {
    let status: serde_json::Value =
        serde_json::from_slice(body).context("the error channel's status")?;
    if status["status"] == "Success" {
        return Ok(0);
    }
    if status["reason"] == "NonZeroExitCode"
        && let Some(code) = status["details"]["causes"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
    {
        return Ok(code);
    }
    bail!(
        "exec failed: {}",
        status["message"].as_str().unwrap_or("unknown error")
    )
}

/// The WebSocket to a streaming URL (`http://host:port/path`) offering `protocols`, with the
/// channel protocol the server chose.
pub async fn connect(
    url: &str,
    protocols: &str,
) -> anyhow::Result<(WebSocketStream<tokio::net::TcpStream>, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("streaming URL {url:?}: berthctl speaks plain HTTP to the streaming server");
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut tcp = tokio::net::TcpStream::connect(host)
        .await
        .with_context(|| format!("connecting to the streaming server {host}"))?;
    let mut key = [0u8; 16];
    getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("random key: {e}"))?;
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    let request = format!(
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
         Sec-WebSocket-Protocol: {protocols}\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await?;
    // The response head, read byte by byte so that nothing of the WebSocket stream is taken.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            bail!("the streaming server's response head is too long");
        }
        let b = tcp
            .read_u8()
            .await
            .context("reading the upgrade response")?;
        head.push(b);
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("101") {
        bail!("the streaming server refused the upgrade: {status}");
    }
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
    };
    let mut hasher = sha1::Sha1::new();
    hasher.update(key.as_bytes());
    hasher.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let expected = base64::engine::general_purpose::STANDARD.encode(hasher.finalize());
    if header("sec-websocket-accept").as_deref() != Some(expected.as_str()) {
        bail!("the streaming server's WebSocket accept key is wrong");
    }
    let protocol = header("sec-websocket-protocol").unwrap_or_default();
    let ws = WebSocketStream::from_raw_socket(tcp, Role::Client, None).await;
    Ok((ws, protocol))
}

/// The terminal's size as (columns, rows), if stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    Some((ws.ws_col, ws.ws_row))
}

fn resize_message((width, height): (u16, u16)) -> Message {
    let mut frame = vec![RESIZE];
    frame.extend_from_slice(
        serde_json::json!({ "Width": width, "Height": height })
            .to_string()
            .as_bytes(),
    );
    Message::binary(frame)
}

/// berthctl's terminal in raw mode while it lives; restored on drop.
struct RawTerminal(rustix::termios::Termios);

impl RawTerminal {
    fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(Self(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_from_the_error_channel() {
        assert_eq!(exit_code(br#"{"status":"Success"}"#).ok(), Some(0));
        let failed = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;
        assert_eq!(exit_code(failed).ok(), Some(7));
        let other = br#"{"status":"Failure","message":"no such file"}"#;
        assert!(exit_code(other).is_err_and(|e| e.to_string().contains("no such file")));
    }
}
