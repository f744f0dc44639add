#!/usr/bin/env bash
# Chaos soak: berthd killed with SIGKILL at random moments (KILLS times, default 50) while pods
# with networks and containers are created and removed and shims are killed under it; then the
# CRI's view is checked against the disk, every pod removed, and nothing may be left (mounts,
# cgroups, network namespaces, veths, IPs, shims, processes, bundles, snapshots) and the image's
# blobs must still hash to their digests. It runs tests/chaos.rs with more kills than the suite
# does, with and without the agent, and prints what was checked.
# Usage: hack/soak.sh [KILLS]. Needs root; sets up the test registry as `make test` does.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
kills=${1:-${KILLS:-50}}
cd "$top"
bash "$here/install-deps.sh"
mkdir -p target
bash "$here/test-env.sh" > target/test-env.sh
# shellcheck source=/dev/null
. target/test-env.sh
BERTH_CHAOS_KILLS=$kills cargo nextest run --workspace --test chaos --no-capture 2>&1 |
  grep -E -A5 '^chaos|panicked|PASS|FAIL'
