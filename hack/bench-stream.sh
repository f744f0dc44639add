#!/usr/bin/env bash
# Benchmark: streaming through berthd and, in the same run, through containerd (Debian's 1.6 with
# runc, CRI plugin). On each runtime: one host-network pod with a busybox container that runs a
# port-forward source (nc writing MIB MiB of zeros per connection on a free port), then, driven
# over CRI by the `bench_stream` test client (tests/stream_exec.rs, our own SPDY client):
#   - ExecSync of `true`: p50/p99 over N calls;
#   - a streaming exec of `true`: Exec + SPDY upgrade + streams + exit status, p50/p99 over N;
#   - port-forward download throughput: MIB MiB through one SPDY stream, MiB/s.
# Prints the figures side by side with the ratios Berth/containerd. Targets: exec latency at most
# 0.5x containerd's; port-forward throughput at least containerd's.
# Usage: hack/bench-stream.sh [N] [MIB] (defaults 100 and 256). Needs root and release binaries
# (make build). KEEP=1 keeps the work directory (daemon logs). Everything the run started is
# stopped and removed at exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${1:-100}
MIB=${2:-256}
BERTHD=$top/target/release/berthd
BERTHCTL=$top/target/release/berthctl
SHIM=$top/target/release/berth-shim
for b in "$BERTHD" "$BERTHCTL" "$SHIM"; do
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
W=$(mktemp -d /tmp/berth-bench-stream.XXXXXX)
daemons=()
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
ratio() { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }

cleanup() {
  set +e
  for kind in berth containerd; do
    local sock=$W/$kind/$kind.sock
    [ -S "$sock" ] || continue
    for p in $("$BERTHCTL" -r "unix://$sock" pods -q 2>/dev/null); do
      "$BERTHCTL" -r "unix://$sock" stopp "$p" >/dev/null 2>&1
      "$BERTHCTL" -r "unix://$sock" rmp "$p" >/dev/null 2>&1
    done
  done
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${daemons[@]}"; do wait "$p" 2>/dev/null; done
  # Shims that outlived their daemon (a failed run).
  for p in $(pgrep -f "$W" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  grep -o " $W/[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT


start_berthd() {
  local d=$W/berth
  mkdir -p "$d"
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" --cni-conf-dir "$d/no-cni" \
    --no-agent --log-level "${BERTH_LOG_LEVEL:-warn}" >"$d/log" 2>&1 &
  daemons+=("$!")
  wait_sock "$d/berth.sock"
}

start_containerd() {
  local d=$W/containerd
  write_containerd_config "$d" "$PAUSE"
  containerd --config "$d/config.toml" --log-level warn >"$d/log" 2>&1 &
  daemons+=("$!")
  wait_sock "$d/containerd.sock"
}

# A free TCP port on the host (the pods share the host's network).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run KIND: pod + container on runtime KIND, then the benchmark client; leaves $W/KIND.json.
run() {
  local kind=$1 sock=$W/$1/$1.sock port pod ctr
  port=$(free_port)
  local ctl=("$BERTHCTL" -r "unix://$sock")
  "${ctl[@]}" pull "$IMAGE" >/dev/null
  cat >"$W/$kind-pod.json" <<JSON
{"metadata": {"name": "bench-stream", "namespace": "default", "uid": "bench-stream-$kind", "attempt": 0},
 "log_directory": "$W/$kind/logs",
 "linux": {"security_context": {"namespace_options": {"network": 2}}}}
JSON
  cat >"$W/$kind-ctr.json" <<JSON
{"metadata": {"name": "source"}, "image": {"image": "$IMAGE"}, "log_path": "source.log",
 "command": ["sh", "-c", "while true; do nc -l -p $port -e head -c $((MIB << 20)) /dev/zero; done"],
 "linux": {}}
JSON
  pod=$("${ctl[@]}" runp "$W/$kind-pod.json")
  ctr=$("${ctl[@]}" create "$pod" "$W/$kind-ctr.json" "$W/$kind-pod.json")
  "${ctl[@]}" start "$ctr" >/dev/null
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  sleep 0.5
  # One untimed warm-up of each step.
  BENCH_ENDPOINT=$sock BENCH_CONTAINER=$ctr BENCH_POD=$pod BENCH_N=3 BENCH_MIB=1 BENCH_PF_PORT=$port \
    "$TESTBIN" --ignored --exact bench_stream --nocapture >/dev/null 2>&1 || true
  sleep 0.5
  BENCH_ENDPOINT=$sock BENCH_CONTAINER=$ctr BENCH_POD=$pod BENCH_N=$N BENCH_MIB=$MIB BENCH_PF_PORT=$port \
    "$TESTBIN" --ignored --exact bench_stream --nocapture 2>"$W/$kind.err" | grep '^{' >"$W/$kind.json" ||
    { cat "$W/$kind.err" >&2; return 1; }
}

# The benchmark client: the stream_exec test binary (built by cargo; its SPDY client is ours).
TESTBIN=$(cd "$top" && cargo test --release --test stream_exec --no-run --message-format json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "stream_exec":
        print(m["executable"])' | tail -1)
[ -x "$TESTBIN" ] || { echo "could not build the stream_exec benchmark client" >&2; exit 1; }

push_pause "$W" "$PAUSE"
start_berthd
start_containerd
run berth
run containerd

get() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$W/$1.json" "$2"; }
printf '%-28s %12s %12s %8s\n' "" berth containerd ratio
for k in execsync_p50_ms execsync_p99_ms exec_stream_p50_ms exec_stream_p99_ms portforward_mib_s; do
  b=$(get berth "$k"); c=$(get containerd "$k")
  printf '%-28s %12.2f %12.2f %8s\n' "$k" "$b" "$c" "$(ratio "$b" "$c")"
done
echo "targets: exec_stream_p50 ratio <= 0.5; portforward ratio >= 1 (N=$N, $MIB MiB)"
