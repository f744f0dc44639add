#!/usr/bin/env bash
# Runs Kubernetes 1.20's node e2e specs (tests/kubelet_e2e.rs) with the stock kubelet on berthd
# and then on containerd 1.6 + runc, in one run, and prints both outcomes (ran, passed, failed,
# the failed specs). Needs root; installs containerd and the kubelet build as needed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v containerd >/dev/null || bash hack/install-deps.sh --bench
mkdir -p target
bash hack/test-env.sh > target/test-env.sh
bash hack/kubernetes.sh >> target/test-env.sh
. target/test-env.sh
for rt in berth containerd; do
  echo "== $rt"
  BERTH_E2E_RUNTIME=$rt cargo nextest run --test kubelet_e2e -E 'test(node_conformance)' \
    --no-capture 2>&1 | grep -A 200 '^node e2e on' | sed '/^\s*PASS \|^\s*FAIL \|^────/q' || true
done
