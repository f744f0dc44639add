#!/usr/bin/env bash
# Cluster benchmark: Berth's agent as a node against the stock kubelet 1.20 on berthd (the
# reference), both registered to one real control plane (etcd, kube-apiserver and
# kube-controller-manager from hack/kubernetes.sh on loopback, certificates made here with
# openssl, Node and RBAC authorization), one node after the other in one run:
#   - create to Running: a pod bound to the node POSTed to the API server until the API server
#     says Running (polled every 10 ms), N pods one after another (cached busybox image), p50
#     and p90, with host network and then with a pod network (CNI bridge + host-local);
#   - with those N pods idle for IDLE_SECS: the node's API requests per minute (the API
#     server's audit log, by kind), the node daemons' CPU and RSS (Berth: berthd with its
#     agent; reference: the kubelet plus berthd serving it).
# Usage: hack/bench-cluster.sh [N] (N=20; IDLE_SECS=60). Needs root and release binaries
# (make build). KEEP=1 keeps the work directory (logs). Everything it started is stopped and
# removed at exit. Targets: create to Running p50 <= 250 ms; idle no more than the kubelet's
# rhythm (a Lease update per 10 s, no status PATCH without a change); agent RSS <= 25 MiB.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
# shellcheck source=hack/bench-plane.sh
. "$here/bench-plane.sh"
N=${1:-20}
IDLE_SECS=${IDLE_SECS:-60}
release_binaries "$top"
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
eval "$(bash "$here/kubernetes.sh")"
REG=$BERTH_TEST_REGISTRY
IMAGE=$REG/busybox:latest
W=$(mktemp -d /tmp/berth-bench-cluster.XXXXXX)
CG=berth-bench-cluster-$$
CNI_BIN=/usr/lib/cni
TICK=$(getconf CLK_TCK)
NS=default
daemons=()
bench_pid=
plane=()
cleanup() { plane_cleanup bc; }
trap cleanup EXIT
trap 'exit 130' INT TERM

plane_start

# conflist DIR N: a bridge network of its own in DIR/net.d.
conflist() {
  mkdir -p "$1/net.d"
  cat >"$1/net.d/10-bench.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "bench-$$-$2", "plugins": [
  {"type": "bridge", "bridge": "bc$$$2", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$1/ipam", "ranges": [[{"subnet": "10.$((160 + $2)).$(( $$ % 250 + 1 )).0/24"}]]}}]}
JSON
}

# start_node KIND NET: berthd with its agent (KIND=berth) or berthd and the stock kubelet
# (KIND=kubelet) as node NODE; sets node_pids (the node's daemons).
start_node() {
  local kind=$1 net=$2 n d
  n=$([ "$net" = host ] && echo 1 || echo 2)
  d=$W/$kind-$net
  NODE=bench-$$-$kind-$net
  mkdir -p "$d/manifests" "$d/logs"
  conflist "$d" "$n"
  issue "node-$NODE" "/O=system:nodes/CN=system:node:$NODE"
  kubeconfig "$d/node.kubeconfig" "node-$NODE"
  local common=(--root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" --insecure-registry "$REG"
    --cni-conf-dir "$d/net.d" --cni-bin-dir "$CNI_BIN" --log-level warn)
  if [ "$kind" = berth ]; then
    cat >"$d/berth.toml" <<TOML
[agent]
pod_log_dir = "$d/logs"
cgroup_root = "/$CG-$kind-$net"
[agent.eviction_hard]
"memory.available" = "100Mi"
"nodefs.available" = "256Mi"
"nodefs.inodesFree" = "1%"
"imagefs.available" = "256Mi"
"imagefs.inodesFree" = "1%"
TOML
    "$BERTHD" "${common[@]}" --config "$d/berth.toml" --kubeconfig "$d/node.kubeconfig" --node-name "$NODE" \
      --node-ip 127.0.0.1 --manifest-dir "$d/manifests" --agent-address 127.0.0.1:0 \
      --agent-server-address 127.0.0.1:0 --healthz-address "" >"$d/berthd.log" 2>&1 &
    daemons=($!)
    node_pids=($!)
  else
    "$BERTHD" "${common[@]}" --no-agent >"$d/berthd.log" 2>&1 &
    daemons=($!)
    wait_sock "$d/berth.sock"
    local port
    port=$(free_port)
    for h in $(grep -E ' - cgroup2? ' /proc/self/mountinfo | awk '{print $5}'); do mkdir -p "$h/$CG-$kind-$net"; done
    cat >"$d/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$CG-$kind-$net
failSwapOn: false
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzPort: 0
makeIPTablesUtilChains: false
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 256Mi, nodefs.inodesFree: 1%, imagefs.available: 256Mi}
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: AlwaysAllow}
YAML
    "$BERTH_TEST_KUBELET" --config="$d/kubelet.yaml" --root-dir="$d/kubelet" --cert-dir="$d/kpki" \
      --kubeconfig="$d/node.kubeconfig" --container-runtime=remote \
      --container-runtime-endpoint="unix://$d/berth.sock" --image-service-endpoint="unix://$d/berth.sock" \
      --hostname-override="$NODE" --v=1 >"$d/kubelet.log" 2>&1 &
    daemons+=($!)
    node_pids=("${daemons[@]}")
  fi
  wait_sock "$d/berth.sock"
  "$BERTHCTL" -r "unix://$d/berth.sock" pull -q "$IMAGE" >/dev/null
  for _ in $(seq 600); do [ "$(node_ready "$NODE")" = True ] && return 0; sleep 0.2; done
  echo "$kind node $NODE not Ready; see $d" >&2; exit 1
}

phase() { api "/api/v1/namespaces/$NS/pods/$1" 2>/dev/null | jq -r '.status.phase // ""'; }

# run KIND NET: N pods one after another; ms per pod into $W/KIND-NET.times.
run() {
  local kind=$1 net=$2 d=$W/$1-$2 host=true
  [ "$net" = pod ] && host=false
  start_node "$kind" "$net"
  : >"$d.times"
  for i in $(seq "$N"); do
    local name=bench-$$-$kind-$net-$i t0 t1
    local body="{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"$name\"},\"spec\":{\"nodeName\":\"$NODE\",\"hostNetwork\":$host,\"terminationGracePeriodSeconds\":1,\"containers\":[{\"name\":\"main\",\"image\":\"$IMAGE\",\"imagePullPolicy\":\"IfNotPresent\",\"command\":[\"sleep\",\"100000\"]}]}}"
    t0=$(now_us)
    api "/api/v1/namespaces/$NS/pods" -X POST -H 'Content-Type: application/json' -d "$body" >/dev/null
    for _ in $(seq 3000); do
      [ "$(phase "$name")" = Running ] && break
      sleep 0.01
    done
    t1=$(now_us)
    [ "$(phase "$name")" = Running ] || { echo "$kind: pod $i not Running in 60 s; see $d" >&2; exit 1; }
    echo $(( (t1 - t0) / 1000 )) >>"$d.times"
  done
  if [ "$net" = host ]; then
    sleep 10
    local user=system:node:$NODE c0 c1 t0 t1 rss=0 p lines
    lines=$(wc -l <"$W/audit.log")
    c0=0; for p in "${node_pids[@]}"; do c0=$((c0 + $(ticks "$p"))); done
    sleep "$IDLE_SECS"
    c1=0; for p in "${node_pids[@]}"; do c1=$((c1 + $(ticks "$p"))); done
    for p in "${node_pids[@]}"; do rss=$((rss + $(rss_kib "$p"))); done
    tail -n +"$((lines + 1))" "$W/audit.log" | jq -r --arg u "$user" \
      'select(.stage=="ResponseComplete" and .user.username==$u) | .verb + " " + .objectRef.resource + (if .objectRef.subresource then "/" + .objectRef.subresource else "" end)' |
      sort | uniq -c | awk -v s="$IDLE_SECS" '{printf "%s %s %.1f\n", $2, $3, $1 * 60 / s}' >"$W/$kind.requests"
    echo "$(( (c1 - c0) * 1000 / TICK )) $rss" >"$W/$kind.idle"
  fi
  api "/api/v1/namespaces/$NS/pods?fieldSelector=spec.nodeName=$NODE" -X DELETE >/dev/null
  for _ in $(seq 600); do
    [ "$(api "/api/v1/namespaces/$NS/pods?fieldSelector=spec.nodeName=$NODE" | jq '.items | length')" = 0 ] && break
    sleep 0.1
  done
  stop_run || true
  daemons=()
  api "/api/v1/nodes/$NODE" -X DELETE >/dev/null
}

echo "control plane and kubelet $("$BERTH_TEST_KUBELET" --version), N=$N pods one after another, image $IMAGE"
run_networks berth kubelet
printf '%-48s %10s %10s %7s\n' "" berth kubelet ratio
latency_rows "create to Running" berth kubelet '%-48s %10s %10s %7s\n'
read -r bc brss <"$W/berth.idle"; read -r kc krss <"$W/kubelet.idle"
printf '%-48s %10s %10s %7s\n' "node daemons CPU over ${IDLE_SECS}s, $N idle pods (ms)" "$bc" "$kc" "$(ratio "$bc" "$kc")"
printf '%-48s %10s %10s %7s\n' "node daemons RSS, $N pods (MiB)" "$((brss / 1024))" "$((krss / 1024))" "$(ratio "$brss" "$krss")"
total() { awk '{s += $3} END {printf "%.1f", s}' "$1"; }
printf '%-48s %10s %10s %7s\n' "API requests per minute at idle" "$(total "$W/berth.requests")" "$(total "$W/kubelet.requests")" \
  "$(ratio "$(total "$W/berth.requests")" "$(total "$W/kubelet.requests")")"
for kind in berth kubelet; do
  echo "  $kind, per minute at idle:"
  awk '{printf "    %-40s %6s\n", $1 " " $2, $3}' "$W/$kind.requests"
done
