//! The metadata store: redb tables for Berth's objects, each change one transaction.
//!
//! Tables (schema):
//! - `images`: image id (`sha256:<config digest>`) → JSON [`ImageRecord`]
//! - `image_names`: reference (`registry/repo:tag` or `registry/repo@sha256:…`) → image id
//! - `sandboxes`: sandbox id → JSON `SandboxRecord` (src/runtime/sandbox.rs)
//! - `containers`: container id → JSON `ContainerRecord` (src/runtime/container.rs)
//!
//! Invariant: every name in `image_names` points to an image in `images`, and that image lists
//! the name in its `repo_tags` or `repo_digests`; both are changed in the same transaction.

mod images;
mod records;
mod table;

use std::path::Path;
use std::sync::Arc;

use berth_snapshotter::MetadataDb;

pub use images::ImageRecord;
pub use table::RecordTable;

/// Containers by id.
pub const CONTAINERS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("containers");

/// Pod sandboxes by id.
pub const SANDBOXES: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("sandboxes");

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened (another berthd holds it, or it is damaged).
    #[error("opening metadata database {path}: {error}")]
    Open {
        path: String,
        error: redb::DatabaseError,
    },
    /// A read or write failed.
    #[error("metadata database: {0}")]
    Db(String),
    /// A stored record does not decode.
    #[error("metadata record {key} is corrupt: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
}

macro_rules! db_err_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(e.to_string())
            }
        }
    )*};
}
db_err_from!(
    redb::Error,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// Handle on the metadata database; cheap to clone. It opens the file again by itself after
/// a failed write (a full disk): a moment without space does not leave the store unusable.
#[derive(Clone)]
pub struct Store {
    db: Arc<MetadataDb>,
}

impl Store {
    /// Opens (or creates) the database at `path` and makes sure every table exists.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = MetadataDb::open(path).map_err(|error| StoreError::Open {
            path: path.display().to_string(),
            error,
        })?;
        let store = Self { db: Arc::new(db) };
        store.create_tables()?;
        Ok(store)
    }

    fn create_tables(&self) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        txn.open_table(images::IMAGES)?;
        txn.open_table(images::IMAGE_NAMES)?;
        txn.open_table(SANDBOXES)?;
        txn.open_table(CONTAINERS)?;
        txn.commit()?;
        Ok(())
    }
}
