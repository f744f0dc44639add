//! gRPC services the agent serves to the node's own clients on unix sockets (device plugin
//! registration, the pod resources API): the socket bound root-only, one left by an earlier
//! run replaced, and the `:authority` filter that clients built with older gRPC need.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::UnixListener;

use crate::cri::authority::AuthorityFilter;

/// Binds `socket` (making its directory), replacing a file an earlier run left there, readable
/// and writable by root only. A socket another process still serves (a kubelet, another
/// berthd's agent) is left to it: AddrInUse.
pub fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another process serves this socket (a kubelet, or another berthd's agent)",
        ));
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `routes` on `listener` until berthd ends; `what` names the service in logs.
pub async fn serve(listener: UnixListener, routes: tonic::service::Routes, what: &'static str) {
    let builder = auto::Builder::new(TokioExecutor::new()).http2_only();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a {what} connection");
                // An error that lasts (out of descriptors) must not spin a core.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn = builder
            .serve_connection(
                TokioIo::new(AuthorityFilter::new(stream)),
                TowerToHyperService::new(routes.clone()),
            )
            .into_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "{what} connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_served_one_left_alone() {
        let dir = std::env::temp_dir().join(format!("berth-grpcsock-{}", std::process::id()));
        let socket = dir.join("sub/kubelet.sock");
        let first = bind(&socket).expect("bind");
        // Served: left alone.
        let e = bind(&socket).expect_err("a served socket");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        // No longer served (its file left behind): replaced.
        drop(first);
        assert!(socket.exists());
        let _second = bind(&socket).expect("a stale socket replaced");
        let mode = std::fs::metadata(&socket)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
