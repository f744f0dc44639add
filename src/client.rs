//! CRI clients over a unix socket, for berthctl, the agent and the tests, and the unix-socket
//! gRPC channel they (and the agent's device plugin clients) connect with.

use std::path::{Path, PathBuf};

use anyhow::Context;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::archive_api::archives_client::ArchivesClient;

/// A connected CRI channel.
#[derive(Clone)]
pub struct CriClient {
    channel: Channel,
}

/// `unix:///x`, `unix:/x` or `/x` → `/x`.
pub fn socket_path(endpoint: &str) -> PathBuf {
    let p = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    PathBuf::from(p)
}

/// A gRPC channel to the server on the unix socket at `path`.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

impl CriClient {
    /// Connects to the CRI socket at `path`.
    pub async fn connect(path: &Path) -> anyhow::Result<Self> {
        let channel = unix_channel(path)
            .await
            .with_context(|| format!("connecting to CRI socket {}", path.display()))?;
        Ok(Self { channel })
    }

    /// The RuntimeService client.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(16 << 20)
    }

    /// The ImageService client.
    pub fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(16 << 20)
    }

    /// Berth's image archive service.
    pub fn archives(&self) -> ArchivesClient<Channel> {
        ArchivesClient::new(self.channel.clone()).max_decoding_message_size(16 << 20)
    }

    /// The underlying channel (e.g. for v1alpha2 clients).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }
}
