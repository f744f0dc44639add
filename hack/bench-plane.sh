# A control plane on loopback for the cluster benchmarks (source it after bench-common.sh; the
# caller sets W, the work directory, and NS, the namespace its pods go in, and keeps a `plane`
# array for its cleanup): etcd, kube-apiserver and kube-controller-manager from
# hack/kubernetes.sh with certificates made with openssl, Node and RBAC authorization.

now_us() { echo "${EPOCHREALTIME/./}"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ossl() { (cd "$P" && openssl "$@" >/dev/null 2>&1); }

# issue NAME SUBJECT [SANS]: $P/NAME.key and $P/NAME.crt signed by the plane's CA.
issue() {
  ossl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' \
    "${3:+subjectAltName=$3}" >"$P/$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 -extfile "$1.ext"
}

# kubeconfig FILE USER: a kubeconfig for the plane's API server with USER's certificate.
kubeconfig() {
  cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: $P/ca.crt}}]
users: [{name: u, user: {client-certificate: $P/$2.crt, client-key: $P/$2.key}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
YAML
}

# api PATH [CURL ARGS]: the API server as admin.
api() { curl -sS --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" "https://127.0.0.1:$API_PORT$@"; }

# node_ready NODE: the Node's Ready condition status.
node_ready() { api "/api/v1/nodes/$1" 2>/dev/null | jq -r '.status.conditions[]? | select(.type=="Ready") | .status' 2>/dev/null || true; }

# plane_start: the PKI in $P=$W/pki (a CA, the API server's serving and kubelet client
# certificates, an admin; node identities with `issue`), then the control plane
# ($API_PORT, $W/admin.kubeconfig, audit log $W/audit.log); returns once pods can be made in $NS.
plane_start() {
  P=$W/pki
  mkdir -p "$P"
  ossl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=berth-bench-ca
  issue apiserver /CN=kube-apiserver "IP:127.0.0.1,DNS:localhost,IP:10.190.0.1"
  issue admin /O=system:masters/CN=admin
  issue kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client
  openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
  openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  API_PORT=$(free_port)
  kubeconfig "$W/admin.kubeconfig" admin
  local etcd_port peer_port
  etcd_port=$(free_port); peer_port=$(free_port)
  "$BERTH_TEST_ETCD" --data-dir="$W/etcd" --listen-client-urls="http://127.0.0.1:$etcd_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_port" --listen-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" --initial-cluster="default=http://127.0.0.1:$peer_port" \
    --name=default >"$W/etcd.log" 2>&1 &
  plane+=($!)
  printf 'apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n' >"$W/audit.yaml"
  "$BERTH_TEST_KUBE_APISERVER" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
    --secure-port="$API_PORT" --insecure-port=0 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --service-cluster-ip-range=10.190.0.0/24 --client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" \
    --tls-private-key-file="$P/apiserver.key" --service-account-key-file="$P/sa.pub" \
    --service-account-signing-key-file="$P/sa.key" --service-account-issuer=https://kubernetes.default.svc \
    --api-audiences=https://kubernetes.default.svc --authorization-mode=Node,RBAC \
    --kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --enable-admission-plugins=NodeRestriction --audit-policy-file="$W/audit.yaml" \
    --audit-log-path="$W/audit.log" --cert-dir="$W/apiserver-certs" >"$W/apiserver.log" 2>&1 &
  plane+=($!)
  for _ in $(seq 300); do [ "$(api /readyz 2>/dev/null)" = ok ] && break; sleep 0.2; done
  [ "$(api /readyz)" = ok ] || { echo "the API server did not start; see $W/apiserver.log" >&2; exit 1; }
  "$BERTH_TEST_KUBE_CONTROLLER_MANAGER" --kubeconfig="$W/admin.kubeconfig" --bind-address=127.0.0.1 --port=0 \
    --secure-port=0 --leader-elect=false --service-account-private-key-file="$P/sa.key" \
    --root-ca-file="$P/ca.crt" >"$W/controller-manager.log" 2>&1 &
  plane+=($!)
  for _ in $(seq 300); do
    api "/api/v1/namespaces/$NS/secrets" | jq -e '.items[]? | select(.metadata.name | startswith("default-token"))' >/dev/null && break
    sleep 0.2
  done
}

# plane_cleanup BRIDGE_PREFIX: what a cluster benchmark leaves at exit: the run (stop_run), the
# control plane, its bridges (BRIDGE_PREFIX$$N), its pods' logs, and $W unless KEEP=1.
plane_cleanup() {
  set +e
  stop_run
  for p in "${plane[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${plane[@]}"; do wait "$p" 2>/dev/null; done
  for b in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E "^$1$$[0-9]$"); do ip link del "$b" 2>/dev/null; done
  rm -rf /var/log/pods/"$NS"_bench-"$$"-* /var/log/containers/bench-"$$"-*
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
