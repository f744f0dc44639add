//! Kubernetes 1.20's own e2e suite with Berth's agent as the cluster's only node (no kubelet):
//! the same `e2e.test`, specs and images as tests/kubelet_e2e.rs, whose stock kubelet on berthd
//! is the reference, and the serial specs on a node of their own. The agent passes every spec
//! but those of `AGENT_MAY_FAIL`.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod e2e_support;
mod kubelet_support;

use std::time::Instant;

use cluster_node::AgentNode;
use common::*;
use e2e_support::{PARALLEL, SERIAL, SpecSet, assert_ran, parse, push_images, report, run_suite};

/// Specs the agent may fail, each with why; the kubelet on Berth passes them all, so each entry
/// would be a difference still to remove. None today.
const AGENT_MAY_FAIL: &[(&str, &str)] = &[];

#[tokio::test]
async fn node_conformance_specs_pass_with_the_agent_as_the_node() {
    run_set(&PARALLEL, "node-e2e-agent");
}

/// The serial specs, one at a time on a node of their own; the agent fails none.
#[tokio::test]
async fn serial_specs_pass_with_the_agent_as_the_node() {
    run_set(&SERIAL, "node-e2e-serial-agent");
}

/// Runs `set` against a fresh agent node, keeping its output as `name`; fails on any spec the
/// agent fails but those of `AGENT_MAY_FAIL`.
fn run_set(set: &SpecSet, name: &str) {
    // Volumes of configMaps and secrets are refreshed as often as the stock kubelet's sync in
    // tests/kubelet_e2e.rs (syncFrequency 3 s), so the two nodes' spec times compare.
    let mut n = AgentNode::start_schedulable("volume_refresh_secs = 3.0\n");
    n.cp.start_scheduler();
    let work = TempDir::new("agent-e2e");
    let repo_list = work.path().join("repo-list.yaml");
    push_images(&repo_list);
    let started = Instant::now();
    let report_dir = work.path().join("report");
    let output = run_suite(set, &n.cp, &repo_list, &report_dir);
    let outcome = parse(&output);
    report(name, &output, &outcome, started.elapsed(), &report_dir);
    let _ = std::fs::write(
        repo_root().join(format!("target/{name}-berthd.log")),
        n.agent.daemon.log(),
    );
    assert_ran(set, &outcome, &output);
    let unexpected: Vec<&String> = outcome
        .failures
        .iter()
        .filter(|f| !AGENT_MAY_FAIL.iter().any(|(name, _)| f.contains(name)))
        .collect();
    assert!(
        unexpected.is_empty(),
        "specs the agent fails: {unexpected:#?}\nberthd:\n{}\n{}",
        warnings(&n.agent.daemon.log()),
        tail(&output, 120)
    );
}

/// berthd's warnings and errors, last 80.
fn warnings(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}
