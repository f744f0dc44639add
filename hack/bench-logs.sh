#!/usr/bin/env bash
# Container log rotation's cost: a static pod whose container writes 1 GiB of log lines as fast
# as it can (through the shim into its CRI log), run by a release berthd's agent with rotation
# at the kubelet's defaults (10Mi, 5 files, checked every 10 s) and with rotation off (1Ei),
# alternating, RUNS times each. Prints each run's throughput (the container's own start and
# finish times from CRI) and the mean drop with rotation on (target: below 5 %).
# Usage: hack/bench-logs.sh [RUNS]   (default 3; needs root and `make build`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
runs=${1:-3}
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
release_binaries "$top"
bench_run_setup logs
bytes=$((1 << 30))
pid=

cleanup() {
  local rc=$?
  [ -z "$pid" ] || { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
  stop_run
  rm -rf "$W"
  exit "$rc"
}
trap cleanup EXIT

# one_run MAX_SIZE: starts berthd with that rotation size, runs the writer once, prints MiB/s.
one_run() {
  local max=$1 d="$W/run" sock id status started finished
  rm -rf "$d"
  mkdir -p "$d/manifests" "$d/logs"
  cat >"$d/config.toml" <<TOML
[agent]
pod_log_dir = "$d/logs"
cgroup_root = "/$CG-berth"
container_log_max_size = "$max"
container_log_max_files = 5
container_log_monitor_interval_secs = 10.0
# A busy build machine's disk must not stop the writer from being admitted.
[agent.eviction_hard]
"memory.available" = "100Mi"
"nodefs.available" = "256Mi"
"imagefs.available" = "256Mi"
TOML
  sock=$d/state/berth.sock
  "$BERTHD" --config "$d/config.toml" --root "$d/root" --state-dir "$d/state" --socket "$sock" \
    --insecure-registry "$REG" --cni-conf-dir "$d/no-cni" --manifest-dir "$d/manifests" \
    --agent-address 127.0.0.1:0 >"$d/berthd.log" 2>&1 &
  pid=$!
  wait_sock "$sock"
  cat >"$d/manifests/writer.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: writer, namespace: default}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    command: [sh, -c, "yes 'a line of the log rotation benchmark, about sixty-four bytes long' | head -c $bytes"]
YAML
  for _ in $(seq 1200); do
    id=$("$BERTHCTL" -r "$sock" ps -a -q 2>/dev/null | head -1)
    if [ -n "$id" ]; then
      # berthctl's JSON is the CRI message as prost encodes it: the state is its number.
      status=$("$BERTHCTL" -r "$sock" inspect "$id" | jq -r '.status.state')
      [ "$status" = 2 ] && break
    fi
    sleep 0.5
  done
  started=$("$BERTHCTL" -r "$sock" inspect "$id" | jq -r '.status.started_at')
  finished=$("$BERTHCTL" -r "$sock" inspect "$id" | jq -r '.status.finished_at')
  rm -f "$d/manifests/writer.yaml"
  for _ in $(seq 120); do
    [ -z "$("$BERTHCTL" -r "$sock" pods -q 2>/dev/null | head -1)" ] && break
    sleep 0.5
  done
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  echo "scale=1; $bytes / 1048576 / (($finished - $started) / 1000000000)" | bc -l
}

on_total=0 off_total=0
for i in $(seq "$runs"); do
  off=$(one_run 1Ei)
  on=$(one_run 10Mi)
  echo "run $i: rotation off $off MiB/s, on $on MiB/s"
  on_total=$(echo "$on_total + $on" | bc -l)
  off_total=$(echo "$off_total + $off" | bc -l)
done
printf 'mean: off %.1f MiB/s, on %.1f MiB/s, drop %.1f %%\n' \
  "$(echo "$off_total / $runs" | bc -l)" "$(echo "$on_total / $runs" | bc -l)" \
  "$(echo "($off_total - $on_total) * 100 / $off_total" | bc -l)"
