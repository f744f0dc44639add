#!/usr/bin/env bash
# Benchmark: Berth at scale against containerd (Debian's 1.6 with runc, CRI plugin) in the same
# run, both over CRI with berthctl:
#   - with 100 and then 500 pods running (host network, a busybox sleep each, brought up 8 at a
#     time by `berthctl bench lifecycle --hold`): ListContainers and ListPodSandbox p50/p99
#     (`berthctl bench lists`, 200 calls each, with the items decoded and, to time the runtime's
#     answer alone, left encoded), the daemon's RSS growth per pod, and with the
#     first count the daemon's idle CPU over 30 s (berthd runs with its agent on, no manifests;
#     shims are not counted for either runtime);
#   - 50 pods started at once (`bench lifecycle --parallel 50`): wall time until all run;
#   - Berth only (containerd 1.6 has no GetContainerEvents): SIGKILL of a container's process to
#     its CONTAINER_STOPPED event, 50 times (`berthctl bench exits`);
#   - Berth only (CRI v0.36; containerd 1.6 has not the call, and 2000 of its shims would not
#     fit in memory): with STREAM_COUNT pods held, StreamContainers' time to its first message
#     and to its end (`berthctl bench lists`) and the RSS growth per pod.
# Prints a table with the ratios Berth/containerd and the targets, writes the figures as JSON to
# target/bench-scale.json, and draws target/bench-scale.png from it (hack/plot-scale.sh).
# Usage: hack/bench-scale.sh. Needs root and release binaries (make build). Environment: COUNTS
# (default "100 500"), PARALLEL (8), CALLS (200), IDLE_SECS (30), BURST (50), EXITS (50),
# STREAM_COUNT (2000 pods for Berth's StreamContainers stage; 0: none), STREAM_CALLS (20);
# KEEP=1 keeps the work directory. Everything the run made is removed at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
COUNTS=${COUNTS:-"100 500"}
PARALLEL=${PARALLEL:-8}
CALLS=${CALLS:-200}
IDLE_SECS=${IDLE_SECS:-30}
BURST=${BURST:-50}
EXITS=${EXITS:-50}
STREAM_COUNT=${STREAM_COUNT:-2000}
STREAM_CALLS=${STREAM_CALLS:-20}
BERTHD=$top/target/release/berthd
BERTHCTL=$top/target/release/berthctl
for b in "$BERTHD" "$BERTHCTL" "$top/target/release/berth-shim"; do
  [ -x "$b" ] || { echo "build first: make build (missing $b)" >&2; exit 1; }
done
if ! command -v containerd >/dev/null || ! command -v runc >/dev/null; then
  bash "$here/install-deps.sh" --bench
fi
command -v busybox >/dev/null || bash "$here/install-deps.sh"
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
REG=$BERTH_TEST_REGISTRY
IMAGE=$REG/busybox:latest
PAUSE=$REG/berth-bench-pause:latest
W=$(mktemp -d /tmp/berth-bench-scale.XXXXXX)
CG=berth-scale-$$
daemons=()
bench_pid=
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"

cleanup() {
  set +e
  stop_run
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# cpu_ticks PID: user + system clock ticks of a process.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

start_berth() {
  local d=$W/berth
  mkdir -p "$d/manifests"
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" \
    --manifest-dir "$d/manifests" --agent-address 127.0.0.1:0 \
    --log-level warn >"$d/log" 2>&1 &
  daemons+=("$!"); dpid=$!
  wait_sock "$d/berth.sock"
  sock=$d/berth.sock
}

start_containerd() {
  local d=$W/containerd
  write_containerd_config "$d" "$PAUSE"
  containerd --config "$d/config.toml" --log-level warn >"$d/log" 2>&1 &
  daemons+=("$!"); dpid=$!
  wait_sock "$d/containerd.sock"
  sock=$d/containerd.sock
}

# run KIND: every measurement for one runtime; figures go to $W/KIND.*.
run() {
  local kind=$1 first=1 n rss0 rss t0 t1
  "start_$kind"
  make_cgroup_parent "$CG-$kind"
  local args=(-r "$sock" bench lifecycle --image "$IMAGE" --cgroup-parent "/$CG-$kind"
    --log-dir "$W/$kind/logs")
  # Warm up (image pulled, caches filled), then the daemon's memory before any pod.
  "$BERTHCTL" "${args[@]}" --count 3 >/dev/null 2>"$W/$kind.warmup.err" ||
    { cat "$W/$kind.warmup.err" >&2; return 1; }
  sleep 1
  rss0=$(rss_kib "$dpid")
  for n in $COUNTS; do
    "$BERTHCTL" "${args[@]}" --count "$n" --parallel "$PARALLEL" --hold \
      >/dev/null 2>"$W/$kind.$n.err" &
    bench_pid=$!
    until grep -qs '^ready' "$W/$kind.$n.err"; do
      kill -0 "$bench_pid" 2>/dev/null || { cat "$W/$kind.$n.err" >&2; return 1; }
      sleep 0.5
    done
    sleep 3
    rss=$(rss_kib "$dpid")
    echo "$rss0 $rss" >"$W/$kind.$n.mem"
    "$BERTHCTL" -r "$sock" -o json bench lists --calls "$CALLS" >"$W/$kind.$n.lists.json"
    if [ "$first" = 1 ]; then
      t0=$(cpu_ticks "$dpid"); sleep "$IDLE_SECS"; t1=$(cpu_ticks "$dpid")
      echo "$((t1 - t0)) $(getconf CLK_TCK) $IDLE_SECS $n" >"$W/$kind.idle"
      first=0
    fi
    kill -USR1 "$bench_pid"
    wait "$bench_pid" || { cat "$W/$kind.$n.err" >&2; return 1; }
    bench_pid=
  done
  "$BERTHCTL" -o json "${args[@]}" --count "$BURST" --parallel "$BURST" >"$W/$kind.burst.json" \
    2>"$W/$kind.burst.err" || { cat "$W/$kind.burst.err" >&2; return 1; }
  if [ "$kind" = berth ]; then
    "$BERTHCTL" -r "$sock" -o json bench exits --image "$IMAGE" --count "$EXITS" \
      >"$W/$kind.exits.json"
    if [ "$STREAM_COUNT" -gt 0 ]; then
      # STREAM_COUNT pods held: the streaming list and the memory at that scale.
      "$BERTHCTL" "${args[@]}" --count "$STREAM_COUNT" --parallel "$PARALLEL" --hold \
        >/dev/null 2>"$W/$kind.stream.err" &
      bench_pid=$!
      until grep -qs '^ready' "$W/$kind.stream.err"; do
        kill -0 "$bench_pid" 2>/dev/null || { cat "$W/$kind.stream.err" >&2; return 1; }
        sleep 1
      done
      sleep 3
      echo "$rss0 $(rss_kib "$dpid")" >"$W/$kind.stream.mem"
      "$BERTHCTL" -r "$sock" -o json bench lists --calls "$STREAM_CALLS" >"$W/$kind.stream.json"
      kill -USR1 "$bench_pid"
      wait "$bench_pid" || { cat "$W/$kind.stream.err" >&2; return 1; }
      bench_pid=
    fi
  fi
  kill "$dpid"; wait "$dpid" 2>/dev/null || true
}

echo "pushing containerd's pause image" >&2
push_pause "$W" "$PAUSE"
for kind in berth containerd; do
  echo "== $kind" >&2
  run "$kind"
done

mkdir -p "$top/target"
python3 - "$W" "$COUNTS" "$top/target/bench-scale.json" <<'PY'
import json, sys
w, counts, out = sys.argv[1], [int(c) for c in sys.argv[2].split()], sys.argv[3]
def load(p):
    with open(p) as f:
        return json.load(f)
res = {"counts": counts, "runtimes": {}}
for kind in ("berth", "containerd"):
    r = {"lists": {}, "rssPerPodKiB": {}}
    for n in counts:
        l = load(f"{w}/{kind}.{n}.lists.json")
        r["lists"][n] = {k: l[k] for k in ("listContainers", "listPodSandbox",
                                           "listContainersUndecoded", "listPodSandboxUndecoded",
                                           "streamContainersFirst", "streamContainersAll",
                                           "containers", "podSandboxes")}
        rss0, rss = map(int, open(f"{w}/{kind}.{n}.mem").read().split())
        r["rssPerPodKiB"][n] = round((rss - rss0) / n, 1)
    ticks, hz, secs, n = map(int, open(f"{w}/{kind}.idle").read().split())
    r["idleCpuPercent"] = {"pods": n, "percentOfCore": round(100.0 * ticks / hz / secs, 2)}
    r["burst"] = {"pods": load(f"{w}/{kind}.burst.json")["count"],
                  "wallSeconds": round(load(f"{w}/{kind}.burst.json")["upSeconds"], 3)}
    if kind == "berth":
        r["exitToEvent"] = load(f"{w}/{kind}.exits.json")["exitToEvent"]
        try:
            st = load(f"{w}/{kind}.stream.json")
            rss0, rss = map(int, open(f"{w}/{kind}.stream.mem").read().split())
            r["stream"] = {"containers": st["containers"],
                           "first": st["streamContainersFirst"], "all": st["streamContainersAll"],
                           "rssPerPodKiB": round((rss - rss0) / st["containers"], 1)}
        except FileNotFoundError:
            pass
    res["runtimes"][kind] = r
with open(out, "w") as f:
    json.dump(res, f, indent=1)
b, c = res["runtimes"]["berth"], res["runtimes"]["containerd"]
def ratio(x, y):
    return f"{x / y:.2f}" if y else "-"
print(f"{'':34}{'berth':>12}{'containerd':>12}{'ratio':>8}  target")
for n in counts:
    for call, key in (("ListContainers", "listContainers"), ("ListPodSandbox", "listPodSandbox"),
                      ("ListContainers undecoded", "listContainersUndecoded"),
                      ("ListPodSandbox undecoded", "listPodSandboxUndecoded")):
        for q in ("p50Ms", "p99Ms"):
            x, y = b["lists"][n][key][q], c["lists"][n][key][q]
            tgt = {100: "<= 1 ms p50", 500: "<= 5 ms p50"}.get(n, "") if q == "p50Ms" else ""
            print(f"{call + ' ' + q[:3] + ' @' + str(n) + ' (ms)':36}{x:12.3f}{y:12.3f}{ratio(x, y):>8}  {tgt}{', <= 0.5x' if tgt else ''}")
    # StreamContainers (CRI v0.36): containerd 1.6 does not have it.
    for call, key, tgt in (("StreamContainers first", "streamContainersFirst", "< 5 ms @2000"),
                           ("StreamContainers all", "streamContainersAll", "< 50 ms @2000")):
        x, y = b["lists"][n][key], c["lists"][n][key]
        if x:
            other = f"{y['p50Ms']:12.3f}" if y else f"{'-':>12}"
            print(f"{call + ' p50 @' + str(n) + ' (ms)':36}{x['p50Ms']:12.3f}{other}{'':>8}  {tgt}")
    x, y = b["rssPerPodKiB"][n], c["rssPerPodKiB"][n]
    print(f"{'RSS growth per pod @' + str(n) + ' (KiB)':34}{x:12.1f}{y:12.1f}{ratio(x, y):>8}  <= 50 KiB")
x, y = b["idleCpuPercent"]["percentOfCore"], c["idleCpuPercent"]["percentOfCore"]
print(f"{'idle CPU @' + str(b['idleCpuPercent']['pods']) + ' pods (% of a core)':34}{x:12.2f}{y:12.2f}{ratio(x, y):>8}  <= 1 %")
x, y = b["burst"]["wallSeconds"], c["burst"]["wallSeconds"]
print(f"{str(b['burst']['pods']) + ' pods at once, wall (s)':34}{x:12.3f}{y:12.3f}{ratio(x, y):>8}  <= 0.5x")
if "stream" in b:
    st = b["stream"]
    n = st["containers"]
    print(f"{'StreamContainers first p50/p99 @' + str(n) + ' (ms)':36}{st['first']['p50Ms']:6.3f}/{st['first']['p99Ms']:.3f}{'n/a':>15}          < 5 ms")
    print(f"{'StreamContainers all p50/p99 @' + str(n) + ' (ms)':36}{st['all']['p50Ms']:6.3f}/{st['all']['p99Ms']:.3f}{'n/a':>15}          < 50 ms")
    print(f"{'RSS growth per pod @' + str(n) + ' (KiB)':34}{st['rssPerPodKiB']:12.1f}{'n/a':>12}{'':>8}  <= 50 KiB")
e = b["exitToEvent"]
print(f"{'exit to STOPPED event p50/p99 (ms)':34}{e['p50Ms']:6.3f}/{e['p99Ms']:.3f}{'n/a':>15}          p50 <= 5 ms")
PY
bash "$here/plot-scale.sh" "$top/target/bench-scale.json" "$top/target/bench-scale.png" ||
  echo "no chart (gnuplot missing?)" >&2
