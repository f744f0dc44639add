//! The unix socket server: one berthd per root (a lock file), stale sockets replaced, mode 0660.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use k8s_cri::v1::image_service_server::ImageServiceServer;
use k8s_cri::v1::runtime_service_server::RuntimeServiceServer;
use k8s_cri::v1alpha2 as a2;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use super::v1alpha2::{ImageV1Alpha2, RuntimeV1Alpha2};
use super::{ImageApi, RuntimeApi};

/// Largest CRI message accepted or sent (containerd uses 16 MiB too).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// How long requests in flight may run after SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Holds the root lock for as long as the daemon runs.
pub struct ServerHandle {
    _lock: std::fs::File,
    socket: PathBuf,
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Takes the root's lock, refusing to run beside another berthd on the same root.
pub fn lock_root(root: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(root)
        .with_context(|| format!("creating root dir {}", root.display()))?;
    let path = root.join("berthd.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening lock file {}", path.display()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another berthd (pid {}) is already running with root {}; stop it first or use another --root",
                pid.trim(),
                root.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("locking {}", path.display())),
    }
    file.set_len(0).ok();
    std::fs::write(&path, std::process::id().to_string()).ok();
    Ok(file)
}

/// Binds the socket (replacing a stale one) and serves until `shutdown` resolves.
pub async fn serve(
    lock: std::fs::File,
    socket: &Path,
    runtime: RuntimeApi,
    images: ImageApi,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating socket dir {}", dir.display()))?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => tracing::info!(socket = %socket.display(), "replaced stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", socket.display()));
        }
    }
    let listener = UnixListener::bind(socket)
        .with_context(|| format!("binding CRI socket {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting mode of {}", socket.display()))?;
    let handle = ServerHandle {
        _lock: lock,
        socket: socket.to_owned(),
    };
    tracing::info!(socket = %socket.display(), "serving CRI v1 and v1alpha2");
    // Clients such as the kubelet keep connections open forever: after the signal, requests in
    // flight get a short grace period, then the server stops regardless.
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping_tx.send(());
    };
    let grace = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            tracing::info!("grace period over: closing remaining connections");
        } else {
            std::future::pending::<()>().await;
        }
    };
    let server = tonic::transport::Server::builder()
        .add_service(
            RuntimeServiceServer::new(runtime.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            ImageServiceServer::new(images.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            a2::runtime_service_server::RuntimeServiceServer::new(RuntimeV1Alpha2(runtime))
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            a2::image_service_server::ImageServiceServer::new(ImageV1Alpha2(images))
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown);
    let result = tokio::select! {
        r = server => r.context("CRI server"),
        () = grace => Ok(()),
    };
    drop(handle);
    result
}
