//! The files of an image archive: the OCI image layout (`oci-layout`, `index.json`,
//! `blobs/<alg>/<hex>`) and `docker save`'s `manifest.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::super::manifest::{Descriptor, OCI_INDEX, OCI_MANIFEST};

/// The OCI layout's marker file.
pub const OCI_LAYOUT_FILE: &str = "oci-layout";
/// The OCI layout's index.
pub const INDEX_FILE: &str = "index.json";
/// `docker save`'s list of images.
pub const DOCKER_MANIFEST_FILE: &str = "manifest.json";
/// The annotation containerd and Docker give an image's full name.
pub const NAME_ANNOTATION: &str = "io.containerd.image.name";
/// The OCI annotation naming a manifest in a layout (often only a tag).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// Media types of the layers Berth exports: uncompressed tars, whose digests are the diff ids.
pub const EXPORT_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// Media type of an exported image's config.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// `oci-layout`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OciLayout {
    pub image_layout_version: String,
}

/// `index.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: i64,
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Vec<IndexEntry>,
}

/// One manifest (or nested index) an `index.json` names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexEntry {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// One image in `docker save`'s `manifest.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerImage {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// An image manifest as Berth writes it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest<'a> {
    pub schema_version: i64,
    pub media_type: &'a str,
    pub config: &'a Descriptor,
    pub layers: &'a [Descriptor],
}

impl<'a> ImageManifest<'a> {
    /// An OCI image manifest.
    pub fn new(config: &'a Descriptor, layers: &'a [Descriptor]) -> Self {
        Self {
            schema_version: 2,
            media_type: OCI_MANIFEST,
            config,
            layers,
        }
    }
}

impl Index {
    /// An OCI index of `manifests`.
    pub fn new(manifests: Vec<IndexEntry>) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(OCI_INDEX.to_string()),
            manifests,
        }
    }
}

/// Where a blob lives in a layout: `blobs/<alg>/<hex>`.
pub fn blob_path(digest: &str) -> String {
    match digest.split_once(':') {
        Some((alg, hex)) => format!("blobs/{alg}/{hex}"),
        None => format!("blobs/{digest}"),
    }
}
