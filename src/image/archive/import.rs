//! Importing: what an archive held becomes images only after every manifest, config and layer
//! has been checked against its digest and the config's diff ids; then the layers are
//! committed and the images recorded, all or nothing.

use std::collections::HashMap;
use std::io::Read;

use super::super::manager::{ImageManager, Inner, clone_error};
use super::super::manifest::{self, Descriptor, Document};
use super::super::pull::image_record;
use super::super::reference::ImageRef;
use super::super::unpack::Compression;
use super::super::{ImageError, ImageView};
use super::layout::{
    CONFIG_MEDIA_TYPE, DOCKER_MANIFEST_FILE, DockerImage, INDEX_FILE, ImageManifest, Index,
    NAME_ANNOTATION, REF_NAME_ANNOTATION, blob_path,
};
use super::reading::{ArchiveContents, Found, LayerBlob};
use crate::image::content::sha256_digest;
use crate::store::ImageRecord;

/// One image to record.
struct Planned {
    record: ImageRecord,
    tags: Vec<String>,
    digests: Vec<String>,
    /// Archive paths of the layers, bottom first.
    layers: Vec<String>,
    /// Manifests and the config, for the content store: (digest, bytes).
    blobs: Vec<(String, Vec<u8>)>,
}

/// The digest a blob's file name states (`blobs/sha256/<hex>`, `<hex>.json`), if any.
fn named_digest(path: &str) -> Option<String> {
    let base = path.rsplit('/').next()?;
    let hex = base.strip_suffix(".json").unwrap_or(base);
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then(|| format!("sha256:{hex}"))
}

/// A reference as Berth records it (`docker.io/library/busybox:latest`); `None` for a bare tag
/// (`latest`) or something that is not a reference.
fn full_name(name: &str) -> Option<ImageRef> {
    if !name.contains(':') && !name.contains('/') {
        return None;
    }
    match ImageRef::parse(name) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(name, error = %e, "ignoring an image name in an archive");
            None
        }
    }
}

/// Checks an archive's files against what manifests and configs say of them.
struct Checker<'a> {
    name: &'a str,
    contents: &'a ArchiveContents,
}

impl Checker<'_> {
    fn corrupt(&self, what: String) -> ImageError {
        ImageError::Corrupt(format!("archive {}: {what}", self.name))
    }

    /// A manifest or config by digest, verified.
    fn document(&self, digest: &str, size: i64) -> Result<Vec<u8>, ImageError> {
        let path = blob_path(digest);
        let bytes = match self.contents.find(&path) {
            Some((_, Found::Document(bytes))) => bytes,
            Some((_, Found::Layer(_))) => {
                return Err(self.corrupt(format!(
                    "entry {path} should be a manifest or config but is not JSON"
                )));
            }
            None => return Err(self.corrupt(format!("blob {digest} is missing (entry {path})"))),
        };
        let actual = sha256_digest(bytes);
        if actual != digest {
            return Err(self.corrupt(format!(
                "entry {path}: content hashes to {actual}, not {digest}"
            )));
        }
        if size >= 0 && bytes.len() as i64 != size {
            return Err(self.corrupt(format!(
                "entry {path} has {} bytes, its descriptor says {size}",
                bytes.len()
            )));
        }
        Ok(bytes.to_vec())
    }

    /// A layer by archive path, checked against the digest it should have (if known) and the
    /// config's diff id.
    fn layer(
        &self,
        path: &str,
        digest: Option<&str>,
        diff_id: &str,
    ) -> Result<&LayerBlob, ImageError> {
        let (found_at, layer) = match self.contents.find(path) {
            Some((at, Found::Layer(layer))) => (at, layer),
            Some((at, Found::Document(_))) => {
                return Err(self.corrupt(format!("entry {at} should be a layer but is not a tar")));
            }
            None => return Err(self.corrupt(format!("layer {path} is missing"))),
        };
        let want = digest
            .map(str::to_string)
            .or_else(|| named_digest(&found_at));
        if let Some(want) = want
            && layer.digest != want
        {
            return Err(self.corrupt(format!(
                "entry {found_at}: content hashes to {}, not {want}",
                layer.digest
            )));
        }
        let actual = match &layer.unpacked {
            Ok((_, diff)) => diff,
            Err(e) => return Err(clone_error(e)),
        };
        if actual != diff_id {
            return Err(self.corrupt(format!(
                "entry {found_at}: its uncompressed content hashes to {actual}, the image config's diff id is {diff_id}"
            )));
        }
        Ok(layer)
    }

    /// The config's user and diff ids, checked against the number of layers.
    fn config(
        &self,
        shown: &str,
        bytes: &[u8],
        layers: usize,
    ) -> Result<(Option<String>, Vec<String>), ImageError> {
        let config = manifest::parse_config(shown, bytes)?;
        let diff_ids = config.rootfs.map(|r| r.diff_ids).unwrap_or_default();
        if diff_ids.len() != layers {
            return Err(self.corrupt(format!(
                "image {shown}: its config lists {} layers, its manifest {layers}",
                diff_ids.len()
            )));
        }
        Ok((config.config.and_then(|c| c.user), diff_ids))
    }

    /// The images an OCI layout's index names.
    fn plan_index(&self, index: &Index) -> Result<Vec<Planned>, ImageError> {
        let mut plans = Vec::new();
        for entry in &index.manifests {
            let top = self.document(&entry.digest, entry.size)?;
            let names: Vec<ImageRef> = [NAME_ANNOTATION, REF_NAME_ANNOTATION]
                .iter()
                .find_map(|key| entry.annotations.get(*key))
                .and_then(|n| full_name(n))
                .into_iter()
                .collect();
            let shown = names
                .first()
                .map_or_else(|| entry.digest.clone(), ToString::to_string);
            let mut blobs = vec![(entry.digest.clone(), top.clone())];
            let mut manifest_digest = entry.digest.clone();
            let mut doc = manifest::parse_document(&shown, &top)?;
            if let Document::Index(list) = &doc {
                let (arch, variant) = manifest::host_platform();
                let chosen = manifest::choose_platform(&shown, list, arch, variant)?.clone();
                let child = self.document(&chosen.digest, chosen.size)?;
                doc = manifest::parse_document(&shown, &child)?;
                blobs.push((chosen.digest.clone(), child));
                manifest_digest = chosen.digest;
            }
            let Document::Manifest {
                config,
                layers,
                media_type,
            } = doc
            else {
                return Err(ImageError::Unsupported(format!(
                    "archive {}: image {shown}: an index points to another index, which Berth does not follow",
                    self.name
                )));
            };
            let config_bytes = self.document(&config.digest, config.size)?;
            let (user, diff_ids) = self.config(&shown, &config_bytes, layers.len())?;
            let mut paths = Vec::new();
            for (desc, diff_id) in layers.iter().zip(&diff_ids) {
                let path = blob_path(&desc.digest);
                let layer = self.layer(&path, Some(&desc.digest), diff_id)?;
                if desc.size >= 0 && layer.size != desc.size as u64 {
                    return Err(self.corrupt(format!(
                        "entry {path} has {} bytes, the manifest says {}",
                        layer.size, desc.size
                    )));
                }
                paths.push(path);
            }
            blobs.push((config.digest.clone(), config_bytes));
            let chain = manifest::chain_ids(&diff_ids);
            plans.push(Planned {
                record: image_record(
                    user,
                    &config,
                    &layers,
                    manifest_digest,
                    media_type,
                    chain,
                    diff_ids,
                ),
                tags: names.iter().filter_map(ImageRef::tagged).collect(),
                digests: names.iter().map(|n| n.with_digest(&entry.digest)).collect(),
                layers: paths,
                blobs,
            });
        }
        Ok(plans)
    }

    /// The images `docker save`'s `manifest.json` lists; Berth writes each an OCI manifest.
    fn plan_docker(&self, images: &[DockerImage]) -> Result<Vec<Planned>, ImageError> {
        let mut plans = Vec::new();
        for image in images {
            let config_bytes = match self.contents.find(&image.config) {
                Some((_, Found::Document(bytes))) => bytes.to_vec(),
                _ => {
                    return Err(
                        self.corrupt(format!("config {} is missing or not JSON", image.config))
                    );
                }
            };
            let id = sha256_digest(&config_bytes);
            if let Some(named) = named_digest(&image.config)
                && named != id
            {
                return Err(self.corrupt(format!(
                    "entry {}: content hashes to {id}, not {named}",
                    image.config
                )));
            }
            let names: Vec<ImageRef> = image
                .repo_tags
                .iter()
                .flatten()
                .filter_map(|t| full_name(t))
                .collect();
            let shown = names
                .first()
                .map_or_else(|| id.clone(), ToString::to_string);
            let (user, diff_ids) = self.config(&shown, &config_bytes, image.layers.len())?;
            let mut layers = Vec::new();
            for (path, diff_id) in image.layers.iter().zip(&diff_ids) {
                let layer = self.layer(path, None, diff_id)?;
                let media_type = match layer.compression {
                    Compression::None => "application/vnd.oci.image.layer.v1.tar",
                    Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
                    Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
                };
                layers.push(Descriptor {
                    media_type: media_type.into(),
                    digest: layer.digest.clone(),
                    size: layer.size as i64,
                    platform: None,
                });
            }
            let config = Descriptor {
                media_type: CONFIG_MEDIA_TYPE.into(),
                digest: id.clone(),
                size: config_bytes.len() as i64,
                platform: None,
            };
            let manifest = serde_json::to_vec(&ImageManifest::new(&config, &layers))
                .map_err(|e| ImageError::internal("writing a manifest", e))?;
            let manifest_digest = sha256_digest(&manifest);
            let chain = manifest::chain_ids(&diff_ids);
            plans.push(Planned {
                record: image_record(
                    user,
                    &config,
                    &layers,
                    manifest_digest.clone(),
                    manifest::OCI_MANIFEST.into(),
                    chain,
                    diff_ids,
                ),
                tags: names.iter().filter_map(ImageRef::tagged).collect(),
                digests: Vec::new(),
                layers: image.layers.clone(),
                blobs: vec![(id, config_bytes), (manifest_digest, manifest)],
            });
        }
        Ok(plans)
    }

    /// Every image of the archive, one plan per image id.
    fn plan(&self) -> Result<Vec<Planned>, ImageError> {
        let json = |path: &str| match self.contents.find(path) {
            Some((_, Found::Document(bytes))) => Some(bytes),
            _ => None,
        };
        let docker: Vec<DockerImage> = match json(DOCKER_MANIFEST_FILE) {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| self.corrupt(format!("entry {DOCKER_MANIFEST_FILE}: {e}")))?,
            None => Vec::new(),
        };
        let mut plans = match json(INDEX_FILE) {
            Some(bytes) => {
                let index: Index = serde_json::from_slice(bytes)
                    .map_err(|e| self.corrupt(format!("entry {INDEX_FILE}: {e}")))?;
                let mut plans = self.plan_index(&index)?;
                // Docker's archives carry both files; its RepoTags name images the index may not.
                let tags: HashMap<String, Vec<String>> = self
                    .plan_docker(&docker)?
                    .into_iter()
                    .map(|p| (p.record.id, p.tags))
                    .collect();
                for plan in &mut plans {
                    plan.tags
                        .extend(tags.get(&plan.record.id).into_iter().flatten().cloned());
                }
                plans
            }
            None if !docker.is_empty() => self.plan_docker(&docker)?,
            None => {
                return Err(ImageError::InvalidArgument(format!(
                    "archive {} is not an image archive: it holds neither {INDEX_FILE} (an OCI image layout) nor {DOCKER_MANIFEST_FILE} (docker save)",
                    self.name
                )));
            }
        };
        if plans.is_empty() {
            return Err(ImageError::InvalidArgument(format!(
                "archive {} holds no image",
                self.name
            )));
        }
        // One image may be named by several entries.
        let mut merged: Vec<Planned> = Vec::new();
        for plan in plans.drain(..) {
            match merged.iter_mut().find(|p| p.record.id == plan.record.id) {
                Some(into) => {
                    into.tags.extend(plan.tags);
                    into.digests.extend(plan.digests);
                    into.blobs.extend(plan.blobs);
                }
                None => merged.push(plan),
            }
        }
        for plan in &mut merged {
            plan.tags.sort();
            plan.tags.dedup();
            plan.digests.sort();
            plan.digests.dedup();
        }
        Ok(merged)
    }
}

impl Inner {
    /// Imports the archive `name`: reads it, checks every image, commits and records them.
    fn import_archive(
        &self,
        name: &str,
        reader: impl Read,
    ) -> Result<Vec<ImageRecord>, ImageError> {
        let contents = self.read_archive(name, reader)?;
        let checker = Checker {
            name,
            contents: &contents,
        };
        let mut committed: HashMap<String, String> = HashMap::new();
        let result = checker
            .plan()
            .and_then(|plans| self.record_plans(&contents, plans, &mut committed));
        for (path, layer) in &contents.layers {
            if let Ok((key, _)) = &layer.unpacked
                && !committed.contains_key(path)
            {
                self.discard_snapshot(key);
            }
        }
        result
    }

    /// Commits the planned images' layers and records the images.
    fn record_plans(
        &self,
        contents: &ArchiveContents,
        plans: Vec<Planned>,
        committed: &mut HashMap<String, String>,
    ) -> Result<Vec<ImageRecord>, ImageError> {
        for plan in &plans {
            let chain = &plan.record.chain_ids;
            for (i, path) in plan.layers.iter().enumerate() {
                if self.snapshots.stat(&chain[i]).is_ok() {
                    continue;
                }
                let Some((at, Found::Layer(layer))) = contents.find(path) else {
                    continue;
                };
                let Ok((key, _)) = &layer.unpacked else {
                    continue;
                };
                if let Some(other) = committed.get(&at) {
                    if *other == chain[i] {
                        continue;
                    }
                    return Err(ImageError::Unsupported(format!(
                        "layer {at} sits on different parents in two images of the archive; import them one by one"
                    )));
                }
                let parent = i.checked_sub(1).map(|p| chain[p].as_str());
                match self
                    .snapshots
                    .commit_with_parent(&chain[i], key, parent, Default::default())
                {
                    Ok(()) | Err(berth_snapshotter::Error::AlreadyExists(_)) => {}
                    Err(e) => {
                        return Err(ImageError::internal(
                            format!("committing layer {}", chain[i]),
                            e,
                        ));
                    }
                }
                committed.insert(at, chain[i].clone());
            }
        }
        let mut records = Vec::new();
        for plan in plans {
            for (digest, bytes) in &plan.blobs {
                self.content
                    .write(digest, bytes)
                    .map_err(|e| ImageError::internal("storing a manifest or config", e))?;
            }
            let record = self
                .store
                .put_image(plan.record, &plan.tags, &plan.digests)
                .map_err(|e| ImageError::internal("recording image", e))?;
            records.push(record);
        }
        Ok(records)
    }
}

impl ImageManager {
    /// Imports the images of the archive `name` read from `reader` (blocking reads: a file, or
    /// a channel fed by an async task). Nothing is left of a failed import.
    pub async fn import(
        &self,
        name: String,
        reader: impl Read + Send + 'static,
    ) -> Result<Vec<ImageView>, ImageError> {
        let started = std::time::Instant::now();
        let result = {
            let _gc = self.inner.gc_lock.read().await;
            let inner = self.inner.clone();
            let shown = name.clone();
            tokio::task::spawn_blocking(move || inner.import_archive(&shown, reader))
                .await
                .map_err(|e| ImageError::internal("import task", e))?
        };
        self.inner.fs_usage.clear();
        match result {
            Ok(records) => {
                tracing::info!(
                    archive = %name,
                    images = records.len(),
                    seconds = started.elapsed().as_secs_f64(),
                    "imported image archive"
                );
                Ok(records
                    .into_iter()
                    .map(|record| ImageView { record })
                    .collect())
            }
            Err(e) => {
                // Manifests a partly committed import stored and layers it committed belong
                // to no image.
                let _gc = self.inner.gc_lock.write().await;
                if let Err(gc) = self.collect_garbage_locked() {
                    tracing::warn!(error = %gc, "cleaning up after a failed import");
                }
                Err(e)
            }
        }
    }
}
