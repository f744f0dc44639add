//! Kubernetes 1.20's own e2e suite (`e2e.test` under ginkgo) against a one-node cluster: which
//! specs run, their images, the run, and the reading of ginkgo's summary. The node is the stock
//! kubelet (tests/kubelet_e2e.rs) or Berth's agent (tests/agent_e2e.rs).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::kubelet_support::control_plane::ControlPlane;
use crate::kubelet_support::{kube_bin, run_for};

/// Which specs run: every spec of the node's areas (pods and their status, probes, container
/// runtime, kubelet, /etc/hosts, variable expansion, init containers, lifecycle hooks, image
/// defaults, privileged pods, security context, sysctls, configMap, secrets, downward API,
/// projected, emptyDir, hostPath and subPath volumes, pod networking on one node, events,
/// preStop) that `SKIP` leaves: the `[NodeConformance]` and `[Conformance]` ones and the untagged
/// and node-feature ones (FSGroup, Sysctls, HostAccess, PodReadinessGate) a node should pass.
pub const FOCUS: &str = r"\[(k8s\.io|sig-[a-z-]+)\] (\[sig-node\] )?(Pods|Probing container|Container Runtime|Kubelet|KubeletManagedEtcHosts|Variable Expansion|InitContainer|Container Lifecycle Hook|Docker Containers|PrivilegedPod|Security Context|Sysctls|ConfigMap|Secrets|Downward API|Projected|EmptyDir|HostPath|Subpath|Networking Granular Checks|Events|PreStop|Pods Extended) ";
/// The specs left out: those that need the node to themselves or run long (serial, disruptive,
/// slow), are flaky upstream, need a feature gate or a runtime handler the node does not have,
/// and the one that pulls a private image from gcr.io with the suite's own credentials (the test
/// cluster reaches no registry but the local one: it fails on every runtime, after 15 minutes of
/// retries).
pub const SKIP: &str = r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Slow\]|\[Feature:[^\]]+\]|\[NodeFeature:(RuntimeHandler|EphemeralStorage)\]|\[NodeAlphaFeature:[^\]]+\]|pull from private registry with secret";

/// `SKIP`, and the specs this host's kernel cannot run on any runtime: PrivilegedPod's spec
/// adds a dummy network link in a privileged container, which needs the kernel's dummy link
/// type (a module some kernels lack); tried here in a network namespace of its own.
pub fn skip() -> String {
    let dummy_links = Command::new("unshare")
        .args(["-n", "ip", "link", "add", "berth-probe0", "type", "dummy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if dummy_links {
        SKIP.to_string()
    } else {
        eprintln!("this kernel has no dummy network links: PrivilegedPod's spec is skipped");
        format!("{SKIP}|PrivilegedPod .*should enable privileged commands")
    }
}

/// The focus of a run: `FOCUS`, or `BERTH_E2E_FOCUS` when set (a few specs while working on
/// them; the tests then check only that they pass).
pub fn focus() -> String {
    std::env::var("BERTH_E2E_FOCUS").unwrap_or_else(|_| FOCUS.to_string())
}

/// Whether the run is the whole focused set (not narrowed by `BERTH_E2E_FOCUS`).
pub fn whole_set() -> bool {
    std::env::var_os("BERTH_E2E_FOCUS").is_none()
}

/// The ginkgo summary: ran, passed, failed, and the failed specs' names.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ran: u32,
    pub passed: u32,
    pub failed: u32,
    pub failures: Vec<String>,
}

/// Reads ginkgo's closing summary (`Ran N of M Specs`, `N Passed | N Failed`, `[Fail] ...`).
pub fn parse(output: &str) -> Outcome {
    let mut o = Outcome::default();
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let words: Vec<&str> = line.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == word)
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| words[i].parse().ok())
    };
    for line in output.lines() {
        let line = line.trim();
        if line.starts_with("Ran ") && line.contains(" Specs in ") {
            o.ran = line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
        if line.contains(" Passed | ") {
            o.passed = o.passed.max(number_before(line, "Passed").unwrap_or(0));
            o.failed = o.failed.max(number_before(line, "Failed").unwrap_or(0));
        }
        if let Some(rest) = line.strip_prefix("[Fail] ") {
            let name = rest.split(" [It] ").collect::<Vec<_>>().join(" ");
            if !o.failures.contains(&name) {
                o.failures.push(name);
            }
        }
    }
    o
}

/// Fails unless the suite ran whole: every spec of the set (at least 200 of them, or at least one
/// of a `BERTH_E2E_FOCUS` set) passed or failed.
pub fn assert_ran(outcome: &Outcome, output: &str) {
    assert!(
        (outcome.ran >= 200 || (!whole_set() && outcome.ran > 0))
            && outcome.passed + outcome.failed == outcome.ran,
        "the suite ran: {outcome:?}\n{}",
        tail(output, 60)
    );
}

/// Builds and pushes the specs' images (`hack/e2e-images.sh`); their repo list is written to
/// `repo_list` for `KUBE_TEST_REPO_LIST`.
pub fn push_images(repo_list: &Path) {
    let images = Command::new("bash")
        .arg(repo_root().join("hack/e2e-images.sh"))
        .arg(registry())
        .arg(kube_bin("BERTH_TEST_AGNHOST"))
        .arg(repo_list)
        .output()
        .expect("hack/e2e-images.sh");
    assert!(
        images.status.success(),
        "e2e images: {}",
        String::from_utf8_lossy(&images.stderr)
    );
}

/// Runs the focused specs against `cp`'s cluster (4 ginkgo nodes, 45 minutes at most) with the
/// images of `repo_list`; ginkgo's stdout and stderr.
pub fn run_suite(cp: &ControlPlane, repo_list: &Path, report: &Path) -> String {
    let mut cmd = Command::new(kube_bin("BERTH_TEST_GINKGO"));
    cmd.env("KUBE_TEST_REPO_LIST", repo_list)
        .arg("-nodes=4")
        .arg("-noColor")
        .arg(kube_bin("BERTH_TEST_E2E"))
        .arg("--")
        .arg(format!("--kubeconfig={}", cp.admin.display()))
        .arg("--provider=skeleton")
        .arg("--num-nodes=1")
        .arg("--container-runtime=remote")
        .arg(format!("--report-dir={}", report.display()))
        .arg(format!("--ginkgo.focus={}", focus()))
        .arg(format!("--ginkgo.skip={}", skip()))
        .arg("--ginkgo.noColor");
    let (_, out, err) = run_for(&mut cmd, Duration::from_secs(45 * 60));
    format!("{out}\n{err}")
}

/// Keeps the whole output beside the build as `target/<name>.log` and ginkgo's JUnit reports
/// (each spec's time) from `report_dir` as `target/<name>-junit/`, and prints the outcome.
pub fn report(name: &str, output: &str, outcome: &Outcome, took: Duration, report_dir: &Path) {
    let saved = repo_root().join(format!("target/{name}.log"));
    let _ = std::fs::write(&saved, output);
    let junit = repo_root().join(format!("target/{name}-junit"));
    let _ = std::fs::remove_dir_all(&junit);
    let _ = std::fs::create_dir_all(&junit);
    for e in std::fs::read_dir(report_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with("junit_") {
            let _ = std::fs::copy(e.path(), junit.join(e.file_name()));
        }
    }
    eprintln!(
        "{name}: ran {}, passed {}, failed {} in {:?} (output: {})\nfailed: {:#?}",
        outcome.ran,
        outcome.passed,
        outcome.failed,
        took,
        saved.display(),
        outcome.failures
    );
}
