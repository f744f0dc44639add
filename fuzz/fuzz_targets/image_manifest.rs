//! Manifest and config documents: `parse_document`, `choose_platform`, `parse_config` and chain ids on any bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::image_manifest(data));
