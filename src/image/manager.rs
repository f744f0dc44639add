//! The image manager: pulls (shared between concurrent callers), lookups, removal and garbage collection.
//!
//! Restart invariants (checked in [`ImageManager::open`]): snapshots named `extract-*` belong to
//! a pull that did not finish and are removed; committed snapshots no image references (and
//! with no children) are removed; content blobs no image references are removed; the content
//! store's ingest directory is emptied. Images are recorded only after all their layers are
//! committed, so a crash never leaves a half image visible.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use berth_snapshotter::{Kind, Snapshotter};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use tokio::sync::{RwLock, Semaphore};

use super::ImageError;
use super::content::ContentStore;
use super::manifest::Descriptor;
use super::pull::EXTRACT_PREFIX;
use super::reference::ImageRef;
use super::registry::{Clients, Credentials, PullAuth};
use crate::config::Config;
use crate::metrics::DiskCache;
use crate::store::{ImageRecord, Store};

type SharedPull = Shared<BoxFuture<'static, Result<ImageRecord, Arc<ImageError>>>>;

/// State shared by the manager and its pull tasks.
pub(super) struct Inner {
    pub(super) store: Store,
    pub(super) content: ContentStore,
    pub(super) snapshots: Arc<Snapshotter>,
    pub(super) clients: Clients,
    pub(super) registry_config: crate::config::RegistryConfig,
    pub(super) downloads: Semaphore,
    /// `images.max_unpacked_layer_bytes`: the most one layer may unpack to (0: no limit).
    pub(super) max_unpacked_layer_bytes: u64,
    /// `images.pinned_images`.
    pins: super::pins::Pins,
    /// `images.pull_progress_timeout_secs` (None: 0, never).
    pub(super) pull_progress_timeout: Option<std::time::Duration>,
    /// Pulls hold it shared; garbage collection holds it exclusively.
    pub(super) gc_lock: RwLock<()>,
    inflight: Mutex<HashMap<String, (SharedPull, Arc<PullProgress>)>>,
    /// The last walk of the snapshot and content directories (cleared by pulls and removals).
    pub(super) fs_usage: DiskCache<()>,
}

/// Pulls images and answers questions about them.
#[derive(Clone)]
pub struct ImageManager {
    pub(super) inner: Arc<Inner>,
}

/// An image as the CRI sees it.
#[derive(Debug, Clone)]
pub struct ImageView {
    /// The stored record.
    pub record: ImageRecord,
}

/// Bytes and inodes used by images.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImageFsUsage {
    /// Bytes on disk.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

/// Live progress of one pull: bytes received per layer.
#[derive(Debug, Default)]
pub struct PullProgress {
    layers: Mutex<Vec<(String, u64)>>,
    received: Mutex<Vec<Arc<AtomicU64>>>,
}

/// One layer's progress as reported to clients.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerProgress {
    /// Layer digest.
    pub digest: String,
    /// Bytes received so far.
    pub received: u64,
    /// Bytes in the layer.
    pub total: u64,
}

impl PullProgress {
    pub(super) fn set_layers(&self, layers: &[Descriptor]) {
        let mut l = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        *l = layers
            .iter()
            .map(|d| (d.digest.clone(), d.size.max(0) as u64))
            .collect();
        let mut r = self.received.lock().unwrap_or_else(|p| p.into_inner());
        *r = layers.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    }

    fn counter(&self, i: usize) -> Option<Arc<AtomicU64>> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(i)
            .cloned()
    }

    pub(super) fn layer_bytes(&self, i: usize, n: u64) {
        if let Some(c) = self.counter(i) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn layer_done(&self, i: usize, total: u64) {
        if let Some(c) = self.counter(i) {
            c.store(total, Ordering::Relaxed);
        }
    }

    /// A snapshot of every layer's progress.
    pub fn layers(&self) -> Vec<LayerProgress> {
        let l = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        let r = self.received.lock().unwrap_or_else(|p| p.into_inner());
        l.iter()
            .zip(r.iter())
            .map(|((digest, total), c)| LayerProgress {
                digest: digest.clone(),
                received: c.load(Ordering::Relaxed),
                total: *total,
            })
            .collect()
    }
}

impl ImageManager {
    /// Opens the stores under the configured root and cleans what a crash left behind.
    pub fn open(config: &Config, store: Store) -> Result<Self, ImageError> {
        let content = ContentStore::open(&config.content_dir())
            .map_err(|e| ImageError::internal("opening content store", e))?;
        let snapshots = Snapshotter::open(&config.snapshots_dir())
            .map_err(|e| ImageError::internal("opening snapshotter", e))?;
        let inner = Inner {
            store,
            content,
            snapshots: Arc::new(snapshots),
            clients: Clients::new(std::time::Duration::from_secs(
                config.registry.connect_timeout_secs,
            )),
            registry_config: config.registry.clone(),
            downloads: Semaphore::new(config.registry.max_concurrent_downloads.max(1)),
            max_unpacked_layer_bytes: config.images.max_unpacked_layer_bytes,
            pins: super::pins::Pins::new(&config.images.pinned_images)
                .map_err(|e| ImageError::InvalidArgument(e.to_string()))?,
            pull_progress_timeout: progress_timeout(config.images.pull_progress_timeout_secs)?,
            gc_lock: RwLock::new(()),
            inflight: Mutex::new(HashMap::new()),
            fs_usage: DiskCache::default(),
        };
        let manager = Self {
            inner: Arc::new(inner),
        };
        manager.recover()?;
        Ok(manager)
    }

    /// Whether the image is pinned (its record, or `images.pinned_images`): image garbage
    /// collection passes it by.
    pub fn is_pinned(&self, record: &ImageRecord) -> bool {
        self.inner.pins.covers(record)
    }

    /// The snapshotter (containers prepare their rootfs on the image's top chain id).
    pub fn snapshotter(&self) -> Arc<Snapshotter> {
        self.inner.snapshots.clone()
    }

    fn recover(&self) -> Result<(), ImageError> {
        let list = self
            .inner
            .snapshots
            .list()
            .map_err(|e| ImageError::internal("listing snapshots", e))?;
        for info in list {
            if info.name.starts_with(EXTRACT_PREFIX) {
                tracing::info!(snapshot = %info.name, "removing unfinished layer extraction");
                self.inner
                    .snapshots
                    .remove(&info.name)
                    .map_err(|e| ImageError::internal("removing stale extraction", e))?;
            }
        }
        self.collect_garbage_locked()
    }

    /// Pulls `reference`, sharing the work with a concurrent pull of the same reference.
    /// `creds` (from the request) are sent to the image's registry only.
    pub async fn pull(&self, reference: &str, creds: Credentials) -> Result<ImageView, ImageError> {
        self.pull_with_auth(reference, creds, "").await
    }

    /// Like [`Self::pull`], with `creds` given for `server_address` (a CRI
    /// `AuthConfig.server_address`; empty: the image's registry): see [`PullAuth`].
    pub async fn pull_with_auth(
        &self,
        reference: &str,
        creds: Credentials,
        server_address: &str,
    ) -> Result<ImageView, ImageError> {
        let image = ImageRef::parse(reference)?;
        let creds = PullAuth::new(creds, server_address, &image.registry);
        let key = format!("{image}|{creds:?}");
        let fut = {
            let mut inflight = self
                .inner
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match inflight.get(&key) {
                Some((f, _)) => f.clone(),
                None => {
                    let progress = Arc::new(PullProgress::default());
                    let inner = self.inner.clone();
                    let key2 = key.clone();
                    let started = std::time::Instant::now();
                    let task =
                        tokio::spawn(inner.clone().pull(image.clone(), creds, progress.clone()));
                    let manager = self.clone();
                    let fut: SharedPull = async move {
                        let result = match task.await {
                            Ok(r) => r.map_err(Arc::new),
                            Err(e) => Err(Arc::new(ImageError::internal("pull task", e))),
                        };
                        let metrics = crate::metrics::prometheus::runtime();
                        let outcome = if result.is_ok() { "success" } else { "failure" };
                        metrics
                            .pulls
                            .get_or_create(&[("result", outcome.to_string())])
                            .inc();
                        if result.is_ok() {
                            metrics
                                .pull_seconds
                                .observe(started.elapsed().as_secs_f64());
                        }
                        if result.is_err() {
                            // Manifests and configs a failed pull stored belong to no image.
                            let _gc = manager.inner.gc_lock.write().await;
                            if let Err(e) = manager.collect_garbage_locked() {
                                tracing::warn!(error = %e, "cleaning up after a failed pull");
                            }
                        }
                        inner
                            .inflight
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&key2);
                        inner.fs_usage.clear();
                        crate::util::release_free_memory();
                        result
                    }
                    .boxed()
                    .shared();
                    inflight.insert(key, (fut.clone(), progress));
                    // Drive it even if every caller goes away, so a cancelled request
                    // neither aborts the pull half-way nor leaves it unfinished.
                    tokio::spawn(fut.clone());
                    fut
                }
            }
        };
        match fut.await {
            Ok(record) => Ok(ImageView { record }),
            Err(e) => Err(clone_error(&e)),
        }
    }

    /// Progress of running pulls, by reference.
    pub fn pulls_in_progress(&self) -> Vec<(String, Vec<super::manager::LayerProgress>)> {
        let inflight = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        inflight
            .iter()
            .map(|(k, (_, p))| {
                (
                    k.split('|').next().unwrap_or_default().to_string(),
                    p.layers(),
                )
            })
            .collect()
    }

    /// Every image, optionally only those a reference names.
    pub fn list(&self, filter: Option<&str>) -> Result<Vec<ImageView>, ImageError> {
        if let Some(f) = filter.filter(|f| !f.is_empty()) {
            return Ok(self.status(f)?.into_iter().collect());
        }
        let images = self
            .inner
            .store
            .list_images()
            .map_err(|e| ImageError::internal("listing images", e))?;
        Ok(images
            .into_iter()
            .map(|record| ImageView { record })
            .collect())
    }

    /// Finds an image by id (full or a unique prefix of at least 6 hex digits), tag or digest reference.
    pub fn status(&self, reference: &str) -> Result<Option<ImageView>, ImageError> {
        let store = &self.inner.store;
        let db = |e| ImageError::internal("reading image metadata", e);
        let hexpart = reference.strip_prefix("sha256:").unwrap_or(reference);
        let looks_like_id = hexpart.len() >= 6
            && hexpart
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if looks_like_id {
            if hexpart.len() == 64
                && let Some(record) = store.get_image(&format!("sha256:{hexpart}")).map_err(db)?
            {
                return Ok(Some(ImageView { record }));
            }
            let prefix = format!("sha256:{hexpart}");
            let matches: Vec<ImageRecord> = store
                .list_images()
                .map_err(db)?
                .into_iter()
                .filter(|r| r.id.starts_with(&prefix))
                .collect();
            if matches.len() == 1 {
                return Ok(matches
                    .into_iter()
                    .next()
                    .map(|record| ImageView { record }));
            }
            if reference.starts_with("sha256:") {
                return Ok(None);
            }
        }
        let image = ImageRef::parse(reference)?;
        let name = match (&image.digest, image.tagged()) {
            (Some(d), _) => image.with_digest(d),
            (None, Some(t)) => t,
            (None, None) => return Ok(None),
        };
        let Some(id) = store.resolve_image_name(&name).map_err(db)? else {
            return Ok(None);
        };
        Ok(store
            .get_image(&id)
            .map_err(db)?
            .map(|record| ImageView { record }))
    }

    /// Read-only mounts showing the image's root filesystem, for verbose status and debugging.
    pub fn rootfs_mounts(&self, image: &ImageRecord) -> serde_json::Value {
        let Some(top) = image.chain_ids.last() else {
            return serde_json::Value::Null;
        };
        match self.inner.snapshots.mounts(top) {
            Ok(mounts) => serde_json::Value::Array(
                mounts
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "type": m.fstype,
                            "source": m.source,
                            "options": m.options,
                            "cwd": m.cwd,
                        })
                    })
                    .collect(),
            ),
            Err(e) => serde_json::Value::String(e.to_string()),
        }
    }

    /// The image config JSON, for verbose status.
    pub fn config_json(&self, image: &ImageRecord) -> Option<serde_json::Value> {
        let bytes = self.inner.content.read(&image.id).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Removes the image a reference names, with all its names; absent is not an error.
    /// Returns whether something was removed.
    pub async fn remove(&self, reference: &str) -> Result<bool, ImageError> {
        let Some(view) = self.status(reference)? else {
            return Ok(false);
        };
        let _gc = self.inner.gc_lock.write().await;
        self.inner
            .store
            .remove_image(&view.record.id)
            .map_err(|e| ImageError::internal("removing image record", e))?;
        self.collect_garbage_locked()?;
        Ok(true)
    }

    /// Removes snapshots and blobs no image references. Caller holds `gc_lock` (or is alone).
    pub(super) fn collect_garbage_locked(&self) -> Result<(), ImageError> {
        let images = self
            .inner
            .store
            .list_images()
            .map_err(|e| ImageError::internal("listing images", e))?;
        let mut keep_snapshots: HashSet<String> = HashSet::new();
        let mut keep_blobs: HashSet<String> = HashSet::new();
        for image in &images {
            keep_snapshots.extend(image.chain_ids.iter().cloned());
            keep_blobs.insert(image.id.clone());
            keep_blobs.insert(image.manifest_digest.clone());
            for d in &image.repo_digests {
                if let Some((_, digest)) = d.rsplit_once('@') {
                    keep_blobs.insert(digest.to_string());
                }
            }
        }
        let snaps = &self.inner.snapshots;
        loop {
            let list = snaps
                .list()
                .map_err(|e| ImageError::internal("listing snapshots", e))?;
            let parents: HashSet<String> = list.iter().filter_map(|i| i.parent.clone()).collect();
            let victims: Vec<String> = list
                .into_iter()
                .filter(|i| {
                    matches!(i.kind, Kind::Committed)
                        && !keep_snapshots.contains(&i.name)
                        && !parents.contains(&i.name)
                })
                .map(|i| i.name)
                .collect();
            if victims.is_empty() {
                break;
            }
            for name in victims {
                tracing::debug!(snapshot = %name, "removing unused layer snapshot");
                snaps
                    .remove(&name)
                    .map_err(|e| ImageError::internal(format!("removing snapshot {name}"), e))?;
            }
        }
        let blobs = self
            .inner
            .content
            .list()
            .map_err(|e| ImageError::internal("listing content", e))?;
        for digest in blobs {
            if !keep_blobs.contains(&digest) {
                self.inner
                    .content
                    .delete(&digest)
                    .map_err(|e| ImageError::internal("removing blob", e))?;
            }
        }
        self.inner.fs_usage.clear();
        Ok(())
    }

    /// Bytes and inodes used by image layers (and containers' writable layers) and content,
    /// measured at most every [`crate::metrics::disk_cache::DISK_TTL`] and after each pull or
    /// removal.
    pub fn fs_usage(&self) -> ImageFsUsage {
        let (bytes, inodes) = self.inner.fs_usage.usage(&(), || {
            let (sb, si) = crate::util::disk_usage(self.inner.snapshots.root());
            let (cb, ci) = self.inner.content.usage();
            (sb + cb, si + ci)
        });
        ImageFsUsage { bytes, inodes }
    }
}

/// Rebuilds an error for each caller of a shared pull.
pub(super) fn clone_error(e: &ImageError) -> ImageError {
    match e {
        ImageError::InvalidReference(r) => ImageError::InvalidArgument(r.to_string()),
        ImageError::InvalidArgument(m) => ImageError::InvalidArgument(m.clone()),
        ImageError::NotFound(m) => ImageError::NotFound(m.clone()),
        ImageError::Unavailable { registry, reason } => ImageError::Unavailable {
            registry: registry.clone(),
            reason: reason.clone(),
        },
        ImageError::AuthFailed { registry, reason } => ImageError::AuthFailed {
            registry: registry.clone(),
            reason: reason.clone(),
        },
        ImageError::Unsupported(m) => ImageError::Unsupported(m.clone()),
        ImageError::Corrupt(m) => ImageError::Corrupt(m.clone()),
        ImageError::Hostile { image, reason } => ImageError::Hostile {
            image: image.clone(),
            reason: reason.clone(),
        },
        ImageError::Stalled(m) => ImageError::Stalled(m.clone()),
        ImageError::Internal(m) => ImageError::Internal(m.clone()),
    }
}

/// `images.pull_progress_timeout_secs` as a duration: 0 is none; negative or absurd is refused.
fn progress_timeout(secs: f64) -> Result<Option<std::time::Duration>, ImageError> {
    if secs == 0.0 {
        return Ok(None);
    }
    std::time::Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|e| {
            ImageError::InvalidArgument(format!("images.pull_progress_timeout_secs {secs}: {e}"))
        })
}
