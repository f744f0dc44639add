//! The shim's error type; each message names what failed and where.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// Bad command line.
    #[error("{0}\n{usage}", usage = crate::args::USAGE)]
    Usage(String),
    /// libcontainer refused or failed an operation on the container.
    #[error("{op} container {id} (bundle {bundle}): {source}")]
    Container {
        op: &'static str,
        id: String,
        bundle: PathBuf,
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    /// A process could not be started inside the container.
    #[error("exec in container {id}: {message}")]
    Enter { id: String, message: String },
    /// A system call or file operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The request cannot be served in the container's current state.
    #[error("{0}")]
    Precondition(String),
}

impl ShimError {
    pub fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Self::Io {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Adds context to fallible I/O.
pub trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, ShimError>;
}

impl<T, E: Into<io::Error>> IoContext<T> for Result<T, E> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, ShimError> {
        self.map_err(|e| ShimError::io(context(), e))
    }
}
