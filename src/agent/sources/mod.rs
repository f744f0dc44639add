//! Where pods come from: manifest files (static pods), watched for changes.

pub mod files;
pub mod manifest;
pub mod watch;
