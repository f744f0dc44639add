//! Kubernetes 1.20's own e2e suite (`e2e.test` under ginkgo) against a one-node cluster: which
//! specs run, their images, the run, and the reading of ginkgo's summary. The node is the stock
//! kubelet (tests/kubelet_e2e.rs) or Berth's agent (tests/agent_e2e.rs).

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::kubelet_support::control_plane::ControlPlane;
use crate::kubelet_support::{kube_bin, run_for};

/// A set of specs and how they run.
pub struct SpecSet {
    /// Ginkgo's focus.
    pub focus: &'static str,
    /// Ginkgo's skip.
    pub skip: &'static str,
    /// Ginkgo processes running specs at once.
    pub ginkgo_nodes: u32,
    /// The fewest specs a whole run of the set runs (a check that the focus still selects it).
    pub at_least: u32,
    /// The environment variable that narrows the focus (a few specs while working on them; the
    /// tests then check only that they pass).
    pub focus_env: &'static str,
}

/// Every spec of the node's areas (pods and their status, probes, container runtime, kubelet,
/// /etc/hosts, variable expansion, init containers, lifecycle hooks, image defaults, privileged
/// pods, security context, sysctls, configMap, secrets, downward API, projected, emptyDir,
/// hostPath and subPath volumes, pod networking on one node, events, preStop): the
/// `[NodeConformance]` and `[Conformance]` ones and the untagged and node-feature ones (FSGroup,
/// Sysctls, HostAccess, PodReadinessGate) a node should pass. Left out: those that need the
/// node to themselves or run long (serial, disruptive, slow: see [`SERIAL`]), are flaky
/// upstream, need a feature gate or a runtime handler the node does not have, and the one that
/// pulls a private image from gcr.io with the suite's own credentials (the test cluster reaches
/// no registry but the local one: it fails on every runtime, after 15 minutes of retries).
pub const PARALLEL: SpecSet = SpecSet {
    focus: r"\[(k8s\.io|sig-[a-z-]+)\] (\[sig-node\] )?(Pods|Probing container|Container Runtime|Kubelet|KubeletManagedEtcHosts|Variable Expansion|InitContainer|Container Lifecycle Hook|Docker Containers|PrivilegedPod|Security Context|Sysctls|ConfigMap|Secrets|Downward API|Projected|EmptyDir|HostPath|Subpath|Networking Granular Checks|Events|PreStop|Pods Extended) ",
    skip: r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Slow\]|\[Feature:[^\]]+\]|\[NodeFeature:(RuntimeHandler|EphemeralStorage)\]|\[NodeAlphaFeature:[^\]]+\]|pull from private registry with secret",
    ginkgo_nodes: 4,
    at_least: 200,
    focus_env: "BERTH_E2E_FOCUS",
};

/// The serial `[Conformance]` specs whose pods run on the node, one at a time, each with the
/// node to itself: pods of a deleted namespace removed, NoExecute taints evicting pods, daemon
/// sets, the scheduler's node selectors, resource limits and host ports, preemption, the
/// configMap volume race, and the downward API's ephemeral-storage limits. Skipped: the specs
/// that need a cluster of at least two nodes and fail on one whatever its runtime (the daemon
/// set's rollback asserts two nodes; basic and critical-pod preemption make one victim pod
/// per node and need two).
pub const SERIAL: SpecSet = SpecSet {
    focus: r"Namespaces \[Serial\] should ensure that all pods are removed|NoExecuteTaintManager .*\[Conformance\]|Daemon set \[Serial\] .*\[Conformance\]|SchedulerPredicates \[Serial\] .*\[Conformance\]|SchedulerPreemption \[Serial\] .*\[Conformance\]|EmptyDir wrapper volumes should not cause race condition when used for configmaps|Downward API \[Serial\] \[Disruptive\] \[NodeFeature:EphemeralStorage\]",
    skip: r"\[Flaky\]|\[Feature:[^\]]+\]|Daemon set \[Serial\] should rollback without unnecessary restarts|SchedulerPreemption \[Serial\] validates (basic preemption works|lower priority pod preemption by critical pod)",
    ginkgo_nodes: 1,
    at_least: 15,
    focus_env: "BERTH_E2E_SERIAL_FOCUS",
};

impl SpecSet {
    /// The skip of a run: the set's, and the specs this host's kernel cannot run on any
    /// runtime: PrivilegedPod's spec adds a dummy network link in a privileged container,
    /// which needs the kernel's dummy link type (a module some kernels lack); tried here in a
    /// network namespace of its own.
    pub fn skip(&self) -> String {
        let dummy_links = Command::new("unshare")
            .args(["-n", "ip", "link", "add", "berth-probe0", "type", "dummy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if dummy_links {
            self.skip.to_string()
        } else {
            eprintln!("this kernel has no dummy network links: PrivilegedPod's spec is skipped");
            format!(
                "{}|PrivilegedPod .*should enable privileged commands",
                self.skip
            )
        }
    }

    /// The focus of a run: the set's, or that of `focus_env` when set.
    pub fn focus(&self) -> String {
        std::env::var(self.focus_env).unwrap_or_else(|_| self.focus.to_string())
    }

    /// Whether the run is the whole set (not narrowed by `focus_env`).
    pub fn whole(&self) -> bool {
        std::env::var_os(self.focus_env).is_none()
    }
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

/// Fails unless the suite ran whole: every spec of `set` (at least `set.at_least` of them, or
/// at least one of a narrowed set) passed or failed.
pub fn assert_ran(set: &SpecSet, outcome: &Outcome, output: &str) {
    assert!(
        (outcome.ran >= set.at_least || (!set.whole() && outcome.ran > 0))
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

/// Runs the specs of `set` against `cp`'s cluster (45 minutes at most) with the images of
/// `repo_list`; ginkgo's stdout and stderr.
pub fn run_suite(set: &SpecSet, cp: &ControlPlane, repo_list: &Path, report: &Path) -> String {
    let mut cmd = Command::new(kube_bin("BERTH_TEST_GINKGO"));
    cmd.env("KUBE_TEST_REPO_LIST", repo_list)
        .arg(format!("-nodes={}", set.ginkgo_nodes))
        .arg("-noColor")
        .arg(kube_bin("BERTH_TEST_E2E"))
        .arg("--")
        .arg(format!("--kubeconfig={}", cp.admin.display()))
        .arg("--provider=skeleton")
        .arg("--num-nodes=1")
        .arg("--container-runtime=remote")
        .arg(format!("--report-dir={}", report.display()))
        .arg(format!("--ginkgo.focus={}", set.focus()))
        .arg(format!("--ginkgo.skip={}", set.skip()))
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
