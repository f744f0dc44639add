#!/usr/bin/env bash
# Runs in the node VM (hack/node-vm.sh) at each boot, from the share tests/node_vm.rs made.
# Boot 1: installs Berth's package, runs a static pod through the agent of the berthd systemd
# started, checks it on the pure cgroup v2 hierarchy, restarts berthd under it, asks for a
# reboot; swap is on, Burstable containers get their share (LimitedSwap), and the CRI metrics
# carry PSI. Boot 2: berthd is back at boot, the old container is reported ended and the agent
# runs the pod again; then, the agent off, the stock kubelet 1.20 (from the share) runs a static
# pod on the same berthd. AppArmor: berth-default on every container, a Localhost profile named
# through the agent's securityContext field and the kubelet's annotation. The agent joins the
# control plane on the host with a bootstrap token (deleted once joined) and, after the reboot,
# rejoins with its stored certificate. Prints "ok: ..." per check; the first failure ends the run.
set -euo pipefail
cd /mnt/share
# REGISTRY: the host's test registry as the guest reaches it (10.0.2.2:PORT).
. ./env
phase=$(cat phase 2>/dev/null || echo 1)
echo "== boot $phase: $(uname -r), $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup"

fail() {
  echo "FAIL: $*"
  systemctl status berthd --no-pager || true
  echo "-- berthd's journal (this boot) --"
  journalctl -b -u berthd --no-pager | tail -60 || true
  exit 1
}
ok() { echo "ok: $* (${SECONDS}s)"; }
# berthctl, with a bound on each call: a hang shows as a failure with berthd's journal.
bctl() { timeout 30 berthctl --timeout 20 "$@"; }
restart_berthd() { timeout 120 systemctl restart berthd; }
# wait_for SECS CMD...: CMD succeeds within SECS seconds.
wait_for() {
  local secs=$1
  shift
  local end=$((SECONDS + secs))
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.5
  done
}
# The id of the running container named $1, if any.
running_id() {
  bctl -o json ps 2>/dev/null |
    jq -r --arg n "$1" '.containers[]? | select(.metadata.name == $n) | .id' | head -n1
}
has_running() { [ -n "$(running_id "$1")" ]; }
not_running() { ! has_running "$1"; }
berthd_up() { systemctl is-active -q berthd && bctl version >/dev/null 2>&1; }

# A static pod: pod $1, container $2 sleeping; $3, $4 and $5 are lines added to the pod's
# metadata, to its spec and to its container.
sleeper_pod() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
$3
spec:
$4
  containers:
  - name: $2
    image: $REGISTRY/busybox:latest
    command: ["sleep", "3600"]
$5
EOF
}
# A static pod sharing one PID namespace: pod $1, container $2 sleeping under 64Mi and 200m.
shared_pod() {
  sleeper_pod "$1" "$2" "" "  shareProcessNamespace: true" "    resources:
      limits:
        memory: 64Mi
        cpu: 200m"
}
# shared_pod's limits in force, as container $1 reads them from its cgroup.
check_limits() {
  local v
  v=$(bctl exec "$1" cat /sys/fs/cgroup/memory.max) || fail "reading memory.max in $1"
  [ "$v" = 67108864 ] || fail "memory.max in $1 is $v, want 67108864"
  ok "memory.max 67108864"
  v=$(bctl exec "$1" cat /sys/fs/cgroup/cpu.max) || fail "reading cpu.max in $1"
  [ "$v" = "20000 100000" ] || fail "cpu.max in $1 is '$v', want '20000 100000'"
  ok "cpu.max 20000 100000"
}
# Loads the Localhost AppArmor profile the confined pods name: everything but writes under
# /tmp (profiles loaded by hand do not outlive a boot).
load_test_profile() {
  apparmor_parser --replace <<'PROFILE' || fail "loading the test AppArmor profile"
profile berth-test-deny-tmp flags=(attach_disconnected,mediate_deleted) {
  file,
  network,
  capability,
  signal,
  deny /tmp/** w,
}
PROFILE
}
# A pod whose container $2 sleeps under the Localhost profile berth-test-deny-tmp, named by the
# securityContext field ($3 = field: the agent) or by the annotation the kubelet 1.20 reads
# ($3 = annotation).
confined_pod() {
  if [ "$3" = annotation ]; then
    sleeper_pod "$1" "$2" "  annotations:
    container.apparmor.security.beta.kubernetes.io/$2: localhost/berth-test-deny-tmp" "" ""
  else
    sleeper_pod "$1" "$2" "" "" "    securityContext:
      appArmorProfile: {type: Localhost, localhostProfile: berth-test-deny-tmp}"
  fi
}
# Container $1 and what is exec'd in it run under berth-test-deny-tmp, which is enforced.
check_confined() {
  local v
  v=$(bctl exec "$1" sh -c 'cat /proc/1/attr/current /proc/self/attr/current') ||
    fail "reading the AppArmor labels of $1"
  [ "$v" = "berth-test-deny-tmp (enforce)
berth-test-deny-tmp (enforce)" ] || fail "container $1 and its exec run under '$v'"
  v=$(bctl exec "$1" sh -c 'touch /tmp/denied 2>/dev/null; echo $?; touch /allowed; echo $?')
  [ "$v" = "1
0" ] || fail "under berth-test-deny-tmp, touch /tmp and / in $1 gave '$v', want 1 and 0"
  ok "the Localhost AppArmor profile confines the container and its exec ($1)"
}
# kubectl as the cluster's admin (the control plane on the host).
kctl() { timeout 30 ./kubectl --kubeconfig admin.kubeconfig "$@"; }
# The node is Ready in the cluster.
node_ready() {
  [ "$(kctl get node node-vm -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
# The node's lease was renewed after this boot began.
lease_renewed_this_boot() {
  local renew
  renew=$(kctl -n kube-node-lease get lease node-vm -o 'jsonpath={.spec.renewTime}' 2>/dev/null) || return 1
  [ -n "$renew" ] && [ "$(date -d "$renew" +%s)" -gt "$(date -d "$(uptime -s)" +%s)" ]
}
# The pod cgroups and pod init cgroups left in the tree of berthd's cgroup driver.
pod_cgroups() {
  local tree=/sys/fs/cgroup/kubepods
  [ "$(berthd_driver)" = systemd ] && tree=/sys/fs/cgroup/kubepods.slice
  find "$tree" \( -name 'pod*' -o -name '*-pod*.slice' -o -name 'berth-pod-init*' \) -type d 2>/dev/null
}
# Nothing of a removed pod left: no container, no sandbox, no pod cgroup, no pod init's leaf,
# no unit of Berth's.
node_empty() {
  [ -z "$(bctl ps -aq)" ] && [ -z "$(bctl pods -q)" ] && [ -z "$(pod_cgroups)" ] &&
    [ -z "$(systemctl list-units --all --no-legend 'berth-*.scope')" ]
}
# The cgroup driver berthd reports.
berthd_driver() { bctl -o json info | jq -r '.info.berth | fromjson | .cgroupDriver'; }
# Under the systemd driver, container $1 runs in its scope, whose limits systemd keeps across
# a daemon-reload (it writes its units' properties again then).
check_scope_limits() {
  local unit=berth-$1.scope
  systemctl is-active -q "$unit" || fail "no active unit $unit for container $1"
  [ "$(systemctl show -P MemoryMax "$unit")" = 67108864 ] ||
    fail "$unit has MemoryMax $(systemctl show -P MemoryMax "$unit")"
  systemctl daemon-reload
  check_limits "$1"
  ok "container $1 in $unit; its limits kept across systemctl daemon-reload"
  # UpdateContainerResources goes to the unit too, so the new limit outlives a daemon-reload.
  bctl update --memory 100663296 "$1" >/dev/null || fail "updating the memory limit of $1"
  [ "$(systemctl show -P MemoryMax "$unit")" = 100663296 ] ||
    fail "after the update $unit has MemoryMax $(systemctl show -P MemoryMax "$unit")"
  systemctl daemon-reload
  local v
  v=$(bctl exec "$1" cat /sys/fs/cgroup/memory.max) || fail "reading memory.max in $1"
  [ "$v" = 100663296 ] || fail "after the update and a daemon-reload memory.max in $1 is $v"
  ok "an updated limit of $1 kept across systemctl daemon-reload"
}

# Swap and pressure on cgroup v2: the Guaranteed container $1 gets no swap, nor does a
# BestEffort one (no memory limit: the scope's MemorySwapMax is what keeps it), a Burstable one
# its share of the node's (LimitedSwap); all kept across a daemon-reload. The CRI metrics
# carry PSI.
check_swap_and_pressure() {
  local v
  v=$(bctl exec "$1" cat /sys/fs/cgroup/memory.swap.max) || fail "reading memory.swap.max in $1"
  [ "$v" = 0 ] || fail "memory.swap.max of the Guaranteed container $1 is $v, want 0"
  sleeper_pod swapper swap "" "" "    resources:
      requests:
        memory: 32Mi
      limits:
        memory: 128Mi" >/etc/berth/manifests/swapper.yaml
  sleeper_pod besteffort nolimit "" "" "" >/etc/berth/manifests/besteffort.yaml
  wait_for 120 has_running swap || fail "the Burstable pod is not running"
  wait_for 120 has_running nolimit || fail "the BestEffort pod is not running"
  local id be prop
  id=$(running_id swap)
  be=$(running_id nolimit)
  v=$(bctl exec "$id" cat /sys/fs/cgroup/memory.swap.max) || fail "reading memory.swap.max in $id"
  # Its request's share of the node's memory, of 256 MiB of swap: a few MiB.
  { [ "$v" != max ] && [ "$v" -gt 0 ] && [ "$v" -lt 33554432 ]; } ||
    fail "memory.swap.max of the Burstable container is $v, want its share of the swap"
  # The kernel keeps whole pages of it.
  prop=$(systemctl show -P MemorySwapMax "berth-$id.scope")
  [ "$((prop / 4096 * 4096))" = "$v" ] ||
    fail "berth-$id.scope has MemorySwapMax $prop, its memory.swap.max is $v"
  [ "$(systemctl show -P MemorySwapMax "berth-$be.scope")" = 0 ] ||
    fail "the BestEffort berth-$be.scope has MemorySwapMax $(systemctl show -P MemorySwapMax "berth-$be.scope")"
  systemctl daemon-reload
  local c want swap=$v
  for c in "$1:0" "$id:$swap" "$be:0"; do
    want=${c#*:}
    c=${c%%:*}
    v=$(bctl exec "$c" cat /sys/fs/cgroup/memory.swap.max) || fail "reading memory.swap.max in $c"
    [ "$v" = "$want" ] || fail "after a daemon-reload memory.swap.max in $c is $v, want $want"
  done
  ok "LimitedSwap: the Burstable container may swap $swap bytes, the Guaranteed and BestEffort ones none, kept across a daemon-reload"
  rm /etc/berth/manifests/swapper.yaml /etc/berth/manifests/besteffort.yaml
  [ -e /sys/fs/cgroup/cpu.pressure ] || fail "the kernel has no PSI (no cpu.pressure)"
  v=$(bctl -o json metricsp | jq -r --arg c "$1" \
    '[.[] | select(.container == $c and (.name | startswith("container_pressure_")))] | length')
  [ "$v" = 6 ] || fail "the CRI metrics of $1 have $v pressure series, want 6: $(bctl metricsp)"
  ok "the CRI metrics carry the container's pressure stalls (PSI)"
  v=$(bctl -o json stats | jq -r --arg c "$1" '.[] | select(.id == $c) | .pressure_stall_us |
    if . == null then "none" else "\(.cpu) \(.memory) \(.io)" end')
  case "$v" in
    "" | none | *null*) fail "the CRI stats of $1 carry no pressure (CRI v0.36 PSI): '$v'" ;;
  esac
  ok "the CRI stats carry the container's pressure stall totals (cpu memory io: $v us)"
  wait_for 60 not_running swap || fail "the Burstable pod was not removed"
  wait_for 60 not_running nolimit || fail "the BestEffort pod was not removed"
}

# The pod's checks, on either boot.
check_pod() {
  wait_for 120 has_running main || fail "container main of the static pod is not running"
  local id
  id=$(running_id main)
  ok "static pod running (container $id)"
  check_limits "$id"
  local v
  v=$(bctl exec "$id" cat /sys/fs/cgroup/memory.oom.group) || fail "reading memory.oom.group in $id"
  [ "$v" = 1 ] || fail "memory.oom.group in $id is $v: an OOM kill would take one process only"
  ok "memory.oom.group 1 (an OOM kill ends the whole container)"
  v=$(bctl -o json stats | jq -r --arg id "$id" '.[] | select(.id == $id) | .memory_working_set_bytes')
  { [ -n "$v" ] && [ "$v" -gt 0 ]; } || fail "berthctl stats gives the container no working set ('$v')"
  ok "stats from the v2 files (working set $v bytes)"
  v=$(bctl exec "$id" cat /proc/self/cgroup) || fail "reading /proc/self/cgroup"
  [ "$v" = "0::/" ] || fail "the container sees cgroup '$v': no cgroup namespace of its own"
  ok "private cgroup namespace (0::/)"
  v=$(bctl exec "$id" head -c 15 /proc/1/cmdline | tr -d '\0') || fail "reading /proc/1/cmdline"
  [ "$v" = berth-pod-init ] || fail "pid 1 of the shared PID namespace is '$v'"
  ok "pid 1 is the pod's init"
  v=$(bctl exec "$id" sh -c 'cat /proc/$(pidof sleep)/attr/current /proc/self/attr/current') ||
    fail "reading the AppArmor labels of $id"
  [ "$v" = "berth-default (enforce)
berth-default (enforce)" ] || fail "container $id and its exec run under '$v', want berth-default"
  ok "the container and its exec run under berth-default"
  # On the host, the init sits in a leaf of its own below the pod cgroup, beside the container.
  local init_cg
  init_cg=$(cat "/proc/$(pgrep -f '^berth-pod-init' | head -n1)/cgroup")
  case $init_cg in
    0::/kubepods/*/berth-pod-init) ok "pod init in its leaf cgroup ($init_cg)" ;;
    0::/kubepods.slice/*.slice/berth-pod-init-*.scope) ok "pod init in its scope ($init_cg)" ;;
    *) fail "pod init's cgroup is $init_cg" ;;
  esac
  [ "$(berthd_driver)" = systemd ] || fail "berthd reports the cgroup driver '$(berthd_driver)'"
  systemctl is-active -q "$(basename "${init_cg#0::}")" || fail "the pod init's scope is not active"
  check_scope_limits "$id"
  echo "$id" >"id$phase"
}

if [ "$phase" = 1 ]; then
  rm -f id1 id2
  # A persistent journal: the next boot reads this one's.
  mkdir -p /var/log/journal
  systemd-tmpfiles --create --prefix /var/log/journal
  journalctl --flush
  export DEBIAN_FRONTEND=noninteractive
  dpkg -i berth.deb || fail "installing berth.deb"
  ok "package installed"
  wait_for 60 berthd_up || fail "berthd not active after the install"
  ok "berthd started by systemd"
  # The node joins the control plane on the host with a bootstrap token, as kubeadm join.
  cp ca.crt /etc/berth/ca.crt
  cp bootstrap.kubeconfig /etc/berth/bootstrap.kubeconfig
  # Swap on, and Burstable containers given their share of it (the kubelet's LimitedSwap).
  fallocate -l 256M /swapfile && chmod 600 /swapfile && mkswap -q /swapfile && swapon /swapfile ||
    fail "turning swap on"
  printf '[registry]\ninsecure_registries = ["%s"]\n\n[agent]\nbootstrap_kubeconfig = "/etc/berth/bootstrap.kubeconfig"\nkubeconfig = "/etc/berth/kubeconfig"\nfail_swap_on = false\nmemory_swap_behavior = "LimitedSwap"\n' \
    "$REGISTRY" >/etc/berth/config.d/vm.toml
  restart_berthd || fail "systemctl restart berthd (new configuration)"
  wait_for 60 berthd_up || fail "berthd not active after the restart"
  [ "$(cat /sys/module/apparmor/parameters/enabled)" = Y ] || fail "the VM's kernel has no AppArmor"
  grep -q '^berth-default (enforce)$' /sys/kernel/security/apparmor/profiles ||
    fail "berthd did not load berth-default"
  ok "berthd loaded its AppArmor profile berth-default"
  wait_for 180 node_ready || fail "the node did not join the cluster: $(kctl get csr 2>&1)"
  ok "joined the cluster with its bootstrap token"
  kctl -n kube-system delete secret "bootstrap-token-$(sed -n 's/.*token: \([a-z0-9]*\)\..*/\1/p' /etc/berth/bootstrap.kubeconfig)" ||
    fail "deleting the bootstrap token"
  shared_pod shared main >/etc/berth/manifests/shared.yaml
  check_pod
  sleep_pid=$(pgrep -x sleep | head -n1)
  restart_berthd || fail "systemctl restart berthd under the running pod"
  wait_for 60 berthd_up || fail "berthd not active after systemctl restart"
  sleep 2
  [ "$(running_id main)" = "$(cat id1)" ] || fail "the container changed across systemctl restart berthd"
  [ "$(pgrep -x sleep | head -n1)" = "$sleep_pid" ] || fail "the container's process restarted with berthd"
  ok "container kept across systemctl restart berthd"
  check_swap_and_pressure "$(cat id1)"
  # An allocation past the memory limit ends the container OOMKilled (memory.events on v2).
  cat >/etc/berth/manifests/oom.yaml <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: oom
  namespace: default
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: $REGISTRY/busybox:latest
    command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]
    resources:
      limits:
        memory: 32Mi
EOF
  hog_reason() {
    local id
    id=$(bctl -o json ps -a | jq -r '.containers[]? | select(.metadata.name == "hog" and .state == 2) | .id' | head -n1)
    [ -n "$id" ] && bctl inspect "$id" | jq -r .status.reason
  }
  hog_ended() { [ -n "$(hog_reason)" ]; }
  wait_for 120 hog_ended || fail "the memory hog did not end"
  v=$(hog_reason)
  [ "$v" = OOMKilled ] || fail "the memory hog ended with reason '$v', want OOMKilled"
  ok "a container past its memory limit ends OOMKilled"
  rm /etc/berth/manifests/oom.yaml
  load_test_profile
  confined_pod confined cmain field >/etc/berth/manifests/confined.yaml
  wait_for 120 has_running cmain || fail "the agent's confined pod is not running"
  check_confined "$(running_id cmain)"
  rm /etc/berth/manifests/confined.yaml
  wait_for 60 not_running cmain || fail "the agent's confined pod was not removed"
  echo 2 >phase
  touch reboot
  exit 0
fi

wait_for 120 berthd_up || fail "berthd not active after the reboot"
ok "berthd started at boot"
rejoined() { lease_renewed_this_boot && node_ready; }
if ! wait_for 180 rejoined; then
  journalctl -b -u berthd --no-pager | grep -E ' (WARN|ERROR) ' | tail -20 || true
  fail "the node did not rejoin its cluster after the reboot: $(kctl get node node-vm -o 'jsonpath={.status.conditions}' 2>&1); lease renewed $(kctl -n kube-node-lease get lease node-vm -o 'jsonpath={.spec.renewTime}' 2>&1), boot $(uptime -s)"
fi
ok "rejoined the cluster after the reboot with its stored certificate (the bootstrap token is gone)"
check_pod
[ "$(cat id2)" != "$(cat id1)" ] || fail "the pre-reboot container is reported running"
# Ended either as systemd stopped its scope at the shutdown (berthd recorded the exit then, in
# the previous boot's journal) or found ended by berthd at boot.
ended=$(
  journalctl -b -1 -u berthd --no-pager | grep "container exited" || true
  journalctl -b -u berthd --no-pager | grep "container ended while berthd was down" || true
)
case $ended in
  *"$(cat id1)"*) ;;
  *)
    journalctl --list-boots --no-pager || true
    fail "berthd did not report container $(cat id1) ended across the reboot"
    ;;
esac
ok "the pre-reboot container reported ended; the agent runs the pod again"

# The stock kubelet 1.20 (cgroupfs driver, static pods) on the same berthd, the agent off.
rm /etc/berth/manifests/shared.yaml
wait_for 60 node_empty || fail "the agent's pod not removed: $(find /sys/fs/cgroup/kubepods -type d)"
ok "the agent's pod removed, its cgroups too"
mkdir -p /etc/systemd/system/berthd.service.d
cp /usr/share/doc/berth/examples/no-agent.conf /etc/systemd/system/berthd.service.d/
systemctl daemon-reload
restart_berthd || fail "systemctl restart berthd (agent off)"
wait_for 60 berthd_up || fail "berthd not active with the agent off"
mkdir -p /etc/kubernetes/manifests /var/lib/kubelet
# kubelet_config DRIVER: the standalone kubelet's configuration with that cgroup driver.
kubelet_config() {
  cat >/var/lib/kubelet/config.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/kubernetes/manifests
fileCheckFrequency: 1s
syncFrequency: 3s
cgroupDriver: $1
failSwapOn: false
readOnlyPort: 0
makeIPTablesUtilChains: false
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
EOF
}
sock=unix:///run/berth/berth.sock
start_kubelet() {
  systemd-run --unit kubelet /mnt/share/kubelet --config=/var/lib/kubelet/config.yaml \
    --container-runtime=remote --container-runtime-endpoint=$sock --image-service-endpoint=$sock \
    --runtime-request-timeout=2m --v=2 || fail "starting the kubelet"
}
# kube_pod DRIVER: the kubelet runs a static pod with limits, then removes it and its cgroups.
kube_pod() {
  shared_pod kube kmain >/etc/kubernetes/manifests/kube.yaml
  if ! wait_for 180 has_running kmain; then
    journalctl -b -u kubelet --no-pager | tail -40
    fail "the kubelet's static pod is not running ($1 driver)"
  fi
  check_limits "$(running_id kmain)"
  [ "$1" = cgroupfs ] || check_scope_limits "$(running_id kmain)"
  ok "the stock kubelet 1.20 ($1 driver) runs its static pod on Berth with its limits"
  rm /etc/kubernetes/manifests/kube.yaml
  if ! wait_for 120 node_empty; then
    journalctl -b -u kubelet --no-pager | tail -40
    fail "the kubelet's pod not removed ($1 driver): $(bctl ps -aq) $(bctl pods -q) $(pod_cgroups) $(systemctl list-units --all --no-legend 'berth-*.scope')"
  fi
  ok "the kubelet's pod removed, its cgroups too ($1 driver)"
  echo "note: pod cgroups in either tree now: $(find /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods.slice -name '*pod*' -type d 2>/dev/null | tr '\n' ' ')"
}
# The systemd driver on both sides (berthd's default here), then cgroupfs on both.
kubelet_config systemd
start_kubelet
kube_pod systemd
systemctl stop kubelet
printf '[runtime]\ncgroup_driver = "cgroupfs"\n' >/etc/berth/config.d/driver.toml
restart_berthd || fail "systemctl restart berthd (cgroupfs driver)"
wait_for 60 berthd_up || fail "berthd not active with the cgroupfs driver"
[ "$(berthd_driver)" = cgroupfs ] || fail "berthd reports the cgroup driver '$(berthd_driver)'"
kubelet_config cgroupfs
systemctl reset-failed kubelet 2>/dev/null || true
start_kubelet
kube_pod cgroupfs
load_test_profile
confined_pod kconfined kcmain annotation >/etc/kubernetes/manifests/kconfined.yaml
if ! wait_for 180 has_running kcmain; then
  journalctl -b -u kubelet --no-pager | tail -40
  fail "the kubelet's confined pod is not running"
fi
check_confined "$(running_id kcmain)"
rm /etc/kubernetes/manifests/kconfined.yaml
wait_for 120 not_running kcmain || fail "the kubelet's confined pod was not removed"
systemctl stop kubelet
echo "== all checks passed"
