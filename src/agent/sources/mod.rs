//! Where pods come from: manifest files (static pods, watched for changes) and, in a cluster,
//! the API server.

pub mod api;
pub mod files;
pub mod manifest;
