//! The fuzz targets' stored inputs (`fuzz/regressions/<target>/`, crashes found and fixed, and
//! `fuzz/corpus/<target>/`, the seeds) replayed through the harnesses the targets run.

#[path = "../fuzz/src/lib.rs"]
mod harness;

use std::path::{Path, PathBuf};

/// Runs every stored input of `target` through `run`; a panic names the input.
fn replay(target: &str, run: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs: Vec<PathBuf> = Vec::new();
    for kind in ["regressions", "corpus"] {
        let dir = fuzz.join(kind).join(target);
        match std::fs::read_dir(&dir) {
            Ok(entries) => inputs.extend(
                entries
                    .map(|e| e.expect("list the stored inputs").path())
                    .filter(|p| p.is_file()),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && kind == "regressions" => {}
            Err(e) => panic!("{}: {e}", dir.display()),
        }
    }
    inputs.sort();
    assert!(!inputs.is_empty(), "no stored inputs for {target}");
    for input in inputs {
        let data = std::fs::read(&input).expect("read a stored input");
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            panic!("{target}: {} fails", input.display());
        }
    }
}

#[test]
fn image_reference() {
    replay("image_reference", harness::image_reference);
}

#[test]
fn image_manifest() {
    replay("image_manifest", harness::image_manifest);
}

#[test]
fn manifest_sizes() {
    replay("manifest_sizes", harness::manifest_sizes);
}

#[test]
fn tar_guard() {
    replay("tar_guard", harness::tar_guard);
}

#[test]
fn layer_unpack() {
    replay("layer_unpack", harness::layer_unpack);
}

#[test]
fn hosts_toml() {
    replay("hosts_toml", harness::hosts_toml);
}

#[test]
fn spdy_frames() {
    replay("spdy_frames", harness::spdy_frames);
}

#[test]
fn websocket_frames() {
    replay("websocket_frames", harness::websocket_frames);
}

#[test]
fn channel_protocols() {
    replay("channel_protocols", harness::channel_protocols);
}

#[test]
fn dbus_message() {
    replay("dbus_message", harness::dbus_message);
}

#[test]
fn cni_result() {
    replay("cni_result", harness::cni_result);
}

#[test]
fn pod_manifest() {
    replay("pod_manifest", harness::pod_manifest);
}

#[test]
fn shim_protocol() {
    replay("shim_protocol", harness::shim_protocol);
}
