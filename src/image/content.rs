//! The content store: sha256-addressed blobs (manifests, indexes, configs) verified before they land.
//!
//! Blobs live at `<dir>/blobs/sha256/<hex>`; writes go to `<dir>/ingest/` first, are fsynced and
//! renamed into place, so a crash never leaves a partial blob under its digest. `ingest/` is
//! emptied when the store is opened.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Content store errors.
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    /// The bytes do not hash to the digest they were fetched under.
    #[error("blob {expected} failed verification: content hashes to {actual}")]
    DigestMismatch { expected: String, actual: String },
    /// The blob is not in the store.
    #[error("blob {0} not found in the content store")]
    NotFound(String),
    /// A digest that is not `sha256:<64 hex>`.
    #[error("invalid digest {0:?}")]
    InvalidDigest(String),
    /// Disk trouble, with the path involved.
    #[error("content store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Blob store rooted at one directory.
#[derive(Debug, Clone)]
pub struct ContentStore {
    dir: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ContentError + '_ {
    move |source| ContentError::Io {
        path: path.to_owned(),
        source,
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl ContentStore {
    /// Opens the store, creating its directories and discarding unfinished ingests.
    pub fn open(dir: &Path) -> Result<Self, ContentError> {
        let store = Self {
            dir: dir.to_owned(),
        };
        let ingest = store.ingest_dir();
        if ingest.exists() {
            std::fs::remove_dir_all(&ingest).map_err(io_err(&ingest))?;
        }
        for d in [store.blobs_dir(), ingest] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        Ok(store)
    }

    fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs").join("sha256")
    }

    fn ingest_dir(&self) -> PathBuf {
        self.dir.join("ingest")
    }

    /// Where the blob `digest` lives (whether or not it exists).
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, ContentError> {
        crate::image::reference::validate_digest(digest)
            .map_err(|_| ContentError::InvalidDigest(digest.to_string()))?;
        Ok(self.blobs_dir().join(&digest["sha256:".len()..]))
    }

    /// Whether the blob is present.
    pub fn contains(&self, digest: &str) -> bool {
        self.blob_path(digest).map(|p| p.exists()).unwrap_or(false)
    }

    /// Verifies `bytes` against `digest` and stores them durably.
    pub fn write(&self, digest: &str, bytes: &[u8]) -> Result<(), ContentError> {
        let path = self.blob_path(digest)?;
        let actual = sha256_digest(bytes);
        if actual != digest {
            return Err(ContentError::DigestMismatch {
                expected: digest.to_string(),
                actual,
            });
        }
        if path.exists() {
            return Ok(());
        }
        let tmp = self.ingest_dir().join(format!(
            "{}-{}",
            &digest["sha256:".len()..],
            crate::util::random_hex(6)
        ));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
            f.write_all(bytes).map_err(io_err(&tmp))?;
            f.sync_all().map_err(io_err(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io_err(&path))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Reads a whole blob.
    pub fn read(&self, digest: &str) -> Result<Vec<u8>, ContentError> {
        let path = self.blob_path(digest)?;
        match std::fs::read(&path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ContentError::NotFound(digest.to_string()))
            }
            Err(source) => Err(ContentError::Io { path, source }),
        }
    }

    /// Deletes a blob; absent is fine.
    pub fn delete(&self, digest: &str) -> Result<(), ContentError> {
        let path = self.blob_path(digest)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(ContentError::Io { path, source: e })
            }
            _ => Ok(()),
        }
    }

    /// Every stored digest.
    pub fn list(&self) -> Result<Vec<String>, ContentError> {
        let dir = self.blobs_dir();
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            if let Some(name) = entry.file_name().to_str() {
                out.push(format!("sha256:{name}"));
            }
        }
        Ok(out)
    }

    /// Bytes and inodes the store uses.
    pub fn usage(&self) -> (u64, u64) {
        crate::util::disk_usage(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_verifies_and_reopen_clears_ingest() {
        let dir = std::env::temp_dir().join(format!("berth-content-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = ContentStore::open(&dir).expect("open");
        let d = sha256_digest(b"hello");
        store.write(&d, b"hello").expect("write");
        assert_eq!(store.read(&d).expect("read"), b"hello");
        let wrong = store.write(&sha256_digest(b"other"), b"hello");
        assert!(matches!(wrong, Err(ContentError::DigestMismatch { .. })));
        std::fs::write(dir.join("ingest/partial"), b"x").expect("stray ingest");
        let store = ContentStore::open(&dir).expect("reopen");
        assert!(!dir.join("ingest/partial").exists());
        assert_eq!(store.list().expect("list"), vec![d.clone()]);
        store.delete(&d).expect("delete");
        assert!(matches!(store.read(&d), Err(ContentError::NotFound(_))));
        let _ = std::fs::remove_dir_all(dir);
    }
}
