//! Declared sizes of manifests, indexes and configs on any bytes: `bounded_size` accepts exactly the sizes within the bounds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::manifest_sizes(data));
