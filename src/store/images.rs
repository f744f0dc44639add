//! Image records and their names in the metadata store.

use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError};

pub(super) const IMAGES: TableDefinition<&str, &[u8]> = TableDefinition::new("images");
pub(super) const IMAGE_NAMES: TableDefinition<&str, &str> = TableDefinition::new("image_names");

/// One pulled image, known by the digest of its config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ImageRecord {
    /// `sha256:<hex>` of the image config.
    pub id: String,
    /// Tagged references (`docker.io/library/busybox:latest`).
    pub repo_tags: Vec<String>,
    /// Digest references (`docker.io/library/busybox@sha256:…`).
    pub repo_digests: Vec<String>,
    /// Bytes of config and (compressed) layers, as the manifest declares them.
    pub size: u64,
    /// Digest of the platform manifest.
    pub manifest_digest: String,
    /// Media type of the platform manifest.
    pub manifest_media_type: String,
    /// Snapshot chain ids, bottom layer first; the last is the image's rootfs parent.
    pub chain_ids: Vec<String>,
    /// Uncompressed layer digests (rootfs.diff_ids).
    pub diff_ids: Vec<String>,
    /// Unix seconds when the image was first recorded.
    pub created_unix: i64,
    /// Unix seconds of the last pull or use (for garbage collection).
    pub last_used_unix: i64,
    /// Whether the image is pinned (never garbage-collected).
    pub pinned: bool,
    /// Numeric user of the image config's `User`, if numeric.
    #[serde(default)]
    pub uid: Option<i64>,
    /// User name of the image config's `User`, if a name.
    #[serde(default)]
    pub username: String,
}

impl Store {
    /// All images.
    pub fn list_images(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(IMAGES)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            out.push(decode(key.value(), value.value())?);
        }
        Ok(out)
    }

    /// The image with id `id`.
    pub fn get_image(&self, id: &str) -> Result<Option<ImageRecord>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(IMAGES)?;
        match table.get(id)? {
            Some(v) => Ok(Some(decode(id, v.value())?)),
            None => Ok(None),
        }
    }

    /// The image id a reference (tag or digest reference) names.
    pub fn resolve_image_name(&self, name: &str) -> Result<Option<String>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(IMAGE_NAMES)?;
        Ok(table.get(name)?.map(|v| v.value().to_string()))
    }

    /// Records `image` and points `tags` and `digests` at it, moving a name away from an image
    /// that held it before. One transaction: a crash leaves either the old or the new state.
    pub fn put_image(
        &self,
        mut image: ImageRecord,
        tags: &[String],
        digests: &[String],
    ) -> Result<ImageRecord, StoreError> {
        let txn = self.db.begin_write()?;
        {
            let mut images = txn.open_table(IMAGES)?;
            let mut names = txn.open_table(IMAGE_NAMES)?;
            if let Some(old) = images.get(image.id.as_str())? {
                let old = decode(&image.id, old.value())?;
                image.created_unix = old.created_unix;
                image.pinned |= old.pinned;
                merge(&mut image.repo_tags, &old.repo_tags);
                merge(&mut image.repo_digests, &old.repo_digests);
            }
            merge(&mut image.repo_tags, tags);
            merge(&mut image.repo_digests, digests);
            for name in tags.iter().chain(digests) {
                let previous = names.insert(name.as_str(), image.id.as_str())?;
                let previous = previous.map(|p| p.value().to_string());
                if let Some(prev_id) = previous.filter(|p| *p != image.id) {
                    let prev = images.get(prev_id.as_str())?.map(|v| v.value().to_vec());
                    if let Some(bytes) = prev {
                        let mut prev = decode(&prev_id, &bytes)?;
                        prev.repo_tags.retain(|t| t != name);
                        prev.repo_digests.retain(|d| d != name);
                        let encoded = encode(&prev);
                        images.insert(prev_id.as_str(), encoded.as_slice())?;
                    }
                }
            }
            let encoded = encode(&image);
            images.insert(image.id.as_str(), encoded.as_slice())?;
        }
        txn.commit()?;
        Ok(image)
    }

    /// Removes the image `id` with all its names; returns what was removed.
    pub fn remove_image(&self, id: &str) -> Result<Option<ImageRecord>, StoreError> {
        let txn = self.db.begin_write()?;
        let removed = {
            let mut images = txn.open_table(IMAGES)?;
            let mut names = txn.open_table(IMAGE_NAMES)?;
            let removed = images.remove(id)?.map(|v| v.value().to_vec());
            match removed {
                Some(bytes) => {
                    let image = decode(id, &bytes)?;
                    for name in image.repo_tags.iter().chain(&image.repo_digests) {
                        names.remove(name.as_str())?;
                    }
                    Some(image)
                }
                None => None,
            }
        };
        txn.commit()?;
        Ok(removed)
    }
}

fn merge(into: &mut Vec<String>, from: &[String]) {
    for item in from {
        if !into.contains(item) {
            into.push(item.clone());
        }
    }
}

fn encode(image: &ImageRecord) -> Vec<u8> {
    // Serialising a struct of strings and integers cannot fail.
    serde_json::to_vec(image).unwrap_or_default()
}

fn decode(key: &str, bytes: &[u8]) -> Result<ImageRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        key: key.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_store(name: &str) -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("berth-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        (Store::open(&dir.join("db.redb")).expect("open"), dir)
    }

    fn image(id: &str) -> ImageRecord {
        ImageRecord {
            id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn tag_moves_between_images_and_remove_drops_names() {
        let (store, dir) = temp_store("tags");
        let tag = "docker.io/library/busybox:latest".to_string();
        store
            .put_image(image("sha256:a"), std::slice::from_ref(&tag), &[])
            .expect("put a");
        store
            .put_image(image("sha256:b"), std::slice::from_ref(&tag), &[])
            .expect("put b");
        let a = store.get_image("sha256:a").expect("get").expect("a exists");
        assert!(a.repo_tags.is_empty(), "tag moved away from a");
        assert_eq!(
            store.resolve_image_name(&tag).expect("resolve").as_deref(),
            Some("sha256:b")
        );
        let removed = store
            .remove_image("sha256:b")
            .expect("remove")
            .expect("was there");
        assert_eq!(removed.repo_tags, vec![tag.clone()]);
        assert_eq!(store.resolve_image_name(&tag).expect("resolve"), None);
        assert!(
            store
                .remove_image("sha256:b")
                .expect("remove again")
                .is_none()
        );
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn records_survive_reopen() {
        let (store, dir) = temp_store("reopen");
        store
            .put_image(
                image("sha256:c"),
                &["r/x:1".into()],
                &["r/x@sha256:d".into()],
            )
            .expect("put");
        drop(store);
        let store = Store::open(&dir.join("db.redb")).expect("reopen");
        let c = store.get_image("sha256:c").expect("get").expect("present");
        assert_eq!(c.repo_digests, vec!["r/x@sha256:d".to_string()]);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }
}
