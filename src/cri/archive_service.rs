//! Berth's image archive service (berth.images.v1.Archives) beside the CRI services: import
//! and export of image archives for nodes without a registry.

use std::io::Write;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::archive_api as api;
use crate::archive_api::archives_server::Archives;
use crate::image::{ChannelReader, ImageManager};

/// Size of the chunks an export is sent in.
const EXPORT_CHUNK: usize = 1024 * 1024;
/// Chunks queued between the network and the import or export.
const QUEUED_CHUNKS: usize = 16;

/// The archive service over an [`ImageManager`].
#[derive(Clone)]
pub struct ArchiveApi {
    images: ImageManager,
}

impl ArchiveApi {
    /// Serves `images`.
    pub fn new(images: ImageManager) -> Self {
        Self { images }
    }
}

/// A blocking writer sending chunks of an export to the response stream.
struct ChunkWriter {
    tx: mpsc::Sender<Result<api::ExportResponse, Status>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(EXPORT_CHUNK));
        self.tx
            .blocking_send(Ok(api::ExportResponse { data: data.into() }))
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the client stopped reading the export",
                )
            })
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(EXPORT_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= EXPORT_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[tonic::async_trait]
impl Archives for ArchiveApi {
    async fn import(
        &self,
        request: Request<Streaming<api::ImportRequest>>,
    ) -> Result<Response<api::ImportResponse>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("import: no archive was sent"))??;
        let name = if first.name.trim().is_empty() {
            "(unnamed)".to_string()
        } else {
            first.name.clone()
        };
        let (tx, rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
        // The archive's bytes go to the blocking reader as they arrive; a broken stream ends
        // them early, which the reader sees as a truncated archive.
        let shown = name.clone();
        let feeder = tokio::spawn(async move {
            if !first.data.is_empty() && tx.send(first.data).await.is_err() {
                return Ok(());
            }
            while let Some(message) = stream.next().await {
                let message = message?;
                if !message.data.is_empty() && tx.send(message.data).await.is_err() {
                    break;
                }
            }
            Ok::<(), Status>(())
        });
        let imported = self.images.import(name, ChannelReader::new(rx)).await;
        let streamed = feeder
            .await
            .map_err(|e| Status::internal(format!("import of {shown}: {e}")))?;
        let images = match (imported, streamed) {
            (Ok(images), _) => images,
            (Err(_), Err(status)) => {
                return Err(Status::new(
                    status.code(),
                    format!(
                        "import of {shown}: the archive's stream failed: {}",
                        status.message()
                    ),
                ));
            }
            (Err(e), Ok(())) => return Err(e.into()),
        };
        Ok(Response::new(api::ImportResponse {
            images: images
                .into_iter()
                .map(|v| api::ImportedImage {
                    id: v.record.id,
                    repo_tags: v.record.repo_tags,
                    repo_digests: v.record.repo_digests,
                    size: v.record.size,
                })
                .collect(),
        }))
    }

    type ExportStream = ReceiverStream<Result<api::ExportResponse, Status>>;

    async fn export(
        &self,
        request: Request<api::ExportRequest>,
    ) -> Result<Response<Self::ExportStream>, Status> {
        let references = request.into_inner().images;
        if references.iter().all(|r| r.trim().is_empty()) {
            return Err(Status::invalid_argument("export: no image named"));
        }
        // Unknown images are refused before the stream starts.
        for reference in &references {
            if self.images.status(reference)?.is_none() {
                return Err(Status::not_found(format!("image {reference} not found")));
            }
        }
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        let images = self.images.clone();
        tokio::spawn(async move {
            let writer = ChunkWriter {
                tx: tx.clone(),
                buf: Vec::with_capacity(EXPORT_CHUNK),
            };
            if let Err(e) = images.export(&references, writer).await {
                tracing::warn!(images = ?references, error = %e, "export failed");
                let _ = tx.send(Err(e.into())).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
