//! Static pod manifests (YAML or JSON): parsing is deterministic and gives valid, named pods.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| berth_fuzz::pod_manifest(data));
