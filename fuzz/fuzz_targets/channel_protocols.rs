//! The exec/attach/port-forward channel decoding: channel messages, resize events, port queries and headers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::channel_protocols(data));
