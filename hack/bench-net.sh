# Pod networks for the benchmarks that compare Berth with containerd (source it): per runtime a
# network name, bridge and /24 unique to the run, one conflist shape for both, and their
# clean-up. The caller sets W (the run's work directory).
CNI_BIN=/usr/lib/cni
GATEWAY=${GATEWAY:-0}
ipt_cni() { iptables-save 2>/dev/null | grep -c CNI || true; }

# pod_networks_init N: picks the run's names, bridges and subnets for N pods per runtime (exits
# when N or a missing plugin does not allow it) and records what the clean-up restores.
pod_networks_init() {
  for p in bridge host-local portmap loopback; do
    [ -x "$CNI_BIN/$p" ] || { echo "missing $CNI_BIN/$p (containernetworking-plugins)" >&2; exit 1; }
  done
  [ "$1" -le 250 ] || { echo "--pod-network: at most 250 pods (one /24 per runtime)" >&2; exit 2; }
  # Two adjacent /24s in 10.200.0.0-10.249.255.0 picked from the PID, skipping any the host
  # routes or has an address in.
  in_use() { ip -4 -o route show table all | grep -qE "(^| )10\.$1\.$2\." ||
    ip -4 -o addr | grep -qF " 10.$1.$2."; }
  k=$$
  for _ in $(seq 200); do
    o2=$(( 200 + (k / 128) % 50 )); o3=$(( (k % 128) * 2 ))
    in_use "$o2" "$o3" || in_use "$o2" "$((o3 + 1))" || break
    k=$((k + 1))
  done
  # shellcheck disable=SC2034 # used as ${!name} in write_conflist and net_cleanup
  NET_berth=bench-$$-berth          NET_containerd=bench-$$-containerd
  BR_berth=bnchb$$;                 BR_containerd=bnchc$$
  SUBNET_berth=10.$o2.$o3.0/24;     SUBNET_containerd=10.$o2.$((o3 + 1)).0/24
  ipt_before=$(ipt_cni)
  ip_forward_before=$(cat /proc/sys/net/ipv4/ip_forward)
  cni_cache_existed=$( [ -d /var/lib/cni ] && echo 1 || echo 0)
}

# write_conflist KIND: the run's conflist for one runtime in $W/KIND/net.d, its host-local data in
# $W/KIND/ipam. Only the names, bridge, subnet and dataDir differ between the two runtimes.
write_conflist() {
  local kind=$1 name br subnet gw=false
  [ "$GATEWAY" = 1 ] && gw=true
  name=NET_$kind; br=BR_$kind; subnet=SUBNET_$kind
  mkdir -p "$W/$kind/net.d"
  cat >"$W/$kind/net.d/10-bench.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "${!name}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${!br}",
      "isGateway": $gw,
      "ipMasq": $gw,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "${!subnet}" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$W/$kind/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
JSON
}

# Network leftovers of this run, once its daemons and namespaces are gone: veths still on its
# bridges, the bridges, ipMasq's NAT chains (GATEWAY=1) for its subnets, containerd's cached CNI
# results; ip_forward as it was.
net_cleanup() {
  local kind br subnet net pfx num chain
  for kind in berth containerd; do
    br=BR_$kind; br=${!br}; subnet=SUBNET_$kind; subnet=${!subnet}; net=NET_$kind; net=${!net}
    pfx=${subnet%.0/24}.
    ip -o link show master "$br" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
      xargs -r -n1 ip link del 2>/dev/null
    ip link del "$br" 2>/dev/null
    iptables -t nat -L POSTROUTING -n --line-numbers 2>/dev/null |
      awk -v p="$pfx" 'index($5, p) == 1 && $2 ~ /^CNI-/ {print $1, $2}' | sort -rn |
      while read -r num chain; do
        iptables -t nat -D POSTROUTING "$num"
        iptables -t nat -F "$chain"; iptables -t nat -X "$chain"
      done
    rm -f /var/lib/cni/results/"$net"-*
  done
  # containerd's libcni caches results in /var/lib/cni (no setting for it in 1.6): removed if
  # this run made it and it is empty.
  [ "$cni_cache_existed" = 1 ] || rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$ip_forward_before" ] ||
    echo "$ip_forward_before" >/proc/sys/net/ipv4/ip_forward
  echo "clean-up: iptables-save lines with CNI: $ipt_before before, $(ipt_cni) after;" \
    "links of this run left: $(ip -o link show | grep -cE "bnch[bc]$$([:@ ]|$)" || true);" \
    "ip_forward $ip_forward_before -> $(cat /proc/sys/net/ipv4/ip_forward)"
}


# net_run_cleanup: ends the run (stop_run), removes its network leftovers and its work directory
# (kept with KEEP=1); installed as the EXIT trap by trap_net_run_cleanup.
net_run_cleanup() {
  set +e
  stop_run
  [ -n "${ip_forward_before:-}" ] && net_cleanup
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $W" >&2; else rm -rf "$W"; fi
}
trap_net_run_cleanup() {
  trap net_run_cleanup EXIT
  trap 'exit 130' INT TERM
}

# start_berthd_pod_network: a berthd under $W/berth (root, state, socket, log) on the run's
# berth network, pulling from $REG, without its agent; sets d and berthd_pid, and makes the
# pods' cgroup parent $CG-berth.
start_berthd_pod_network() {
  d=$W/berth
  mkdir -p "$d"
  write_conflist berth
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" \
    --cni-conf-dir "$d/net.d" --cni-bin-dir "$CNI_BIN" --no-agent --log-level warn >"$d/log" 2>&1 &
  berthd_pid=$!
  daemons+=("$berthd_pid")
  wait_sock "$d/berth.sock"
  make_cgroup_parent "$CG-berth"
}
