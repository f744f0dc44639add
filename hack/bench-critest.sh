#!/usr/bin/env bash
# Benchmark: critest's own benchmarks (`critest -benchmark`: N pod lifecycles, then N container
# lifecycles each in a fresh pod, one at a time) against berthd and, in the same run, containerd
# (Debian's 1.6 with runc, CRI plugin), with the same bridge + host-local + portmap conflist
# (hack/bench-net.sh) and the test registry's busybox as critest's container image. The two
# runtimes take turns, R rounds, so that both see the same host. Prints p50/p90 per call over
# all rounds, the ratios Berth/containerd, and RunPodSandbox + CreateContainer + StartContainer
# (the sum of the three p50s: a pod with its first container started).
# Usage: CRITEST=/path/to/critest hack/bench-critest.sh [N] [R] (default 50 and 3). critest is
# built from kubernetes-sigs/cri-tools separately. Needs root, release binaries (make build)
# and containerd + runc (hack/install-deps.sh --bench). KEEP=1 keeps the work directory (with
# critest's JSON output per runtime and round). Everything the run made is removed at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${1:-50}
R=${2:-3}
CRITEST=${CRITEST:-}
[ -x "$CRITEST" ] || { echo "set CRITEST to a critest binary" >&2; exit 2; }
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
release_binaries "$top"
command -v containerd >/dev/null && command -v runc >/dev/null || bash "$here/install-deps.sh" --bench
bench_run_setup critest
# shellcheck source=hack/bench-net.sh
. "$here/bench-net.sh"
pod_networks_init "$N"

cleanup() {
  set +e
  stop_run
  net_cleanup
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat >"$W/images.yaml" <<YAML
defaultTestContainerImage: $IMAGE
webServerTestImage: $IMAGE
YAML
cat >"$W/params.yaml" <<YAML
containersNumber: $N
containersNumberParallel: 1
podsNumber: $N
podsNumberParallel: 1
YAML

write_conflist berth
"$BERTHD" --root "$W/berth/root" --state-dir "$W/berth/state" --socket "$W/berth/berth.sock" \
  --insecure-registry "$REG" --cni-conf-dir "$W/berth/net.d" --cni-bin-dir "$CNI_BIN" \
  --no-agent --log-level warn >"$W/berth/log" 2>&1 &
daemons+=("$!")
wait_sock "$W/berth/berth.sock"

push_pause "$W" "$PAUSE"
write_conflist containerd
write_containerd_config "$W/containerd" "$PAUSE" "$CNI_BIN"
containerd --config "$W/containerd/config.toml" --log-level warn >"$W/containerd/log" 2>&1 &
daemons+=("$!")
wait_sock "$W/containerd/containerd.sock"

# critest KIND SOCKET ROUND: one critest benchmark run; its JSON goes to $W/out/KIND-ROUND.
critest() {
  local out=$W/out/$1-$3
  mkdir -p "$out"
  "$CRITEST" -benchmark -runtime-endpoint "unix://$2" -image-endpoint "unix://$2" \
    -test-images-file "$W/images.yaml" -benchmarking-params-file "$W/params.yaml" \
    -benchmarking-output-dir "$out" >"$out.log" 2>&1 ||
    { echo "critest against $1 failed (round $3):" >&2; tail -20 "$out.log" >&2; exit 1; }
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$R"); do
  critest berth "$W/berth/berth.sock" "$round"
  critest containerd "$W/containerd/containerd.sock" "$round"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "critest -benchmark, $N pods and $N containers per round, $R rounds (ms):"
python3 - "$W/out" <<'PY'
import glob, json, sys

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int((len(xs) - 1) * p / 100 + 0.5))] if xs else float("nan")

calls = {"CreatePod": "RunPodSandbox", "StatusPod": "PodSandboxStatus (verbose)",
         "StopPod": "StopPodSandbox", "RemovePod": "RemovePodSandbox",
         "CreateContainer": "CreateContainer", "StartContainer": "StartContainer",
         "StatusContainer": "ContainerStatus", "StopContainer": "StopContainer",
         "RemoveContainer": "RemoveContainer"}
ms = {}
for kind in ("berth", "containerd"):
    ms[kind] = {}
    for f in glob.glob(f"{sys.argv[1]}/{kind}-*/*_benchmark_data.json"):
        data = json.load(open(f))
        for point in data["datapoints"]:
            for op, ns in zip(data["operationsNames"], point["operationsDurationsNs"]):
                ms[kind].setdefault(op, []).append(ns / 1e6)
row = "{:30} {:>10} {:>8} {:>12} {:>8} {:>7}"
print(row.format("call", "Berth p50", "p90", "containerd", "p90", "ratio"))
for op, name in calls.items():
    b, c = ms["berth"].get(op, []), ms["containerd"].get(op, [])
    print(row.format(name, f"{pct(b, 50):.2f}", f"{pct(b, 90):.2f}", f"{pct(c, 50):.2f}",
                     f"{pct(c, 90):.2f}", f"{pct(b, 50) / pct(c, 50):.2f}"))
start = ("CreatePod", "CreateContainer", "StartContainer")
sb = sum(pct(ms["berth"].get(op, []), 50) for op in start)
sc = sum(pct(ms["containerd"].get(op, []), 50) for op in start)
print(row.format("sandbox + create + start", f"{sb:.2f}", "", f"{sc:.2f}", "", f"{sb / sc:.2f}"))
PY
