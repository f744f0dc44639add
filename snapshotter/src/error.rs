//! Error type of the snapshotter; every message names the snapshot key or path involved.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the snapshotter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No snapshot has this key (or committed name).
    #[error("snapshot {0:?} not found")]
    NotFound(String),
    /// A snapshot with this key (or committed name) already exists.
    #[error("snapshot {0:?} already exists")]
    AlreadyExists(String),
    /// The snapshot cannot be removed because other snapshots are built on it.
    #[error("snapshot {0:?} is in use: other snapshots have it as their parent")]
    InUse(String),
    /// The operation does not fit the snapshot's kind or relations.
    #[error("snapshot {0:?}: {1}")]
    InvalidState(String, String),
    /// A filesystem or mount operation failed.
    #[error("{context} ({path}): {source}")]
    Io {
        /// What was being done, naming the snapshot key where there is one.
        context: String,
        /// The path the operation was applied to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The metadata database failed.
    #[error("snapshot metadata, {context}: {source}")]
    Db {
        /// What was being done, naming the snapshot key where there is one.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<redb::Error>,
    },
    /// Stored metadata could not be decoded.
    #[error("snapshot {key:?}: corrupt metadata record: {source}")]
    Corrupt {
        /// The key whose record is unreadable.
        key: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// Builds an [`Error::Io`].
    pub(crate) fn io(
        context: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            context: context.into(),
            path: path.into(),
            source,
        }
    }
}

/// Attaches context to redb results.
pub(crate) trait DbContext<T> {
    /// Converts a redb error into [`Error::Db`] with the given context.
    fn db(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<redb::Error>> DbContext<T> for std::result::Result<T, E> {
    fn db(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Db {
            context: context(),
            source: Box::new(e.into()),
        })
    }
}

/// Attaches context to I/O results.
pub(crate) trait IoContext<T> {
    /// Converts an I/O error into [`Error::Io`] with the given context and path.
    fn io(self, context: impl FnOnce() -> String, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io(self, context: impl FnOnce() -> String, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| Error::io(context(), path, e))
    }
}
