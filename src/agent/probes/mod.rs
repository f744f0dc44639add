//! Container probes (startup, liveness, readiness): exec, tcpSocket, httpGet (`http`)
//! and gRPC, each in its own task with the probe's delay, period, timeout and thresholds.

pub mod grpc;
pub mod http;

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::watch;

use crate::client::CriClient;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Gates the other two; failing it restarts the container.
    Startup,
    /// Failing it restarts the container.
    Liveness,
    /// Only the ready flag.
    Readiness,
}

impl ProbeKind {
    /// The kind as the kubelet's metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

/// A probe's verdict after its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// Not decided yet.
    Unknown,
    /// Passed `successThreshold` times in a row.
    Success,
    /// Failed `failureThreshold` times in a row.
    Failure,
}

/// Where a probe connects and what it runs in.
#[derive(Clone)]
pub struct ProbeTarget {
    /// CRI client (for exec probes).
    pub client: CriClient,
    /// The container probed.
    pub container_id: String,
    /// Address of the pod's network: the pod IP, or 127.0.0.1 for host-network pods; empty
    /// when the pod has no IP.
    pub host: String,
    /// The container (for named ports).
    pub container: Container,
    /// Told each warning of a successful probe (an httpGet redirected to another host), as
    /// "<Kind> probe warning: ..." (the kubelet's ProbeWarning event).
    pub on_warning: Option<std::sync::Arc<dyn Fn(String) + Send + Sync>>,
}

/// A running probe; dropping it stops the probe.
pub struct ProbeHandle {
    /// The latest verdict.
    pub result: watch::Receiver<ProbeResult>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProbeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProbeHandle {
    /// The current verdict.
    pub fn get(&self) -> ProbeResult {
        *self.result.borrow()
    }
}

/// Starts probing. `gate` (the startup probe's verdict) holds the probe until it is Success.
pub fn spawn(
    kind: ProbeKind,
    probe: Probe,
    target: ProbeTarget,
    gate: Option<watch::Receiver<ProbeResult>>,
) -> ProbeHandle {
    let initial = match kind {
        ProbeKind::Readiness => ProbeResult::Failure,
        _ => ProbeResult::Unknown,
    };
    let (tx, rx) = watch::channel(initial);
    let task = tokio::spawn(run(kind, probe, target, gate, tx));
    ProbeHandle { result: rx, task }
}

/// How long past its timeout a probe attempt may run before it is cut off and failed.
const PROBE_TIMEOUT_SLACK: Duration = Duration::from_millis(500);

fn secs(v: Option<i32>, default: i32, min: i32) -> Duration {
    Duration::from_secs(v.unwrap_or(default).max(min) as u64)
}

async fn run(
    kind: ProbeKind,
    probe: Probe,
    target: ProbeTarget,
    mut gate: Option<watch::Receiver<ProbeResult>>,
    tx: watch::Sender<ProbeResult>,
) {
    if let Some(g) = gate.as_mut()
        && g.wait_for(|r| *r == ProbeResult::Success).await.is_err()
    {
        return;
    }
    tokio::time::sleep(secs(probe.initial_delay_seconds, 0, 0)).await;
    let period = secs(probe.period_seconds, 10, 1);
    let timeout = secs(probe.timeout_seconds, 1, 1);
    let success_threshold = probe.success_threshold.unwrap_or(1).max(1) as u32;
    let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1) as u32;
    let (mut successes, mut failures) = (0u32, 0u32);
    loop {
        // The handlers keep the timeout themselves (with their own messages); this is a backstop.
        let backstop = timeout + PROBE_TIMEOUT_SLACK;
        let outcome = match tokio::time::timeout(backstop, once(&probe, &target, timeout)).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {}s", timeout.as_secs())),
        };
        let result = if outcome.is_ok() {
            "success"
        } else {
            "failure"
        };
        crate::agent::metrics::agent()
            .probe_results
            .get_or_create(&[
                ("probe_type", kind.name().to_string()),
                ("result", result.to_string()),
            ])
            .inc();
        match outcome {
            Ok(warning) => {
                if let (Some(w), Some(tell)) = (warning, &target.on_warning) {
                    tell(format!("{} probe warning: {w}", kind.name()));
                }
                failures = 0;
                successes += 1;
                if successes >= success_threshold {
                    tx.send_if_modified(|r| {
                        std::mem::replace(r, ProbeResult::Success) != ProbeResult::Success
                    });
                }
            }
            Err(why) => {
                successes = 0;
                failures += 1;
                tracing::debug!(container = %target.container.name, ?kind, %why, failures, "probe failed");
                if failures >= failure_threshold {
                    if *tx.borrow() != ProbeResult::Failure {
                        tracing::info!(container = %target.container.name, ?kind, %why, "probe failed {failures} times");
                    }
                    tx.send_if_modified(|r| {
                        std::mem::replace(r, ProbeResult::Failure) != ProbeResult::Failure
                    });
                }
            }
        }
        if kind == ProbeKind::Startup && *tx.borrow() == ProbeResult::Success {
            // A passed startup probe is done; keep the verdict for the gated probes.
            tx.closed().await;
            return;
        }
        tokio::time::sleep(period).await;
    }
}

/// One probe attempt: passed (with a warning, if any) or failed (why).
pub(crate) async fn once(
    probe: &Probe,
    t: &ProbeTarget,
    timeout: Duration,
) -> Result<Option<String>, String> {
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let r = t
            .client
            .runtime()
            .exec_sync(cri::ExecSyncRequest {
                container_id: t.container_id.clone(),
                cmd,
                timeout: timeout.as_secs() as i64,
            })
            .await
            .map_err(|e| format!("exec: {}", e.message()))?
            .into_inner();
        return if r.exit_code == 0 {
            Ok(None)
        } else {
            Err(format!(
                "exit code {}: {}",
                r.exit_code,
                String::from_utf8_lossy(&r.stdout).trim()
            ))
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = resolve_port(&tcp.port, &t.container)?;
        let host = target_host(tcp.host.as_ref(), t)?;
        let auth = authority(&host, port);
        tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .map_err(|_| format!("dial tcp {auth}: i/o timeout"))?
        .map_err(|e| format!("dial tcp {auth}: {e}"))?;
        return Ok(None);
    }
    if let Some(http) = &probe.http_get {
        let port = resolve_port(&http.port, &t.container)?;
        let host = target_host(http.host.as_ref(), t)?;
        return http::check(http, &host, port, timeout).await;
    }
    if let Some(grpc) = &probe.grpc {
        let port = u16::try_from(grpc.port).map_err(|_| format!("invalid port {}", grpc.port))?;
        let host = target_host(None, t)?;
        let service = grpc.service.as_deref().unwrap_or("");
        return grpc::check(&host, port, service, timeout)
            .await
            .map(|()| None);
    }
    Err("probe has no handler".into())
}

/// `host:port`, with brackets around an IPv6 host.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The probe's own host, else the pod's address.
fn target_host(own: Option<&String>, t: &ProbeTarget) -> Result<String, String> {
    match own.filter(|h| !h.is_empty()) {
        Some(h) => Ok(h.clone()),
        None if t.host.is_empty() => Err("the pod has no IP address (no pod network)".into()),
        None => Ok(t.host.clone()),
    }
}

/// A container port by number or by name.
fn resolve_port(p: &IntOrString, c: &Container) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok())
                .ok_or_else(|| format!("container has no port named {name:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_get_brackets() {
        assert_eq!(authority("127.0.0.1", 80), "127.0.0.1:80");
        assert_eq!(authority("::1", 80), "[::1]:80");
    }
}
