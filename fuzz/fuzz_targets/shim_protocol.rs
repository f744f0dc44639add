//! The shim API framing (`split_frame`) and the protobuf requests and responses in a frame.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::shim_protocol(data));
