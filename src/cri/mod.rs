//! The CRI gRPC server: RuntimeService and ImageService v1 (and v1alpha2 by translation) on a unix socket.

mod added_calls;
pub mod api_v136;
mod archive_service;
pub(crate) mod authority;
mod checkpoint;
mod container_service;
mod encoded_lists;
mod errors;
mod events_service;
mod image_service;
mod metrics_service;
mod runtime_info;
mod runtime_service;
mod sandbox_service;
pub(crate) mod server;
mod stats_psi;
pub(crate) mod stats_service;
mod stream_service;
mod v1alpha2;
mod wire_extensions;

pub use archive_service::ArchiveApi;
pub use encoded_lists::EncodedItems;
pub use image_service::ImageApi;
pub use runtime_service::RuntimeApi;
pub use server::serve;

/// The CRI API version Berth implements natively.
pub const CRI_API_VERSION: &str = "v1";
/// The runtime name reported by Version.
pub const RUNTIME_NAME: &str = "berth";
/// Berth's version.
pub const RUNTIME_VERSION: &str = env!("CARGO_PKG_VERSION");
