#!/usr/bin/env bash
# Agent benchmark (release build): berthd's idle RSS without and with the agent; manifest file
# to all containers Running (host-network busybox pod, cached image) over N pods, p50/p90; then
# berthd's RSS and CPU with those N pods idle for IDLE_SECS; then manifest to Running for N
# networked pods (CNI bridge + host-local from Debian's plugins on a bridge and /24 unique to the
# run, no gateway or NAT; removed at exit). Uses the plain test registry.
#   hack/bench-agent.sh [N]     (N=20; IDLE_SECS=60)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
IDLE_SECS=${IDLE_SECS:-60}
REG=${BERTH_TEST_REGISTRY:-127.0.0.1:5050}
BIN=target/release
[ -x "$BIN/berthd" ] || { echo "build first: cargo build --release" >&2; exit 1; }
work=$(mktemp -d /tmp/berth-bench-agent.XXXXXX)
# The agent endpoint's address, host:port: berthd picks a free port itself (--agent-address
# 127.0.0.1:0) and writes it to $work/state/agent/endpoint once it listens.
addr=
sock=$work/state/berth.sock
pid=
# Disk thresholds at 1 %: a crowded build disk (under 15 % free) is under the kubelet's default
# DiskPressure, which refuses every new pod.
cat >"$work/config.toml" <<TOML
[agent.eviction_hard]
"memory.available" = "100Mi"
"nodefs.available" = "256Mi"
"imagefs.available" = "256Mi"
TOML
# The run's own CNI network for the networked pods.
bridge=bb$(printf '%04x' $((RANDOM % 65536)))
subnet=10.231.$((RANDOM % 250 + 1))
mkdir -p "$work/net.d"
cat >"$work/net.d/10-bench.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "bench-$bridge", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$work/ipam", "ranges": [[{"subnet": "$subnet.0/24"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON

start() {
    "$BIN/berthd" --config "$work/config.toml" --root "$work/root" --state-dir "$work/state" --socket "$sock" \
        --insecure-registry "$REG" --cni-conf-dir "$work/net.d" --cni-bin-dir /usr/lib/cni --log-level warn "$@" \
        >>"$work/berthd.log" 2>&1 &
    pid=$!
    for _ in $(seq 500); do [ -S "$sock" ] && return 0; sleep 0.02; done
    echo "berthd did not start; see $work/berthd.log" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
cleanup() {
    rm -f "$work"/manifests/*.yaml
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && {
        for _ in $(seq 300); do
            [ -n "$addr" ] || break
            [ "$(curl -s "$addr/pods" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["items"]))' 2>/dev/null || echo 0)" = 0 ] && break
            sleep 0.1
        done
        stop
    }
    ip link del "$bridge" 2>/dev/null || true
    umount -R "$work/root" 2>/dev/null || true
    rm -rf "$work" 2>/dev/null || true
}
trap cleanup EXIT

start --no-agent
"$BIN/berthctl" -r "unix://$sock" pull "$REG/busybox" >/dev/null
stop
# Idle RSS of a fresh berthd (the image already in its store), without then with the agent.
start --no-agent
sleep 12
rss_off=$(rss_kib)
stop

mkdir -p "$work/manifests"
start --manifest-dir "$work/manifests" --agent-address 127.0.0.1:0
for _ in $(seq 500); do
    addr=$(tr -d '[:space:]' 2>/dev/null <"$work/state/agent/endpoint" || true)
    [[ $addr =~ ^[0-9.]+:[0-9]+$ ]] && break
    addr=
    sleep 0.02
done
[ -n "$addr" ] || { echo "the agent endpoint did not come up; see $work/berthd.log" >&2; exit 1; }
sleep 12   # the node status is computed once
rss_on=$(rss_kib)

cat >"$work/to-running.py" <<'PY'
import json, os, statistics, sys, time, urllib.request
d, addr, n, img, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
host = "true" if mode == "host" else "false"
times = []
for i in range(n):
    name = f"bench-{mode}-{i}"
    y = (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  hostNetwork: {host}\n"
         f"  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {img}\n"
         f"    imagePullPolicy: IfNotPresent\n    command: [sleep, '3600']\n")
    tmp = os.path.join(d, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(y)
    t0 = time.monotonic()
    os.rename(tmp, os.path.join(d, f"{name}.yaml"))
    while True:
        try:
            p = json.load(urllib.request.urlopen(f"http://{addr}/pods/default/{name}"))
            cs = p["status"].get("containerStatuses", [])
            if cs and all("running" in c["state"] for c in cs):
                break
        except Exception:
            pass
        time.sleep(0.002)
    times.append((time.monotonic() - t0) * 1000)
times.sort()
print(f"manifest -> Running, {mode} network (ms, {n} pods): p50 {statistics.median(times):.1f}  "
      f"p90 {times[int(len(times) * 0.9) - 1]:.1f}  min {times[0]:.1f}  max {times[-1]:.1f}")
PY
python3 "$work/to-running.py" "$work/manifests" "$addr" "$N" "$REG/busybox" host

sleep 5
c0=$(cpu_ticks); t0=$(date +%s.%N)
sleep "$IDLE_SECS"
c1=$(cpu_ticks); t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
rss_pods=$(rss_kib)
cpu=$(python3 -c "print(f'{100 * ($c1 - $c0) / $hz / ($t1 - $t0):.2f}')")
echo "berthd RSS idle, agent off: $((rss_off / 1024)).$(( (rss_off % 1024) * 10 / 1024 )) MiB"
echo "berthd RSS idle, agent on (no pods): $((rss_on / 1024)).$(( (rss_on % 1024) * 10 / 1024 )) MiB"
echo "berthd RSS with $N agent pods idle: $((rss_pods / 1024)).$(( (rss_pods % 1024) * 10 / 1024 )) MiB"
echo "berthd CPU with $N agent pods idle over ${IDLE_SECS}s: ${cpu}% of a core"
python3 "$work/to-running.py" "$work/manifests" "$addr" "$N" "$REG/busybox" pod
