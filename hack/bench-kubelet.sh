#!/usr/bin/env bash
# Kubelet benchmark: the same stock kubelet 1.20 (hack/kubernetes.sh) standalone on berthd and on
# containerd 1.6 + runc (Debian; its sandbox image a busybox `sleep` built by the script), one runtime
# after the other in one run. On each:
#   - static pod manifest written to all containers running in the runtime, N pods one after
#     another (cached busybox image), p50/p90, with host network and then with a pod network
#     (CNI bridge + host-local + portmap from Debian's plugins, a bridge and /24 unique to the
#     runtime and run, no gateway or NAT);
#   - with those N pods idle for IDLE_SECS: the kubelet's CPU, the runtime's CPU (daemon and
#     shims) and RSS (daemon, shims, pause processes).
# Usage: hack/bench-kubelet.sh [N] (N=20; IDLE_SECS=30). Needs root and release binaries
# (make build). KEEP=1 keeps the work directory (logs). Everything it started is stopped and
# removed at exit. Targets: Berth <= 0.5x containerd's manifest-to-running time, and less
# runtime CPU and memory at idle.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
N=${1:-20}
IDLE_SECS=${IDLE_SECS:-30}
release_binaries "$top"
if ! command -v containerd >/dev/null || ! command -v runc >/dev/null; then
  bash "$here/install-deps.sh" --bench
fi
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
eval "$(bash "$here/kubernetes.sh")"
REG=$BERTH_TEST_REGISTRY
IMAGE=$REG/busybox:latest
PAUSE=$REG/berth-bench-pause:latest
W=$(mktemp -d /tmp/berth-bench-kubelet.XXXXXX)
CG=berth-bench-kubelet-$$
CNI_BIN=/usr/lib/cni
TICK=$(getconf CLK_TCK)
rt_pid=
kubelet_pid=
our_procs() { pgrep -f "$1" 2>/dev/null | while read -r p; do grep -qF "$W" "/proc/$p/cmdline" 2>/dev/null && echo "$p"; done; }
kill_cgroups() {
  find /sys/fs/cgroup/*/ -maxdepth 1 -name "$CG-*" -type d 2>/dev/null |
    while read -r d; do find "$d" -name cgroup.procs -exec cat {} + ; done | sort -u |
    xargs -r kill -9 2>/dev/null || true
}
cleanup() {
  set +e
  [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null && wait "$kubelet_pid" 2>/dev/null
  [ -n "$rt_pid" ] && kill "$rt_pid" 2>/dev/null && wait "$rt_pid" 2>/dev/null
  for p in $(our_procs berth-shim) $(our_procs containerd-shim); do kill -9 "$p" 2>/dev/null; done
  kill_cgroups
  sleep 0.5
  grep -F " $W" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  find /sys/fs/cgroup/*/ -maxdepth 1 -name "$CG-*" -type d 2>/dev/null |
    while read -r d; do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null; done
  for b in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E "^bk$$[12]$"); do ip link del "$b" 2>/dev/null; done
  rm -rf /var/log/pods/*_bench-"$$"-* /var/log/containers/bench-"$$"-*
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ms_now() { date +%s%3N; }

# conflist RUNTIME DIR: a bridge network of its own for RUNTIME in DIR/net.d.
conflist() {
  local rt=$1 d=$2 n
  n=$([ "$rt" = berth ] && echo 1 || echo 2)
  mkdir -p "$d/net.d"
  cat >"$d/net.d/10-bench.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "bench-$$-$rt", "plugins": [
  {"type": "bridge", "bridge": "bk$$$n", "isGateway": false, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$d/ipam", "ranges": [[{"subnet": "10.$((150 + n)).$(( $$ % 250 + 1 )).0/24"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
}

# start_runtime RUNTIME NET: starts berthd or containerd in $W/RUNTIME-NET; sets rt_pid, sock.
start_runtime() {
  local rt=$1 net=$2 d=$W/$1-$2
  mkdir -p "$d"
  [ "$net" = pod ] && conflist "$rt" "$d"
  if [ "$rt" = berth ]; then
    sock=$d/berth.sock
    local cni=(--cni-conf-dir "$d/net.d" --cni-bin-dir "$CNI_BIN")
    "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$sock" --insecure-registry "$REG" \
      --no-agent --log-level warn "${cni[@]}" >"$d/runtime.log" 2>&1 &
  else
    sock=$d/containerd.sock
    write_containerd_config "$d" "$PAUSE" "$CNI_BIN"
    containerd --config "$d/config.toml" >"$d/runtime.log" 2>&1 &
  fi
  rt_pid=$!
  wait_sock "$sock"
  "$BERTHCTL" -r "unix://$sock" pull -q "$IMAGE" >/dev/null
  [ "$rt" = berth ] || "$BERTHCTL" -r "unix://$sock" pull -q "$PAUSE" >/dev/null
}

start_kubelet() {
  local d=$1 port healthz
  port=$((20000 + $$ % 10000)); healthz=$((port + 1))
  for h in $(grep -E ' - cgroup2? ' /proc/self/mountinfo | awk '{print $5}'); do mkdir -p "$h/$CG-$(basename "$d")"; done
  mkdir -p "$d/manifests"
  cat >"$d/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $d/manifests
fileCheckFrequency: 1s
cgroupDriver: cgroupfs
cgroupRoot: /$CG-$(basename "$d")
failSwapOn: false
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
makeIPTablesUtilChains: false
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, nodefs.inodesFree: 1%, imagefs.available: 256Mi}
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
YAML
  "$BERTH_TEST_KUBELET" --config="$d/kubelet.yaml" --root-dir="$d/kubelet" --cert-dir="$d/pki" \
    --container-runtime=remote --container-runtime-endpoint="unix://$sock" \
    --image-service-endpoint="unix://$sock" --hostname-override="bench-$$" --v=1 >"$d/kubelet.log" 2>&1 &
  kubelet_pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$healthz/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "kubelet not healthy; see $d/kubelet.log" >&2; exit 1
}

# running_pods: how many bench pods have their container running.
running_pods() {
  "$BERTHCTL" -r "unix://$sock" -o json ps 2>/dev/null |
    jq '[.containers[] | select(.labels["io.kubernetes.pod.name"] // "" | startswith("bench-'$$'-"))] | length'
}

# run RUNTIME NET: N pods one after another; prints ms per pod into $W/RUNTIME-NET.times.
run() {
  local rt=$1 net=$2 d=$W/$1-$2 host=true
  [ "$net" = pod ] && host=false
  start_runtime "$rt" "$net"
  start_kubelet "$d"
  : >"$d.times"
  for i in $(seq "$N"); do
    cat >"$d/pod.tmp" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: bench-$$-$i, namespace: default}
spec:
  hostNetwork: $host
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: $IMAGE, imagePullPolicy: IfNotPresent, command: [sleep, "100000"]}
YAML
    local t0 t1
    t0=$(ms_now)
    mv "$d/pod.tmp" "$d/manifests/pod-$i.yaml"
    for _ in $(seq 1200); do
      [ "$(running_pods)" -ge "$i" ] && break
      sleep 0.02
    done
    t1=$(ms_now)
    [ "$(running_pods)" -ge "$i" ] || { echo "$rt: pod $i not running in 60 s; see $d" >&2; exit 1; }
    echo $((t1 - t0)) >>"$d.times"
  done
  if [ "$net" = host ]; then
    sleep 5
    local k0 r0 k1 r1 shims rss
    k0=$(ticks "$kubelet_pid"); r0=$(( $(ticks "$rt_pid") + $(shim_ticks "$rt") ))
    sleep "$IDLE_SECS"
    k1=$(ticks "$kubelet_pid"); r1=$(( $(ticks "$rt_pid") + $(shim_ticks "$rt") ))
    rss=$(rss_kib "$rt_pid")
    shims=0
    for p in $(runtime_helpers "$rt"); do shims=$((shims + $(rss_kib "$p"))); done
    echo "$(( (k1 - k0) * 1000 / TICK )) $(( (r1 - r0) * 1000 / TICK )) $rss $shims" >"$W/$rt.idle"
  fi
  rm -f "$d"/manifests/*.yaml
  for _ in $(seq 600); do [ "$(running_pods)" = 0 ] && break; sleep 0.1; done
  kill "$kubelet_pid"; wait "$kubelet_pid" 2>/dev/null || true; kubelet_pid=
  for s in $("$BERTHCTL" -r "unix://$sock" pods -q 2>/dev/null); do
    "$BERTHCTL" -r "unix://$sock" stopp "$s" >/dev/null 2>&1 || true
    "$BERTHCTL" -r "unix://$sock" rmp "$s" >/dev/null 2>&1 || true
  done
  kill "$rt_pid"; wait "$rt_pid" 2>/dev/null || true; rt_pid=
  kill_cgroups
}

# The runtime's per-container processes: shims, and containerd's pause processes.
runtime_helpers() {
  if [ "$1" = berth ]; then our_procs berth-shim; else
    our_procs containerd-shim
    find /sys/fs/cgroup/memory/ -path "*$CG-*" -name cgroup.procs 2>/dev/null | xargs -r cat |
      while read -r p; do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sleep ] && grep -q 2147483647 "/proc/$p/cmdline" && echo "$p"; done
  fi
}
shim_ticks() { local t=0 p; for p in $(runtime_helpers "$1"); do t=$((t + $(ticks "$p"))); done; echo "$t"; }

push_pause "$W" "$PAUSE"
echo "kubelet $("$BERTH_TEST_KUBELET" --version), N=$N pods one after another, image $IMAGE"
run_networks berth containerd
printf '%-44s %10s %12s %7s\n' "" berth containerd ratio
latency_rows "manifest to running" berth containerd '%-44s %10s %12s %7s\n'
read -r bk br brss bsh <"$W/berth.idle"; read -r ck cr crss csh <"$W/containerd.idle"
printf '%-44s %10s %12s %7s\n' "kubelet CPU over ${IDLE_SECS}s, $N idle pods (ms)" "$bk" "$ck" "$(ratio "$bk" "$ck")"
printf '%-44s %10s %12s %7s\n' "runtime CPU over ${IDLE_SECS}s (daemon+shims, ms)" "$br" "$cr" "$(ratio "$br" "$cr")"
printf '%-44s %10s %12s %7s\n' "runtime daemon RSS (MiB)" "$((brss / 1024))" "$((crss / 1024))" "$(ratio "$brss" "$crss")"
printf '%-44s %10s %12s %7s\n' "shims + pause RSS, $N pods (MiB)" "$((bsh / 1024))" "$((csh / 1024))" "$(ratio "$bsh" "$csh")"
bt=$((brss + bsh)); ct=$((crss + csh))
printf '%-44s %10s %12s %7s\n' "runtime total RSS (MiB)" "$((bt / 1024))" "$((ct / 1024))" "$(ratio "$bt" "$ct")"
