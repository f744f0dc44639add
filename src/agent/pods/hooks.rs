//! Container lifecycle hooks: postStart after a start, preStop before a stop (exec, httpGet,
//! tcpSocket and sleep handlers), each within a time budget.

use std::time::Duration;

use k8s_openapi::api::core::v1::{LifecycleHandler, Probe};

use crate::agent::probes::{self as probe, ProbeTarget};

/// Runs `handler` against the container in `target`, giving up after `budget`.
pub async fn run(
    handler: &LifecycleHandler,
    target: &ProbeTarget,
    budget: Duration,
) -> Result<(), String> {
    if let Some(sleep) = &handler.sleep {
        let d = Duration::from_secs(sleep.seconds.max(0) as u64).min(budget);
        tokio::time::sleep(d).await;
        return Ok(());
    }
    let as_probe = Probe {
        exec: handler.exec.clone(),
        http_get: handler.http_get.clone(),
        tcp_socket: handler.tcp_socket.clone(),
        ..Default::default()
    };
    let budget = budget.max(Duration::from_secs(1));
    match tokio::time::timeout(budget, probe::once(&as_probe, target, budget)).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(format!("did not finish in {}s", budget.as_secs())),
    }
}
