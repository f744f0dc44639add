#!/usr/bin/env bash
# Benchmark: the CRI metrics and user-namespaced pods, on one berthd with pod networks (Debian's
# bridge plugin), in one run:
#   - with N pods running (a busybox sleep each, own network namespace and cgroup parent):
#     ListPodSandboxMetrics p50/p99 over CALLS calls, against ListPodSandboxStats in the same
#     calls (containerd 1.6 has no CRI metrics; Berth's own stats call is the baseline);
#   - the start of a pod with its own user namespace (RunPodSandbox + CreateContainer +
#     StartContainer, sequential) against a plain pod's, in alternating rounds of STARTS pods.
# Usage: hack/bench-cri-features.sh. Needs root and release binaries (make build). Environment:
# N (default 50), CALLS (100), STARTS (20), ROUNDS (3); KEEP=1 keeps the work directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${N:-50}
CALLS=${CALLS:-100}
STARTS=${STARTS:-20}
ROUNDS=${ROUNDS:-3}
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
# shellcheck source=hack/bench-net.sh
. "$here/bench-net.sh"
release_binaries "$top"
command -v busybox >/dev/null || bash "$here/install-deps.sh"
bench_run_setup cri-features
# The pods' roots (unprivileged host users) must be able to reach their rootfs under it.
chmod 0711 "$W"
pod_networks_init "$N"

trap_net_run_cleanup
start_berthd_pod_network
args=(-r "$d/berth.sock" bench lifecycle --image "$IMAGE" --pod-network
  --cgroup-parent "/$CG-berth" --log-dir "$W/logs")
"$BERTHCTL" "${args[@]}" --count 3 >/dev/null 2>"$W/warmup.err" || { cat "$W/warmup.err" >&2; exit 1; }

echo "== $N pods running, $CALLS calls each" >&2
"$BERTHCTL" "${args[@]}" --count "$N" --parallel 8 --hold >/dev/null 2>"$W/hold.err" &
bench_pid=$!
until grep -qs '^ready' "$W/hold.err"; do
  kill -0 "$bench_pid" 2>/dev/null || { cat "$W/hold.err" >&2; exit 1; }
  sleep 0.5
done
sleep 2
"$BERTHCTL" -r "$d/berth.sock" -o json bench metrics --calls "$CALLS" >"$W/metrics.json"
kill -USR1 "$bench_pid"
wait "$bench_pid" || { cat "$W/hold.err" >&2; exit 1; }
bench_pid=

echo "== starts: $ROUNDS rounds of $STARTS pods, plain and with a user namespace" >&2
for r in $(seq "$ROUNDS"); do
  # Each kind goes first every other round, after a pause: the deferred deletions of the batch
  # before must not weigh on one kind only.
  kinds="plain userns"
  [ $((r % 2)) = 0 ] && kinds="userns plain"
  for kind in $kinds; do
    sleep 2
    extra=()
    [ "$kind" = userns ] && extra=(--user-namespace)
    "$BERTHCTL" -o json "${args[@]}" "${extra[@]}" --count "$STARTS" >"$W/$kind.$r.json" \
      2>"$W/$kind.$r.err" || { cat "$W/$kind.$r.err" >&2; exit 1; }
  done
done

python3 - "$W" "$ROUNDS" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
m = json.load(open(f"{w}/metrics.json"))
print(f"{m['pods']} pods, {m['series']} metric series")
print(f"{'call':<28}{'p50 ms':>10}{'p99 ms':>10}")
for k, name in (("listPodSandboxMetrics", "ListPodSandboxMetrics"), ("listPodSandboxStats", "ListPodSandboxStats")):
    print(f"{name:<28}{m[k]['p50Ms']:>10.2f}{m[k]['p99Ms']:>10.2f}")
print(f"ListPodSandboxMetrics target: p50 <= 20 ms")
def starts(kind):
    out = []
    for r in range(1, rounds + 1):
        out += json.load(open(f"{w}/{kind}.{r}.json"))["samplesMs"]["sandbox+create+start"]
    return out
plain, userns = starts("plain"), starts("userns")
p = statistics.median(plain); u = statistics.median(userns)
print(f"pod start (sandbox+create+start), {len(plain)} pods each:")
print(f"  plain pod                 p50 {p:8.2f} ms")
print(f"  own user namespace        p50 {u:8.2f} ms  ({(u / p - 1) * 100:+.1f} %, target <= +10 %)")
PY
