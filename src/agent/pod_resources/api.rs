//! The pod resources API's messages, service and client (from proto/podresources.proto).

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/v1.rs"));
