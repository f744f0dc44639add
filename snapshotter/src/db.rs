//! A redb database handle that opens the file again after a failed write.
//!
//! redb refuses every transaction after a write failed (a full disk, say) with
//! [`redb::StorageError::PreviousIo`], until the database is opened again, whose open repairs
//! it back to the last commit. [`MetadataDb`] does that reopening itself, so that a moment
//! without space does not leave the snapshotter or berthd's store unusable until a restart.

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use redb::{
    Database, DatabaseError, ReadTransaction, ReadableDatabase, StorageError, TransactionError,
    WriteTransaction,
};

/// An open redb database that reopens itself after a failed write.
pub struct MetadataDb {
    path: PathBuf,
    state: RwLock<State>,
}

struct State {
    db: Option<Database>,
    /// How many times the file was reopened: threads that saw the same failure reopen it once.
    generation: u64,
}

impl std::fmt::Debug for MetadataDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataDb")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl MetadataDb {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, DatabaseError> {
        let db = Database::create(path)?;
        Ok(MetadataDb {
            path: path.to_path_buf(),
            state: RwLock::new(State {
                db: Some(db),
                generation: 0,
            }),
        })
    }

    /// Begins a write transaction.
    pub fn begin_write(&self) -> Result<WriteTransaction, redb::Error> {
        self.begin(Database::begin_write)
    }

    /// Begins a read transaction.
    pub fn begin_read(&self) -> Result<ReadTransaction, redb::Error> {
        self.begin(|db| db.begin_read())
    }

    fn begin<T>(
        &self,
        begin: impl Fn(&Database) -> Result<T, TransactionError>,
    ) -> Result<T, redb::Error> {
        let seen = {
            let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(db) = &state.db {
                match begin(db) {
                    Err(TransactionError::Storage(StorageError::PreviousIo)) => {}
                    other => return other.map_err(Into::into),
                }
            }
            state.generation
        };
        self.reopen(seen)?;
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        match &state.db {
            Some(db) => begin(db).map_err(Into::into),
            None => Err(redb::Error::PreviousIo),
        }
    }

    /// Closes and opens the file again, unless another thread did since generation `seen`.
    fn reopen(&self, seen: u64) -> Result<(), DatabaseError> {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.generation != seen && state.db.is_some() {
            return Ok(());
        }
        // The old handle goes first: it holds the file's lock.
        drop(state.db.take());
        state.db = Some(Database::create(&self.path)?);
        state.generation += 1;
        tracing::warn!(path = %self.path.display(), "metadata database reopened after a failed write");
        Ok(())
    }
}
