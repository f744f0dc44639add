//! The plugin registration API's messages and the client of the service each plugin serves
//! (from proto/pluginregistration.proto).

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
