#!/usr/bin/env bash
# Runs the standalone kubelet checks of tests/kubelet.rs (static pods on host and pod networks,
# init containers, hostPort, liveness restarts, the kubelet and berthd each restarted under
# running pods) against the kubelet binary given, so a node's own kubelet can be checked on
# Berth. The harness gives it the flags and config fields of its version (the runtime endpoint
# in the config from 1.27, `failCgroupV1: false` from 1.31). `make test` runs the same checks
# with the stock kubelet 1.20 that hack/kubernetes.sh builds.
# Usage: hack/kubelet-check.sh KUBELET_BINARY [TEST_FILTER]
# Needs root, the test registries (started here by hack/test-env.sh) and the CNI plugins that
# hack/install-deps.sh installs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kubelet=${1:-}
filter=${2:-}
if [ -z "$kubelet" ] || [ ! -x "$kubelet" ]; then
  echo "usage: $0 KUBELET_BINARY [TEST_FILTER]" >&2
  exit 2
fi
kubelet=$(realpath "$kubelet")
version=$("$kubelet" --version)
echo "checking $version ($kubelet) on Berth" >&2
cd "$here/.."
eval "$(bash hack/test-env.sh)"
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --workspace --bins
args=(--test kubelet)
[ -n "$filter" ] && args+=("$filter")
rc=0
BERTH_TEST_KUBELET=$kubelet cargo nextest run "${args[@]}" || rc=$?
echo "$version: $([ "$rc" = 0 ] && echo "every check passed" || echo "checks failed (exit $rc)")"
exit "$rc"
