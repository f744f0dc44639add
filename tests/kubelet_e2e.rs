//! Kubernetes 1.20's own node e2e suite (`e2e.test`, the node specs of `e2e_support::PARALLEL`)
//! against a one-node cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler on
//! loopback) whose stock kubelet 1.20 runs on berthd. The images the specs pull are made by
//! `hack/e2e-images.sh`.
//!
//! `BERTH_E2E_RUNTIME=containerd` runs the same suite with the kubelet on containerd 1.6 + runc
//! instead (`hack/e2e-compare.sh` runs both and compares): the specs listed in
//! [`FAIL_ON_CONTAINERD_TOO`] fail there as well, for reasons outside the runtime.

mod cni_support;
mod common;
mod e2e_support;
mod kubelet_support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;
use e2e_support::{PARALLEL, assert_ran, parse, push_images, report, run_suite};
use kubelet_support::control_plane::ControlPlane;
use kubelet_support::*;

/// Specs that fail with containerd 1.6 on the same host too (measured with
/// `hack/e2e-compare.sh`), each with why; Berth may fail these and nothing else.
const FAIL_ON_CONTAINERD_TOO: &[(&str, &str)] = &[];

/// containerd 1.6 + runc from Debian, its root, state, sockets and runc root in `dir`.
struct Containerd {
    dir: TempDir,
    child: Option<Child>,
}

impl Containerd {
    fn start(cni: &cni_support::TestNet) -> Self {
        let dir = TempDir::new("containerd");
        let d = dir.path();
        // The configuration the containerd benchmarks use (hack/bench-common.sh), with its CNI
        // conf dir holding the test's network.
        let made = Command::new("bash")
            .arg("-c")
            .arg(". \"$0\" && write_containerd_config \"$1\" \"$2\" \"$3\"")
            .arg(repo_root().join("hack/bench-common.sh"))
            .arg(d)
            .arg(format!("{}/pause:3.2", registry()))
            .arg(cni_support::DEBIAN_CNI)
            .env("REG", registry())
            .status()
            .expect("write_containerd_config");
        assert!(made.success(), "write_containerd_config failed");
        std::fs::create_dir_all(d.join("net.d")).expect("net.d");
        for e in std::fs::read_dir(cni.conf_dir())
            .expect("conf dir")
            .flatten()
        {
            std::fs::copy(e.path(), d.join("net.d").join(e.file_name())).expect("conflist");
        }
        let child = spawn_logged(
            Command::new("containerd")
                .arg("--config")
                .arg(d.join("config.toml")),
            &d.join("containerd.log"),
        );
        let c = Containerd {
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.socket().exists() {
            assert!(Instant::now() < deadline, "containerd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let needle = self.dir.path().to_string_lossy().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(e.file_name())
                    .status();
            }
        }
    }
}

/// The runtime under the kubelet.
enum Runtime {
    Berth(Daemon),
    Containerd(Containerd),
}

impl Runtime {
    fn socket(&self) -> PathBuf {
        match self {
            Runtime::Berth(d) => d.socket(),
            Runtime::Containerd(c) => c.socket(),
        }
    }
}

#[tokio::test]
async fn node_conformance_specs_pass() {
    let on_containerd = std::env::var("BERTH_E2E_RUNTIME").is_ok_and(|v| v == "containerd");
    let net = cni_support::TestNet::new("e2e");
    net.write("10-test.conflist", &net.standard());
    net.bridge_up();
    let node = format!("node-{}", &net.name[4..]);
    let mut cp = ControlPlane::start(&node);
    cp.start_scheduler();
    let work = TempDir::new("e2e");
    let repo_list = work.path().join("repo-list.yaml");
    push_images(&repo_list);
    let runtime = if on_containerd {
        Runtime::Containerd(Containerd::start(&net))
    } else {
        let args = net.daemon_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Runtime::Berth(Daemon::start_with(&args))
    };
    // On the kubelet's own port: the specs that read the node's pods go through the API
    // server's node proxy to port 10250 whatever the node reports.
    let opts = KubeletOptions {
        port: Some(10250),
        ..cp.kubelet_options(&node, &net)
    };
    let kubelet = Kubelet::start_on(runtime.socket(), opts);
    cp.wait_node_ready(&node);
    let started = Instant::now();
    let report_dir = work.path().join("report");
    let output = run_suite(&PARALLEL, &cp, &repo_list, &report_dir);
    let outcome = parse(&output);
    let which = if on_containerd { "containerd" } else { "berth" };
    report(
        &format!("node-e2e-{which}"),
        &output,
        &outcome,
        started.elapsed(),
        &report_dir,
    );
    assert_ran(&PARALLEL, &outcome, &output);
    let unexpected: Vec<&String> = outcome
        .failures
        .iter()
        .filter(|f| {
            !FAIL_ON_CONTAINERD_TOO
                .iter()
                .any(|(name, _)| f.contains(name))
        })
        .collect();
    if !on_containerd {
        assert!(
            unexpected.is_empty(),
            "specs that fail on Berth only: {unexpected:#?}\nkubelet:\n{}\n{}",
            important(&kubelet.log()),
            tail(&output, 120)
        );
    }
    drop(kubelet);
    drop(runtime);
}

#[test]
fn ginkgo_summary_is_read() {
    let text = "Summarizing 2 Failures:\n\n[Fail] [k8s.io] Pods [It] should get a host IP [NodeConformance] [Conformance] \n\
                test/e2e/common/pods.go:12\n\n[Fail] [k8s.io] Probing container [It] should be restarted [NodeConformance] \n\n\
                Ran 140 of 5000 Specs in 812.3 seconds\nFAIL! -- 138 Passed | 2 Failed | 0 Pending | 4860 Skipped\n";
    let o = parse(text);
    assert_eq!((o.ran, o.passed, o.failed), (140, 138, 2));
    assert_eq!(
        o.failures,
        vec![
            "[k8s.io] Pods should get a host IP [NodeConformance] [Conformance]".to_string(),
            "[k8s.io] Probing container should be restarted [NodeConformance]".to_string()
        ]
    );
}
