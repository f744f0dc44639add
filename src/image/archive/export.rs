//! Exporting: images as one tar that is both an OCI image layout and a `docker save` archive.
//! Layers are rebuilt byte for byte from their snapshots and tapes and written uncompressed,
//! so each layer's digest is its diff id and an export imports back to the same image id;
//! every header is fixed (mode, owner, time), so the same images always give the same bytes.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

use super::super::ImageError;
use super::super::manager::{ImageManager, Inner};
use super::super::manifest::{Descriptor, OCI_MANIFEST};
use super::super::pull::TAPE_FILE;
use super::super::reference::ImageRef;
use super::super::unpack::TapeReader;
use super::layout::{
    CONFIG_MEDIA_TYPE, DOCKER_MANIFEST_FILE, DockerImage, EXPORT_LAYER_MEDIA_TYPE, INDEX_FILE,
    ImageManifest, Index, IndexEntry, NAME_ANNOTATION, OCI_LAYOUT_FILE, OciLayout,
    REF_NAME_ANNOTATION, blob_path,
};
use crate::image::content::sha256_digest;
use crate::store::ImageRecord;

/// A rebuilt layer, hashed as it is written.
struct Verified<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Appends one file with fixed metadata.
fn append(
    tar: &mut tar::Builder<impl Write>,
    path: &str,
    size: u64,
    data: impl Read,
) -> io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    tar.append_data(&mut header, path, data)
}

fn json(value: &impl serde::Serialize) -> Result<Vec<u8>, ImageError> {
    serde_json::to_vec(value).map_err(|e| ImageError::internal("writing archive metadata", e))
}

impl Inner {
    /// Writes `images` (each with the names to give it) as one archive to `out`.
    fn export_images(
        &self,
        images: &[(ImageRecord, Vec<String>)],
        out: impl Write,
    ) -> Result<(), ImageError> {
        let write_error = |e: io::Error| ImageError::internal("writing the archive", e);
        let mut tar = tar::Builder::new(out);
        let layout = json(&OciLayout {
            image_layout_version: "1.0.0".into(),
        })?;
        append(&mut tar, OCI_LAYOUT_FILE, layout.len() as u64, &layout[..]).map_err(write_error)?;
        let mut written: HashSet<String> = HashSet::new();
        let mut index = Vec::new();
        let mut docker = Vec::new();
        for (record, names) in images {
            let config = self.content.read(&record.id).map_err(|e| {
                ImageError::internal(format!("image {}: reading its config", record.id), e)
            })?;
            let mut layers = Vec::new();
            for (diff_id, chain) in record.diff_ids.iter().zip(&record.chain_ids) {
                let size = self.write_layer(&mut tar, record, diff_id, chain, &mut written)?;
                layers.push(Descriptor {
                    media_type: EXPORT_LAYER_MEDIA_TYPE.into(),
                    digest: diff_id.clone(),
                    size: size as i64,
                    platform: None,
                });
            }
            let config_desc = Descriptor {
                media_type: CONFIG_MEDIA_TYPE.into(),
                digest: record.id.clone(),
                size: config.len() as i64,
                platform: None,
            };
            let manifest = json(&ImageManifest::new(&config_desc, &layers))?;
            let manifest_digest = sha256_digest(&manifest);
            for (digest, bytes) in [(&record.id, &config), (&manifest_digest, &manifest)] {
                if written.insert(digest.clone()) {
                    append(&mut tar, &blob_path(digest), bytes.len() as u64, &bytes[..])
                        .map_err(write_error)?;
                }
            }
            let entry = |annotations| IndexEntry {
                media_type: OCI_MANIFEST.into(),
                digest: manifest_digest.clone(),
                size: manifest.len() as i64,
                annotations,
            };
            if names.is_empty() {
                index.push(entry(BTreeMap::new()));
            }
            for name in names {
                let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
                index.push(entry(BTreeMap::from([
                    (NAME_ANNOTATION.to_string(), name.clone()),
                    (REF_NAME_ANNOTATION.to_string(), tag.to_string()),
                ])));
            }
            docker.push(DockerImage {
                config: blob_path(&record.id),
                repo_tags: Some(names.clone()),
                layers: record.diff_ids.iter().map(|d| blob_path(d)).collect(),
            });
        }
        let index = json(&Index::new(index))?;
        append(&mut tar, INDEX_FILE, index.len() as u64, &index[..]).map_err(write_error)?;
        let docker = json(&docker)?;
        append(
            &mut tar,
            DOCKER_MANIFEST_FILE,
            docker.len() as u64,
            &docker[..],
        )
        .map_err(write_error)?;
        tar.into_inner()
            .and_then(|mut out| out.flush())
            .map_err(write_error)
    }

    /// Writes one layer (once per archive), rebuilt from its snapshot and checked against its
    /// diff id; returns its length.
    fn write_layer(
        &self,
        tar: &mut tar::Builder<impl Write>,
        record: &ImageRecord,
        diff_id: &str,
        chain: &str,
        written: &mut HashSet<String>,
    ) -> Result<u64, ImageError> {
        let cannot = |e: &dyn std::fmt::Display| {
            ImageError::Internal(format!(
                "image {}: layer {diff_id} cannot be rebuilt: {e}",
                record.id
            ))
        };
        let files = self.snapshots.files_dir(chain).map_err(|e| cannot(&e))?;
        let tape = self
            .snapshots
            .sidecar(chain, TAPE_FILE)
            .map_err(|e| cannot(&e))?;
        let size = TapeReader::size(&tape).map_err(|e| match e {
            e @ super::super::unpack::TapeError::Missing { .. } => ImageError::Unsupported(format!(
                "image {}: layer {diff_id} has no layer record ({e}); it was unpacked before Berth kept them: remove the image and pull it again to export it",
                record.id
            )),
            e => cannot(&e),
        })?;
        if !written.insert(diff_id.to_string()) {
            return Ok(size);
        }
        let mut layer = Verified {
            inner: TapeReader::open(&tape, &files).map_err(|e| cannot(&e))?,
            hasher: Sha256::new(),
        };
        append(tar, &blob_path(diff_id), size, &mut layer).map_err(|e| cannot(&e))?;
        let actual = format!("sha256:{}", hex::encode(layer.hasher.finalize()));
        if actual != diff_id {
            return Err(cannot(&format!("rebuilt, it hashes to {actual}")));
        }
        Ok(size)
    }
}

impl ImageManager {
    /// Writes the images `references` name to `out` (blocking writes) as one archive. An image
    /// named by a tag carries that name; one named by id or digest carries all its tags.
    pub async fn export(
        &self,
        references: &[String],
        out: impl Write + Send + 'static,
    ) -> Result<(), ImageError> {
        let mut images: Vec<(ImageRecord, Vec<String>)> = Vec::new();
        for reference in references {
            let view = self
                .status(reference)?
                .ok_or_else(|| ImageError::NotFound(format!("image {reference} not found")))?;
            let record = view.record;
            let tag = ImageRef::parse(reference)
                .ok()
                .and_then(|r| r.tagged())
                .filter(|t| record.repo_tags.contains(t));
            let names = match tag {
                Some(t) => vec![t],
                None => record.repo_tags.clone(),
            };
            match images.iter_mut().find(|(r, _)| r.id == record.id) {
                Some((_, known)) => {
                    known.extend(names);
                    known.sort();
                    known.dedup();
                }
                None => images.push((record, names)),
            }
        }
        let _gc = self.inner.gc_lock.read().await;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.export_images(&images, out))
            .await
            .map_err(|e| ImageError::internal("export task", e))?
    }
}
