#!/usr/bin/env bash
# Node server benchmark: what a cluster's user waits for through the API server, on a Berth node
# (berthd with its agent's node server) against the stock kubelet 1.20 on containerd (the
# reference), both joined to one real control plane (hack/bench-plane.sh), one after the other:
#   - `kubectl exec <pod> -- true`, R times: p50 and p90 (kubectl's own start-up is in both), and
#     `kubectl get pod` as often, the part of an exec that is kubectl and the API server alone;
#   - `kubectl logs` of a container that wrote 100 MiB to stdout: output MiB/s (best of 3);
#   - `/stats/summary` through the API server's node proxy with 50 pods on the node, R times:
#     p50 and p90 (curl's total time).
# Usage: hack/bench-node-server.sh [R] (R=20). Needs root, release binaries (make build) and
# containerd (hack/install-deps.sh --bench). KEEP=1 keeps the work directory. Everything it
# started is stopped and removed at exit. Targets: exec p50 <= 0.7x the reference; logs
# throughput >= the reference's; stats/summary p50 <= 20 ms.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
# shellcheck source=hack/bench-plane.sh
. "$here/bench-plane.sh"
R=${1:-20}
PODS=50
LOG_MIB=100
release_binaries "$top"
command -v containerd >/dev/null || { echo "containerd missing: bash hack/install-deps.sh --bench" >&2; exit 1; }
bench_run_setup node-server
eval "$(bash "$here/kubernetes.sh")"
KUBECTL=$BERTH_TEST_KUBECTL
CNI_BIN=/usr/lib/cni
NS=default
plane=()
cleanup() { plane_cleanup bn; }
trap cleanup EXIT
trap 'exit 130' INT TERM

plane_start
push_pause "$W" "$PAUSE"
kc() { "$KUBECTL" --kubeconfig="$W/admin.kubeconfig" -n "$NS" "$@"; }

# start_node KIND: berthd with its agent (berth) or containerd with the stock kubelet (kubelet)
# as node $NODE; both authenticate the API server's kubelet client certificate. The kubelet
# refuses a loopback node IP: it reports the default route's address and listens on all.
start_node() {
  local kind=$1 d=$W/$1 n port sock
  n=$([ "$kind" = berth ] && echo 1 || echo 2)
  NODE=bench-$$-$kind
  mkdir -p "$d/net.d" "$d/logs" "$d/manifests"
  cat >"$d/net.d/10-bench.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "bench-$$-$n", "plugins": [
  {"type": "bridge", "bridge": "bn$$$n", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$d/ipam", "ranges": [[{"subnet": "10.$((170 + n)).$(( $$ % 250 + 1 )).0/24"}]]}}]}
JSON
  issue "node-$NODE" "/O=system:nodes/CN=system:node:$NODE"
  kubeconfig "$d/node.kubeconfig" "node-$NODE"
  port=$(free_port)
  if [ "$kind" = berth ]; then
    sock=$d/berth.sock
    cat >"$d/berth.toml" <<TOML
[agent]
pod_log_dir = "$d/logs"
cgroup_root = "/$CG-$kind"
[agent.eviction_hard]
"memory.available" = "100Mi"
"nodefs.available" = "256Mi"
"nodefs.inodesFree" = "1%"
"imagefs.available" = "256Mi"
"imagefs.inodesFree" = "1%"
TOML
    "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$sock" --insecure-registry "$REG" \
      --cni-conf-dir "$d/net.d" --cni-bin-dir "$CNI_BIN" --log-level warn --config "$d/berth.toml" \
      --kubeconfig "$d/node.kubeconfig" --node-name "$NODE" --node-ip 127.0.0.1 \
      --manifest-dir "$d/manifests" --agent-address 127.0.0.1:0 --agent-server-address "127.0.0.1:$port" \
      --healthz-address "" --client-ca-file "$P/ca.crt" >"$d/berthd.log" 2>&1 &
    daemons=($!)
  else
    sock=$d/containerd.sock
    write_containerd_config "$d" "$PAUSE" "$CNI_BIN"
    containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
    daemons=($!)
    wait_sock "$sock"
    for h in $(grep -E ' - cgroup2? ' /proc/self/mountinfo | awk '{print $5}'); do mkdir -p "$h/$CG-$kind"; done
    cat >"$d/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CG-$kind
failSwapOn: false
address: 0.0.0.0
port: $port
readOnlyPort: 0
healthzPort: 0
makeIPTablesUtilChains: false
serializeImagePulls: false
# Rotation at the default 10 Mi would leave kubectl logs only the last file of the 100 MiB.
containerLogMaxSize: 200Mi
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, nodefs.inodesFree: 1%, imagefs.available: 256Mi}
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: AlwaysAllow}
YAML
    "$BERTH_TEST_KUBELET" --config="$d/kubelet.yaml" --root-dir="$d/kubelet" --cert-dir="$d/kpki" \
      --kubeconfig="$d/node.kubeconfig" --container-runtime=remote \
      --container-runtime-endpoint="unix://$sock" --image-service-endpoint="unix://$sock" \
      --hostname-override="$NODE" --v=1 >"$d/kubelet.log" 2>&1 &
    daemons+=($!)
  fi
  wait_sock "$sock"
  "$BERTHCTL" -r "unix://$sock" pull -q "$IMAGE" >/dev/null
  [ "$kind" = berth ] || "$BERTHCTL" -r "unix://$sock" pull -q "$PAUSE" >/dev/null
  for _ in $(seq 600); do [ "$(node_ready "$NODE")" = True ] && return 0; sleep 0.2; done
  echo "$kind node $NODE not Ready; see $d" >&2; exit 1
}

# pod NAME SCRIPT: a host-network busybox pod on $NODE running SCRIPT.
pod() {
  api "/api/v1/namespaces/$NS/pods" -X POST -H 'Content-Type: application/json' -d "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"$1\"},\"spec\":{\"nodeName\":\"$NODE\",\"hostNetwork\":true,\"terminationGracePeriodSeconds\":1,\"containers\":[{\"name\":\"main\",\"image\":\"$IMAGE\",\"imagePullPolicy\":\"IfNotPresent\",\"command\":[\"sh\",\"-c\",\"$2\"]}]}}" >/dev/null
}

running_count() {
  api "/api/v1/namespaces/$NS/pods?fieldSelector=spec.nodeName=$NODE" | jq '[.items[] | select(.status.phase=="Running")] | length'
}

# run KIND: the three measurements on a fresh KIND node; results in $W/KIND.{exec,logs,stats}.
run() {
  local kind=$1 i t0 t1 bytes best=0
  start_node "$kind"
  local prefix=bench-$$-$kind
  pod "$prefix-talk" "sleep 100000"
  # 100 MiB of 100-byte lines, then idle.
  pod "$prefix-biglog" "yes 012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678 | head -c $((LOG_MIB * 1048576)); sleep 100000"
  for i in $(seq 3 "$PODS"); do pod "$prefix-idle-$i" "sleep 100000"; done
  for _ in $(seq 1200); do [ "$(running_count)" = "$PODS" ] && break; sleep 0.25; done
  [ "$(running_count)" = "$PODS" ] || { echo "$kind: not all $PODS pods Running; see $W/$kind" >&2; exit 1; }
  # The whole log written: the CRI log file is past the output's size and stopped growing.
  local file s1 s2=0
  for _ in $(seq 600); do
    file=$(find "$W/$kind/logs" /var/log/pods -path "*_${prefix}-biglog_*/main/0.log" 2>/dev/null | head -1)
    s1=$(stat -c %s "$file" 2>/dev/null || echo 0)
    [ "$s1" -gt $((LOG_MIB * 1048576)) ] && [ "$s1" = "$s2" ] && break
    s2=$s1
    sleep 0.5
  done
  : >"$W/$kind.exec"
  for i in $(seq "$R"); do
    t0=$(now_us); kc exec "$prefix-talk" -- true; t1=$(now_us)
    echo $(( (t1 - t0) / 1000 )) >>"$W/$kind.exec"
  done
  : >"$W/$kind.get"
  for i in $(seq "$R"); do
    t0=$(now_us); kc get pod "$prefix-talk" >/dev/null; t1=$(now_us)
    echo $(( (t1 - t0) / 1000 )) >>"$W/$kind.get"
  done
  for i in 1 2 3; do
    t0=$(now_us); bytes=$(kc logs "$prefix-biglog" | wc -c); t1=$(now_us)
    local rate
    rate=$(echo "$bytes / 1048576 / (($t1 - $t0) / 1000000)" | bc -l)
    best=$(echo "if ($rate > $best) $rate else $best" | bc -l)
  done
  printf '%.0f %s\n' "$best" "$bytes" >"$W/$kind.logs"
  : >"$W/$kind.stats"
  for i in $(seq "$R"); do
    api "/api/v1/nodes/$NODE/proxy/stats/summary" -o /dev/null -w '%{time_total}\n' |
      awk '{printf "%.1f\n", $1 * 1000}' >>"$W/$kind.stats"
  done
  api "/api/v1/namespaces/$NS/pods?fieldSelector=spec.nodeName=$NODE" -X DELETE >/dev/null
  for _ in $(seq 900); do
    [ "$(api "/api/v1/namespaces/$NS/pods?fieldSelector=spec.nodeName=$NODE" | jq '.items | length')" = 0 ] && break
    sleep 0.2
  done
  stop_run || true
  daemons=()
  api "/api/v1/nodes/$NODE" -X DELETE >/dev/null
}

echo "control plane and kubelet $("$BERTH_TEST_KUBELET" --version), containerd $(containerd --version | awk '{print $3}'), kubectl $("$KUBECTL" version --client --short 2>/dev/null | awk '{print $3}'), R=$R"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
run berth
run kubelet
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
row() { printf '%-50s %10s %10s %7s\n' "$1" "$2" "$3" "$4"; }
row "" berth kubelet ratio
for p in 50 90; do
  a=$(pct "$p" <"$W/berth.exec"); b=$(pct "$p" <"$W/kubelet.exec")
  row "kubectl exec -- true, p$p (ms)" "$a" "$b" "$(ratio "$a" "$b")"
done
a=$(pct 50 <"$W/berth.get"); b=$(pct 50 <"$W/kubelet.get")
row "  kubectl get pod, p50 (ms): no node involved" "$a" "$b" "$(ratio "$a" "$b")"
a=$(( $(pct 50 <"$W/berth.exec") - a )); b=$(( $(pct 50 <"$W/kubelet.exec") - b ))
row "  exec minus get, p50 (ms): the node's share" "$a" "$b" "$(ratio "$a" "$b")"
read -r bl bbytes <"$W/berth.logs"; read -r kl kbytes <"$W/kubelet.logs"
row "kubectl logs of ${LOG_MIB} MiB, best of 3 (MiB/s)" "$bl" "$kl" "$(ratio "$bl" "$kl")"
row "  bytes shown" "$bbytes" "$kbytes" ""
for p in 50 90; do
  a=$(pct "$p" <"$W/berth.stats"); b=$(pct "$p" <"$W/kubelet.stats")
  row "stats/summary, $PODS pods, p$p (ms)" "$a" "$b" "$(ratio "$a" "$b")"
done
