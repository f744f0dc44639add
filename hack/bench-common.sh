# Shared by the hack/bench-*.sh scripts that compare Berth with containerd (source it; the
# caller sets REG, the plain-HTTP test registry).

# wait_sock PATH: waits up to 10 s for a daemon's socket.
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; return 1; }

# write_containerd_config DIR [PAUSE_IMAGE [CNI_BIN_DIR]]: DIR/config.toml for a containerd whose
# root, state, sockets and runc root are under DIR, pulling from $REG over plain HTTP (a
# DIR/certs.d hosts.toml). Without PAUSE_IMAGE only image settings are written (pull benchmarks);
# with it the CRI runtime settings too, and with CNI_BIN_DIR its CNI plugin reads DIR/net.d.
write_containerd_config() {
  local d=$1 pause=${2:-} cni_bin=${3:-} restrict_oom=false
  mkdir -p "$d/certs.d/$REG"
  cat >"$d/certs.d/$REG/hosts.toml" <<TOML
server = "http://$REG"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
  cat >"$d/config.toml" <<TOML
version = 2
root = "$d/root"
state = "$d/state"
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "$d/certs.d"
TOML
  [ -n "$pause" ] || return 0
  # CAP_SYS_RESOURCE is bit 24 of the effective capabilities.
  (( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24) & 1 )) || restrict_oom=true
  cat >>"$d/config.toml" <<TOML
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # Without CAP_SYS_RESOURCE (as in some VMs and containers) runc cannot set the sandbox's
  # oom_score_adj of -998; this caps it at containerd's own.
  restrict_oom_score_adj = $restrict_oom
  # Pod network namespaces under $d/state rather than /run/netns.
  netns_mounts_under_state_dir = true
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  Root = "$d/runc"
TOML
  [ -n "$cni_bin" ] || return 0
  cat >>"$d/config.toml" <<TOML
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "$cni_bin"
  conf_dir = "$d/net.d"
  max_conf_num = 1
TOML
}

# push_pause DIR IMAGE: a pause image for containerd's sandboxes (busybox-static's sleep), built
# in DIR with hack/imagebuild.py and pushed as IMAGE. Berth needs none.
push_pause() {
  local d=$1 image=$2 hack
  hack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$d/pause-root/bin"
  ln -sf "$(command -v busybox)" "$d/pause-root/bin/busybox"
  python3 - "$hack" "$d/pause-root" "$d/pause-oci" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import imagebuild as ib
layout = ib.Layout(sys.argv[3])
layer = layout.layer(ib.busybox_layer(sys.argv[2]), "gzip", "busybox-static rootfs")
config = {"Env": [ib.PATH_ENV], "Entrypoint": ["/bin/sleep", "2147483647"]}
layout.tag(layout.image([layer], config), "pause")
layout.close()
PY
  skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$d/pause-oci:pause" "docker://$image"
}

# rss_kib PID: resident memory of a process, KiB (0 when it is gone).
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# As the kubelet does before RunPodSandbox, make the pods' parent cgroup; on cgroup v1 its cpuset
# must be filled in (a task cannot join an empty cpuset: ENOSPC), and clone_children makes the
# per-pod children inherit it.
make_cgroup_parent() {
  local v1=/sys/fs/cgroup/cpuset
  [ -f "$v1/cpuset.cpus" ] || return 0
  mkdir -p "$v1/$1"
  cat "$v1/cpuset.cpus" >"$v1/$1/cpuset.cpus"
  cat "$v1/cpuset.mems" >"$v1/$1/cpuset.mems"
  echo 1 >"$v1/$1/cgroup.clone_children"
}

# our_procs COMM_PREFIX: processes (daemons' shims) whose command line names the run's work
# directory $W.
our_procs() { # comm prefix
  local f p
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}; p=${p%/cmdline}
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == "$1"* ]] || continue
    tr '\0' ' ' <"$f" 2>/dev/null | grep -qF "$W" && echo "$p"
  done
  return 0
}

# stop_run: ends what a benchmark run started: berthctl ($bench_pid), the daemons ($daemons),
# their shims, containers (and containerd's pause processes) left in the run's cgroups ($CG-*),
# mounts under $W, and those cgroups.
stop_run() {
  [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${daemons[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  for p in $(our_procs berth-shim) $(our_procs containerd-shim); do kill -9 "$p" 2>/dev/null; done
  find /sys/fs/cgroup/*/ -maxdepth 1 -name "$CG-*" -type d 2>/dev/null |
    while read -r d; do find "$d" -name cgroup.procs -exec cat {} + ; done | sort -u |
    xargs -r kill -9 2>/dev/null
  sleep 0.5
  grep -F " $W" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  find /sys/fs/cgroup/*/ -maxdepth 1 -name "$CG-*" -type d 2>/dev/null |
    while read -r d; do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null; done
}

# ticks PID: the user and system CPU ticks a process used so far.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# pct P: the P-th percentile (nearest rank) of the numbers on stdin.
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int((NR-1)*p/100)+1; print a[i]}'; }

# ratio A B: A / B with two decimals ("-" when B is 0).
ratio() { if [ "$2" = 0 ]; then echo "-"; else printf '%.2f' "$(echo "$1 / $2" | bc -l)"; fi; }

# run_networks A B: `run A NET` then `run B NET` (the caller's), host network first, then pod
# network, with the load average before and after.
run_networks() {
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  local net
  for net in host pod; do
    run "$1" "$net"
    run "$2" "$net"
  done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# latency_rows WHAT A B FORMAT: p50 and p90 of $W/A-NET.times against $W/B-NET.times for both
# networks, one printf FORMAT row each (label, A, B, ratio).
latency_rows() {
  local net p a b
  for net in host pod; do
    for p in 50 90; do
      a=$(pct "$p" <"$W/$2-$net.times"); b=$(pct "$p" <"$W/$3-$net.times")
      # shellcheck disable=SC2059
      printf "$4" "$1, $net network, p$p (ms)" "$a" "$b" "$(ratio "$a" "$b")"
    done
  done
}

# bench_run_setup NAME: the test registry and images (REG, IMAGE, PAUSE), a fresh work directory
# W and cgroup prefix CG named after NAME, and no daemons or client yet (for stop_run).
bench_run_setup() {
  eval "$(bash "$(dirname "${BASH_SOURCE[0]}")/test-env.sh" 2>/dev/null)"
  REG=$BERTH_TEST_REGISTRY
  IMAGE=$REG/busybox:latest
  PAUSE=$REG/berth-bench-pause:latest
  W=$(mktemp -d "/tmp/berth-bench-$1.XXXXXX")
  CG=berth-$1-$$
  daemons=()
  bench_pid=
}

# release_binaries TOP: sets BERTHD and BERTHCTL to TOP's release build; exits naming the
# binary when one of them (or the shim) is missing.
release_binaries() {
  BERTHD=$1/target/release/berthd
  BERTHCTL=$1/target/release/berthctl
  local b
  for b in "$BERTHD" "$BERTHCTL" "$1/target/release/berth-shim"; do
    [ -x "$b" ] || { echo "build first: make build (missing $b)" >&2; exit 1; }
  done
}
