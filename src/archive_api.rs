//! The image archive service's gRPC messages, server and client (from proto/archive.proto).

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/berth.images.v1.rs"));
