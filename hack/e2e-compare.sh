#!/usr/bin/env bash
# Runs Kubernetes 1.20's node e2e specs three ways in one run: the stock kubelet on containerd
# 1.6 + runc, the stock kubelet on berthd (tests/kubelet_e2e.rs), and Berth's agent as the node
# (tests/agent_e2e.rs). Prints each column's outcome (ran, passed, failed, wall time, the failed
# specs), the specs that fail in one column and pass in another, and the specs whose time differs
# most between columns (hack/e2e-times.py). Needs root; installs
# containerd and the kubelet build as needed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v containerd >/dev/null || bash hack/install-deps.sh --bench
mkdir -p target
bash hack/test-env.sh > target/test-env.sh
bash hack/kubernetes.sh >> target/test-env.sh
. target/test-env.sh
cargo nextest run --no-run --test kubelet_e2e --test agent_e2e >/dev/null 2>&1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { # column, then the nextest arguments
  local col=$1
  shift
  local start=$SECONDS
  "$@" --no-capture >"$out/$col.log" 2>&1 || true
  echo "== $col ($((SECONDS - start)) s wall)"
  grep -A 200 "^node-e2e-[a-z]*: ran" "$out/$col.log" | sed '/^\s*PASS \|^\s*FAIL \|^────/q' || true
  # The failed specs' names, one per line, for the comparison below.
  sed -n "/^failed: \[$/,/^\]/p" "$out/$col.log" | sed -n 's/^ *"\(.*\)",$/\1/p' | sort >"$out/$col.failed"
}
run kubelet-on-containerd env BERTH_E2E_RUNTIME=containerd cargo nextest run --test kubelet_e2e -E 'test(node_conformance)'
run kubelet-on-berth env BERTH_E2E_RUNTIME=berth cargo nextest run --test kubelet_e2e -E 'test(node_conformance)'
run agent cargo nextest run --test agent_e2e -E 'test(node_conformance)'
for col in kubelet-on-containerd kubelet-on-berth agent; do
  for other in kubelet-on-containerd kubelet-on-berth agent; do
    [ "$col" = "$other" ] && continue
    comm -23 "$out/$col.failed" "$out/$other.failed" | sed "s/^/fails on $col, passes on $other: /"
  done
done
# Where the time goes: spec by spec, the kubelet on Berth against the agent and against
# the kubelet on containerd.
python3 hack/e2e-times.py target/node-e2e-berth-junit target/node-e2e-agent-junit
python3 hack/e2e-times.py target/node-e2e-containerd-junit target/node-e2e-berth-junit
