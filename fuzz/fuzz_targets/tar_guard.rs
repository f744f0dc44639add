//! The tar guard on any bytes: the tar crate reads the same entries through it, and it refuses only oversized extension records.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::tar_guard(data));
