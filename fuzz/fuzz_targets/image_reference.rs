//! Image references: `ImageRef::parse` and `validate_digest` on any UTF-8; normal forms parse to themselves.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::image_reference(data));
