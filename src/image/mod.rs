//! The image core: references, registries, the content store, pulling and unpacking, image records.

pub mod archive;
pub mod content;
pub mod hosts;
pub mod import_dir;
mod manager;
pub mod manifest;
pub mod node_auth;
pub mod pins;
mod pull;
pub mod reference;
pub mod registry;
pub mod tar_guard;
pub mod unpack;

pub use manager::{ImageFsUsage, ImageManager, ImageView, LayerProgress, PullProgress};
pub use pull::ChannelReader;
pub use registry::{Credentials, PullAuth};

/// Why an image operation failed; each maps to one gRPC status code in `cri/`.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference does not parse.
    #[error(transparent)]
    InvalidReference(#[from] reference::InvalidReference),
    /// Other bad input (e.g. a malformed auth string).
    #[error("{0}")]
    InvalidArgument(String),
    /// The registry or Berth does not know the image.
    #[error("{0}")]
    NotFound(String),
    /// The registry cannot be reached.
    #[error("registry {registry} unreachable: {reason}")]
    Unavailable { registry: String, reason: String },
    /// The registry refused the credentials.
    #[error("authentication failed for registry {registry}: {reason}")]
    AuthFailed { registry: String, reason: String },
    /// A manifest Berth will not use (schema 1, unknown media type, no matching platform).
    #[error("{0}")]
    Unsupported(String),
    /// Content that does not match its digest or size, or does not decode.
    #[error("{0}")]
    Corrupt(String),
    /// Content built to harm the node: a layer that tries to write outside its root, a
    /// manifest, config or tar record far larger than any real one, a layer that unpacks past
    /// the configured limit.
    #[error("refusing image {image}: {reason}")]
    Hostile { image: String, reason: String },
    /// The registry stopped sending: nothing arrived for `images.pull_progress_timeout_secs`.
    #[error("{0}")]
    Stalled(String),
    /// Disk or internal trouble.
    #[error("{0}")]
    Internal(String),
}

impl ImageError {
    /// An internal error with context.
    pub fn internal(context: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        Self::Internal(format!("{context}: {e}"))
    }
}
