//! Layer tarballs (plain, or gzipped after a 0xff flag byte) unpacked in a tmpfs jail: nothing may land outside the layer root.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::layer_unpack(data));
