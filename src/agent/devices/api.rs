//! The device plugin API's messages, services and clients (from proto/deviceplugin.proto).

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));
