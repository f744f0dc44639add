//! Registry `hosts.toml` files: the endpoints they give, with the server last.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::hosts_toml(data));
