//! The README's quick start, run as written by `hack/quickstart.sh` with this build's binaries:
//! berthd with its defaults, a pull from the local registry with no flag, a pod and a container
//! by hand reached on the pod's IP, and a static pod run by the agent.

mod common;

use common::*;

#[test]
fn the_readme_quick_start_works_as_written() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_berthd"))
        .parent()
        .expect("bin dir")
        .to_string_lossy()
        .to_string();
    let out = hack("quickstart.sh", &[&bin]);
    assert!(out.ends_with("quickstart: ok\n"), "{out}");
}
