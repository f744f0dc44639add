//! CNI results reduced to pod IPs, cached attachment records, network configs and bandwidth quantities.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::cni_result(data));
