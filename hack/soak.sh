#!/usr/bin/env bash
# Soak: two parts, in one run.
#   Chaos (--kills N, default 50; 0 skips it): tests/chaos.rs with N kills. berthd is killed with
#     SIGKILL at random moments while pods with networks and containers are created and removed
#     and shims are killed under it (every fifth round on a root filled to ENOSPC, every fifth
#     with a CNI plugin hanging), then with the agent running static pods whose manifests come
#     and go. Afterwards the CRI's view is checked against the disk, every pod is removed, nothing
#     may be left (mounts, cgroups, network namespaces, veths, IPs, shims, processes, bundles,
#     snapshots) and the image's blobs must still hash to their digests. Prints what was checked.
#   Endurance (--hours H, default 1; 0 skips it): a release berthd with pod networks (Debian's
#     bridge plugin) under `berthctl bench soak`: pods created and removed without pause for H
#     hours, 10 kept running. Prints pods per second, p50/p99 of every CRI call over the whole
#     run, and berthd's RSS and fd count after a 2-minute warm-up against the end (target: flat
#     within 1 MiB and 10 fds).
# Usage: hack/soak.sh [--hours H] [--kills N]. Needs root; the endurance part needs release
# binaries (make build). KEEP=1 keeps the endurance run's work directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
hours=1 kills=50
while [ $# -gt 0 ]; do
  case $1 in
    --hours) hours=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    *) echo "usage: $0 [--hours H] [--kills N]" >&2; exit 2 ;;
  esac
done
cd "$top"
bash "$here/install-deps.sh"

if [ "$kills" != 0 ]; then
  echo "== chaos: $kills kills, with and without the agent" >&2
  mkdir -p target
  bash "$here/test-env.sh" > target/test-env.sh
  # shellcheck source=/dev/null
  . target/test-env.sh
  BERTH_CHAOS_KILLS=$kills cargo nextest run --workspace --test chaos --no-capture 2>&1 |
    grep -E -A5 '^(agent )?chaos|panicked|PASS|FAIL'
fi

[ "$hours" != 0 ] || exit 0
echo "== endurance: $hours h" >&2
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
# shellcheck source=hack/bench-net.sh
. "$here/bench-net.sh"
release_binaries "$top"
bench_run_setup soak
pod_networks_init 20
trap_net_run_cleanup
start_berthd_pod_network
secs=$(printf '%.0f' "$(echo "$hours * 3600" | bc -l)")
"$BERTHCTL" -r "$d/berth.sock" bench soak --image "$IMAGE" --pod-network \
  --cgroup-parent "/$CG-berth" --pid "$berthd_pid" --duration-secs "$secs"
