//! SPDY/3.1 frames and their zlib header blocks: `read_frame`, `parse_syn`, `HeaderDecompressor::decompress`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::spdy_frames(data));
