//! Pulling: resolve a reference to a platform manifest, then fetch, verify and unpack every missing
//! layer at once (each into its own snapshot), commit them in chain order, and record the image.
//!
//! Layers are never buffered whole or written twice: the compressed bytes are hashed as they
//! stream in and fed to a blocking task that decompresses, hashes the diff and unpacks. Compressed
//! layer blobs are not kept (only manifests and configs go to the content store): the snapshot is
//! the layer, verified against both its digest and its diff id.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::ImageError;
use super::hosts::Endpoint;
use super::manager::{Inner, PullProgress};
use super::manifest::{self, Descriptor, Document};
use super::reference::ImageRef;
use super::registry::{Credentials, PullAuth};
use super::unpack::{self, Compression};
use crate::store::ImageRecord;

/// Prefix of the snapshot keys a pull unpacks into; such snapshots are leftovers after a crash.
pub const EXTRACT_PREFIX: &str = "extract-";
/// The file beside each layer snapshot that holds its tape (see [`unpack::tape`]).
pub const TAPE_FILE: &str = "layer.tape";

/// One layer to fetch and unpack.
struct LayerJob<'a> {
    image: &'a ImageRef,
    endpoint: &'a Endpoint,
    creds: &'a Credentials,
    desc: &'a Descriptor,
    diff_id: &'a str,
    /// Snapshot key to unpack into.
    key: &'a str,
    index: usize,
    progress: &'a PullProgress,
    /// Set when another layer failed: stop early.
    cancel: &'a AtomicBool,
}

/// What resolving a reference produced.
struct Resolved {
    endpoint: Endpoint,
    creds: Credentials,
    /// Digest of what the tag points to (index or manifest): the repo digest.
    top_digest: String,
    manifest_digest: String,
    manifest_media_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// Classifies an oci-client error for `registry`.
fn registry_error(image: &ImageRef, what: &str, e: OciDistributionError) -> ImageError {
    let registry = image.registry.clone();
    match &e {
        OciDistributionError::AuthenticationFailure(m) => ImageError::AuthFailed {
            registry,
            reason: m.clone(),
        },
        OciDistributionError::UnauthorizedError { .. } => ImageError::AuthFailed {
            registry,
            reason: "the registry refused the credentials (401 Unauthorized)".into(),
        },
        OciDistributionError::ImageManifestNotFoundError(_) => {
            ImageError::NotFound(format!("image {image} not found: {what}: {e}"))
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|x| &x.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                ImageError::NotFound(format!("image {image} not found in {registry}: {e}"))
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                ImageError::AuthFailed {
                    registry,
                    reason: e.to_string(),
                }
            } else {
                ImageError::Unavailable {
                    registry,
                    reason: format!("{what}: {e}"),
                }
            }
        }
        OciDistributionError::ServerError { code, .. } => match code {
            401 | 403 => ImageError::AuthFailed {
                registry,
                reason: e.to_string(),
            },
            404 => ImageError::NotFound(format!("image {image} not found: {e}")),
            _ => ImageError::Unavailable {
                registry,
                reason: format!("{what}: {e}"),
            },
        },
        OciDistributionError::DigestError(_) => {
            ImageError::Corrupt(format!("image {image}: {what}: {e}"))
        }
        _ => {
            let text = error_chain(&e);
            if text.contains("401") || text.to_lowercase().contains("unauthorized") {
                ImageError::AuthFailed {
                    registry,
                    reason: text,
                }
            } else if text.contains("InvalidContentType") {
                // rustls read a plain-HTTP answer as a TLS record.
                ImageError::Unavailable {
                    reason: format!(
                        "{what}: {text}: the registry answered HTTPS with plain HTTP; to pull from it over HTTP, list it with --insecure-registry {registry} (registry.insecure_registries in the config file)"
                    ),
                    registry,
                }
            } else {
                ImageError::Unavailable {
                    registry,
                    reason: format!("{what}: {text}"),
                }
            }
        }
    }
}

/// The error of a blob's download stream (`what`: "config" or "layer"): a digest that did not
/// verify (oci-client checks it at the end of the stream too) is corrupt content; anything else
/// is the registry being unavailable.
fn blob_stream_error(image: &ImageRef, what: &str, digest: &str, e: &std::io::Error) -> ImageError {
    let text = error_chain(e);
    let digest_failed = e
        .get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>());
    if digest_failed || text.contains("Invalid digest") {
        ImageError::Corrupt(format!(
            "{what} {digest} of {image} failed verification: {text}"
        ))
    } else {
        ImageError::Unavailable {
            registry: image.registry.clone(),
            reason: format!("downloading {what} {digest}: {text}"),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

impl Inner {
    /// Awaits `step` of a pull (a request, a body's next chunk), giving up once it has gone
    /// `images.pull_progress_timeout_secs` without completing: `what` names what stalled.
    async fn within_progress_timeout<T>(
        &self,
        image: &ImageRef,
        what: impl FnOnce() -> String,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, ImageError> {
        let Some(limit) = self.pull_progress_timeout else {
            return Ok(step.await);
        };
        tokio::time::timeout(limit, step).await.map_err(|_| {
            ImageError::Stalled(format!(
                "pulling image {image}: {} received nothing for {:?} \
                 (images.pull_progress_timeout_secs); the pull is cancelled",
                what(),
                limit
            ))
        })
    }

    /// Fetches a manifest document and checks its digest when one was asked for.
    async fn fetch_document(
        &self,
        image: &ImageRef,
        ep: &Endpoint,
        reference: &oci_client::Reference,
        creds: &Credentials,
    ) -> Result<(Bytes, String), ImageError> {
        let (client, _) = self
            .clients
            .client_for(ep, creds, image)
            .map_err(ImageError::InvalidArgument)?;
        let (body, digest) = self
            .within_progress_timeout(
                image,
                || format!("the manifest {reference}"),
                client.pull_manifest_raw(reference, &creds.to_auth(), manifest::ACCEPTED),
            )
            .await?
            .map_err(|e| registry_error(image, "fetching manifest", e))?;
        // oci-client reads the body whole; this at least keeps it out of the content store
        // and the parser.
        if body.len() as u64 > manifest::MAX_MANIFEST_BYTES {
            return Err(ImageError::Hostile {
                image: image.to_string(),
                reason: format!(
                    "its manifest has {} bytes; Berth accepts at most {}",
                    body.len(),
                    manifest::MAX_MANIFEST_BYTES
                ),
            });
        }
        let actual = super::content::sha256_digest(&body);
        if let Some(want) = reference.digest()
            && want != actual
        {
            return Err(ImageError::Corrupt(format!(
                "manifest {want} of {image} failed verification: content hashes to {actual}"
            )));
        }
        let _ = digest;
        Ok((body, actual))
    }

    /// Resolves `image` on the first endpoint that answers, sending each endpoint the
    /// credentials `auth` holds for its host.
    async fn resolve(&self, image: &ImageRef, auth: &PullAuth) -> Result<Resolved, ImageError> {
        let endpoints = super::hosts::endpoints_for(&image.registry, &self.registry_config)
            .map_err(|e| ImageError::InvalidArgument(e.to_string()))?;
        let mut last_err = None;
        for ep in endpoints {
            let can = if image.digest.is_some() {
                ep.pull
            } else {
                ep.resolve
            };
            if !can {
                continue;
            }
            let creds = match auth.for_host(&ep.host, &self.registry_config) {
                Ok(creds) => creds,
                Err(e) => {
                    last_err = Some(ImageError::AuthFailed {
                        registry: ep.host.clone(),
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            match self.resolve_on(image, &ep, &creds).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(image = %image, endpoint = %ep.host, error = %e, "endpoint failed");
                    // Unusable and hostile content are final; try mirrors for the rest.
                    if matches!(
                        e,
                        ImageError::Unsupported(_)
                            | ImageError::Corrupt(_)
                            | ImageError::Hostile { .. }
                    ) {
                        return Err(e);
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| ImageError::Unavailable {
            registry: image.registry.clone(),
            reason: "no registry endpoint is configured for pulls".into(),
        }))
    }

    async fn resolve_on(
        &self,
        image: &ImageRef,
        ep: &Endpoint,
        creds: &Credentials,
    ) -> Result<Resolved, ImageError> {
        let (_, reference) = self
            .clients
            .client_for(ep, creds, image)
            .map_err(ImageError::InvalidArgument)?;
        let (body, top_digest) = self.fetch_document(image, ep, &reference, creds).await?;
        let shown = image.to_string();
        let mut doc = manifest::parse_document(&shown, &body)?;
        self.content
            .write(&top_digest, &body)
            .map_err(|e| ImageError::internal("storing manifest", e))?;
        let mut manifest_digest = top_digest.clone();
        if let Document::Index(list) = &doc {
            let (arch, variant) = manifest::host_platform();
            let chosen = manifest::choose_platform(&shown, list, arch, variant)?.clone();
            let declared =
                manifest::bounded_size(&shown, "manifest", &chosen, manifest::MAX_MANIFEST_BYTES)?;
            let mut by_digest = oci_client::Reference::with_digest(
                image.registry.clone(),
                image.repository.clone(),
                chosen.digest.clone(),
            );
            if !ep.is_origin {
                by_digest.set_mirror_registry(ep.host.clone());
            }
            let (body, digest) = self.fetch_document(image, ep, &by_digest, creds).await?;
            if digest != chosen.digest {
                return Err(ImageError::Corrupt(format!(
                    "manifest {} of {image} failed verification: content hashes to {digest}",
                    chosen.digest
                )));
            }
            if body.len() as u64 != declared {
                return Err(ImageError::Corrupt(format!(
                    "manifest {} of {image} has {} bytes, its index says {declared}",
                    chosen.digest,
                    body.len()
                )));
            }
            self.content
                .write(&digest, &body)
                .map_err(|e| ImageError::internal("storing manifest", e))?;
            doc = manifest::parse_document(&shown, &body)?;
            manifest_digest = digest;
        }
        match doc {
            Document::Manifest {
                config,
                layers,
                media_type,
            } => Ok(Resolved {
                endpoint: ep.clone(),
                creds: creds.clone(),
                top_digest,
                manifest_digest,
                manifest_media_type: media_type,
                config,
                layers,
            }),
            Document::Index(_) => Err(ImageError::Unsupported(format!(
                "image {image}: an index points to another index, which Berth does not follow"
            ))),
        }
    }

    /// Fetches the config into memory and the content store: its declared size is checked
    /// against [`manifest::MAX_CONFIG_BYTES`] first, and the download stops as soon as more
    /// bytes than declared arrive.
    async fn fetch_config(
        &self,
        image: &ImageRef,
        resolved: &Resolved,
        desc: &Descriptor,
    ) -> Result<Vec<u8>, ImageError> {
        let declared = manifest::bounded_size(
            &image.to_string(),
            "config",
            desc,
            manifest::MAX_CONFIG_BYTES,
        )?;
        if let Ok(bytes) = self.content.read(&desc.digest) {
            return Ok(bytes);
        }
        let (client, reference) = self
            .clients
            .client_for(&resolved.endpoint, &resolved.creds, image)
            .map_err(ImageError::InvalidArgument)?;
        let stalled = || format!("config {}", desc.digest);
        let mut stream = self
            .within_progress_timeout(
                image,
                stalled,
                client.pull_blob_stream(&reference, &oci_descriptor(desc)),
            )
            .await?
            .map_err(|e| registry_error(image, &format!("fetching config {}", desc.digest), e))?;
        let mut buf = Vec::new();
        while let Some(chunk) = self
            .within_progress_timeout(image, stalled, stream.next())
            .await?
        {
            let chunk = chunk.map_err(|e| blob_stream_error(image, "config", &desc.digest, &e))?;
            if (buf.len() + chunk.len()) as u64 > declared {
                return Err(ImageError::Corrupt(format!(
                    "config {} of {image} is larger than the {declared} bytes its manifest declares",
                    desc.digest
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        if buf.len() as u64 != declared {
            return Err(ImageError::Corrupt(format!(
                "blob {} of {image} has {} bytes, the manifest says {}",
                desc.digest,
                buf.len(),
                desc.size
            )));
        }
        self.content
            .write(&desc.digest, &buf)
            .map_err(|e| match e {
                super::content::ContentError::DigestMismatch { .. } => {
                    ImageError::Corrupt(format!("image {image}: {e}"))
                }
                e => ImageError::internal("storing config", e),
            })?;
        Ok(buf)
    }

    /// The whole pull of one reference.
    pub(super) async fn pull(
        self: Arc<Self>,
        image: ImageRef,
        auth: PullAuth,
        progress: Arc<PullProgress>,
    ) -> Result<ImageRecord, ImageError> {
        let _gc_guard = self.gc_lock.read().await;
        let resolved = self.resolve(&image, &auth).await?;
        let config_bytes = self
            .fetch_config(&image, &resolved, &resolved.config)
            .await?;
        let shown = image.to_string();
        let config = manifest::parse_config(&shown, &config_bytes)?;
        let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
        if diff_ids.len() != resolved.layers.len() {
            return Err(ImageError::Corrupt(format!(
                "image {image}: config lists {} layers (diff_ids) but the manifest has {}",
                diff_ids.len(),
                resolved.layers.len()
            )));
        }
        let chain = manifest::chain_ids(&diff_ids);
        progress.set_layers(&resolved.layers);

        // Fetch and unpack every layer whose snapshot is missing, all at once (bounded). On the
        // first failure the others are told to stop and are waited for: a layer task is never
        // aborted, because its blocking unpacker would go on writing into a removed snapshot.
        let cancel = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, desc) in resolved.layers.iter().enumerate() {
            if self.snapshots.stat(&chain[i]).is_ok() {
                progress.layer_done(i, desc.size.max(0) as u64);
                continue;
            }
            let this = self.clone();
            let image = image.clone();
            let endpoint = resolved.endpoint.clone();
            let creds = resolved.creds.clone();
            let desc = desc.clone();
            let diff_id = diff_ids[i].clone();
            let progress = progress.clone();
            let cancel = cancel.clone();
            tasks.spawn(async move {
                let _permit = this.downloads.acquire().await;
                let key = format!(
                    "{EXTRACT_PREFIX}{}-{}",
                    crate::util::random_hex(4),
                    &diff_id
                );
                if cancel.load(Ordering::Relaxed) {
                    return (i, key, Err(ImageError::Internal("pull cancelled".into())));
                }
                let layer = LayerJob {
                    image: &image,
                    endpoint: &endpoint,
                    creds: &creds,
                    desc: &desc,
                    diff_id: &diff_id,
                    key: &key,
                    index: i,
                    progress: &progress,
                    cancel: &cancel,
                };
                let result = this.fetch_layer(layer).await;
                (i, key, result)
            });
        }
        let mut extracted: Vec<Option<String>> = vec![None; chain.len()];
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((i, key, Ok(()))) => extracted[i] = Some(key),
                Ok((_, key, Err(e))) => {
                    self.discard_snapshot(&key);
                    if first_error.is_none() {
                        first_error = Some(e);
                        cancel.store(true, Ordering::Relaxed);
                    }
                }
                Err(join_err) => {
                    cancel.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(ImageError::internal("layer task", join_err));
                }
            }
        }
        if let Some(e) = first_error {
            for key in extracted.iter().flatten() {
                self.discard_snapshot(key);
            }
            return Err(e);
        }

        // Commit in chain order, each onto its parent.
        for (i, key) in extracted.iter().enumerate() {
            let Some(key) = key else { continue };
            let parent = if i == 0 {
                None
            } else {
                Some(chain[i - 1].as_str())
            };
            match self
                .snapshots
                .commit_with_parent(&chain[i], key, parent, Default::default())
            {
                Ok(()) => {}
                Err(berth_snapshotter::Error::AlreadyExists(_)) => self.discard_snapshot(key),
                Err(e) => {
                    for k in extracted.iter().skip(i).flatten() {
                        self.discard_snapshot(k);
                    }
                    return Err(ImageError::internal(
                        format!("committing layer {}", chain[i]),
                        e,
                    ));
                }
            }
        }

        let record = image_record(
            config.config.and_then(|c| c.user),
            &resolved.config,
            &resolved.layers,
            resolved.manifest_digest.clone(),
            resolved.manifest_media_type.clone(),
            chain,
            diff_ids,
        );
        let tags: Vec<String> = image.tagged().into_iter().collect();
        let digests = vec![image.with_digest(&resolved.top_digest)];
        self.store
            .put_image(record, &tags, &digests)
            .map_err(|e| ImageError::internal("recording image", e))
    }

    /// Streams one layer: hash the compressed bytes, decompress, hash the diff, unpack.
    async fn fetch_layer(&self, job: LayerJob<'_>) -> Result<(), ImageError> {
        let LayerJob {
            image,
            endpoint,
            creds,
            desc,
            diff_id,
            key,
            index,
            progress,
            cancel,
        } = job;
        let compression = Compression::from_media_type(&desc.media_type).ok_or_else(|| {
            ImageError::Unsupported(format!(
                "image {image}: layer {} has unsupported media type {:?}",
                desc.digest, desc.media_type
            ))
        })?;
        let (client, reference) = self
            .clients
            .client_for(endpoint, creds, image)
            .map_err(ImageError::InvalidArgument)?;
        let (dest, tape) = self.prepare_extraction(key)?;
        let stalled = || format!("layer {}", desc.digest);
        let mut stream = self
            .within_progress_timeout(
                image,
                stalled,
                client.pull_blob_stream(&reference, &oci_descriptor(desc)),
            )
            .await?
            .map_err(|e| registry_error(image, &format!("fetching layer {}", desc.digest), e))?;

        let (tx, rx) = mpsc::channel::<Bytes>(32);
        let image_name = image.to_string();
        let layer_name = desc.digest.clone();
        let max_bytes = self.max_unpacked_layer_bytes;
        let unpacker = tokio::task::spawn_blocking(move || {
            unpack_stream(
                ChannelReader::new(rx),
                compression,
                &dest,
                &tape,
                &image_name,
                &layer_name,
                max_bytes,
            )
        });

        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let expected = desc.size.max(0) as u64;
        let mut stream_error = None;
        let mut unpacker_stopped = false;
        loop {
            let chunk = match self
                .within_progress_timeout(image, stalled, stream.next())
                .await
            {
                Ok(Some(Ok(c))) => c,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    stream_error = Some(blob_stream_error(image, "layer", &desc.digest, &e));
                    break;
                }
                Err(e) => {
                    stream_error = Some(e);
                    break;
                }
            };
            if cancel.load(Ordering::Relaxed) {
                stream_error = Some(ImageError::Internal("pull cancelled".into()));
                break;
            }
            received += chunk.len() as u64;
            if received > expected {
                stream_error = Some(ImageError::Corrupt(format!(
                    "layer {} of {image} is larger than the {expected} bytes its manifest declares",
                    desc.digest
                )));
                break;
            }
            hasher.update(&chunk);
            progress.layer_bytes(index, chunk.len() as u64);
            crate::metrics::prometheus::runtime()
                .pull_bytes
                .inc_by(chunk.len() as u64);
            if tx.send(chunk).await.is_err() {
                unpacker_stopped = true; // its error is reported below
                break;
            }
        }
        drop(tx);
        let unpacked = unpacker
            .await
            .map_err(|e| ImageError::internal("unpack task", e))?;
        // An unpacker that refused the layer stopped the download: its reason comes first.
        if unpacker_stopped && let Err(e) = unpacked {
            return Err(e);
        }
        if let Some(e) = stream_error {
            return Err(e);
        }
        if received != expected {
            return Err(ImageError::Corrupt(format!(
                "layer {} of {image} is truncated: received {received} of {expected} bytes",
                desc.digest
            )));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest {
            return Err(ImageError::Corrupt(format!(
                "layer {} of {image} failed verification: content hashes to {actual}",
                desc.digest
            )));
        }
        let diff = unpacked?;
        if diff != diff_id {
            return Err(ImageError::Corrupt(format!(
                "layer {} of {image}: uncompressed content hashes to {diff}, the config's diff id is {diff_id}",
                desc.digest
            )));
        }
        progress.layer_done(index, expected);
        Ok(())
    }

    /// Prepares the extraction snapshot `key`: the directory a layer unpacks into and the
    /// path of its tape.
    pub(super) fn prepare_extraction(
        &self,
        key: &str,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf), ImageError> {
        self.snapshots
            .prepare(key, None, Default::default())
            .map_err(|e| ImageError::internal("preparing layer snapshot", e))?;
        let dest = self
            .snapshots
            .upper_dir(key)
            .map_err(|e| ImageError::internal("layer snapshot", e))?;
        let tape = self
            .snapshots
            .sidecar(key, TAPE_FILE)
            .map_err(|e| ImageError::internal("layer snapshot", e))?;
        Ok((dest, tape))
    }

    /// Removes a snapshot a failed pull prepared, logging (not failing) on error. On a full
    /// disk the metadata commit itself may find no room: the snapshot's files (discarded
    /// anyway) are deleted first to make some, and the removal is tried once more.
    pub(super) fn discard_snapshot(&self, key: &str) {
        let failed = match self.snapshots.remove(key) {
            Ok(()) | Err(berth_snapshotter::Error::NotFound(_)) => return,
            Err(e) => e,
        };
        if let Ok(dir) = self.snapshots.upper_dir(key)
            && let Ok(entries) = std::fs::read_dir(&dir)
        {
            for entry in entries.flatten() {
                let path = entry.path();
                let _ = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
        match self.snapshots.remove(key) {
            Ok(()) | Err(berth_snapshotter::Error::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(snapshot = key, error = %e, first = %failed, "removing extraction snapshot")
            }
        }
    }
}

/// The record of an image whose layers are all committed.
pub(super) fn image_record(
    user: Option<String>,
    config: &Descriptor,
    layers: &[Descriptor],
    manifest_digest: String,
    manifest_media_type: String,
    chain_ids: Vec<String>,
    diff_ids: Vec<String>,
) -> ImageRecord {
    let (uid, username) = user
        .map(|u| manifest::image_user(&u))
        .unwrap_or((None, String::new()));
    let size = layers.iter().fold(config.size.max(0) as u64, |sum, l| {
        sum.saturating_add(l.size.max(0) as u64)
    });
    let now = crate::util::unix_now();
    ImageRecord {
        id: config.digest.clone(),
        repo_tags: Vec::new(),
        repo_digests: Vec::new(),
        size,
        manifest_digest,
        manifest_media_type,
        chain_ids,
        diff_ids,
        created_unix: now,
        last_used_unix: now,
        pinned: false,
        uid,
        username,
    }
}

fn oci_descriptor(d: &Descriptor) -> oci_client::manifest::OciDescriptor {
    oci_client::manifest::OciDescriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.clone(),
        size: d.size,
        ..Default::default()
    }
}

/// Decompresses and unpacks, with the layer's tape, returning the diff id (sha256 of the
/// uncompressed tar). `layer` names the layer in errors; `max_bytes` bounds what it may unpack
/// to (0: no limit).
pub(super) fn unpack_stream(
    reader: impl Read,
    compression: Compression,
    dest: &std::path::Path,
    tape: &std::path::Path,
    image: &str,
    layer: &str,
    max_bytes: u64,
) -> Result<String, ImageError> {
    let buffered = std::io::BufReader::with_capacity(256 * 1024, reader);
    let (_stats, diff_id) =
        unpack::unpack_layer_limited(buffered, compression, dest, Some(tape), max_bytes)
            .inspect(|_| {
                crate::metrics::prometheus::runtime().layers_unpacked.inc();
            })
            .map_err(|e| match e {
                unpack::UnpackError::Escape { .. }
                | unpack::UnpackError::ExtensionTooLarge(_)
                | unpack::UnpackError::TooLarge { .. } => ImageError::Hostile {
                    image: image.to_string(),
                    reason: format!("layer {layer}: {e}"),
                },
                unpack::UnpackError::Invalid { .. } | unpack::UnpackError::Corrupt { .. } => {
                    ImageError::Corrupt(format!("image {image}: unpacking layer {layer}: {e}"))
                }
                // Disk trouble (full, read-only, I/O error) is Berth's side, not the image's.
                e => ImageError::Internal(format!("image {image}: unpacking layer {layer}: {e}")),
            })?;
    Ok(diff_id)
}

/// A blocking reader over chunks sent from an async task.
pub struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}
