#!/usr/bin/env bash
# Benchmark: the pod lifecycle through berthd and, in the same run, through containerd (Debian's
# 1.6 with runc, CRI plugin), both driven over CRI by `berthctl bench lifecycle`: N pods one after
# the other (RunPodSandbox + CreateContainer + StartContainer of a busybox container that sleeps),
# all N held running while the daemons' and shims' memory is measured, then StopContainer,
# RemoveContainer, StopPodSandbox, RemovePodSandbox. Prints p50/p99 per step, RSS figures and the
# ratios Berth/containerd.
# Two variants, one per run:
#   host network (the default): pods share the host's network namespace, no CNI.
#   --pod-network: every pod gets its own network namespace from CNI. Both runtimes use the same
#     conflist (bridge + host-local + portmap, CNI 1.0.0) and Debian's plugins in /usr/lib/cni,
#     each with its own conf dir, network name, bridge, /24 subnet and host-local dataDir, all
#     unique to the run (not berth0/10.88). berthd gets --cni-conf-dir/--cni-bin-dir, containerd
#     the CRI plugin's cni bin_dir/conf_dir (max_conf_num 1; its netns under its state dir). The
#     bridge has no gateway address and no masquerading, so the host's ip_forward and NAT table
#     are left alone (GATEWAY=1 sets isGateway + ipMasq as the default config does; that makes
#     the bridge plugin turn ip_forward on, which is restored at exit). Also prints berthd's own
#     timing of each CNI ADD from its log (total_us, plugins_us, berth_overhead_us; p50/p99 over
#     the N timed pods) and the targets: RunPodSandbox p50 no slower than containerd's, Berth's
#     overhead around the plugins under 5 ms.
#   --share-pid: the pods' containers share one PID namespace (shareProcessNamespace), whose pid 1
#     is berth-pod-init on Berth and the pause process on containerd; both count as pause
#     processes in the memory figures.
# Usage: hack/bench-lifecycle.sh [N] [--pod-network] [--share-pid] (default 50 pods, host
# network). Needs root and release binaries (make build). BERTHD_DIR=DIR takes berthd and
# berth-shim from DIR instead of target/release (another build of Berth, as a baseline).
# Environment: PARALLEL=K brings pods up K at a time (default 1); WARMUP=W pods are run and
# dropped first on each runtime (default 3); BERTH_LOG_LEVEL (default warn; berth::net is raised
# to info with --pod-network) for berthd's log, which is kept when KEEP=1 (with the whole work
# directory). Everything the run made is removed at exit: daemons, shims, containers, mounts,
# network namespaces, veths, bridges, host-local data, cgroups, NAT rules of GATEWAY=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=50
NET=host
SHARE_PID=0
for a in "$@"; do
  case $a in
    --pod-network) NET=pod ;;
    --host-network) NET=host ;;
    --share-pid) SHARE_PID=1 ;;
    ''|*[!0-9]*) echo "usage: $0 [N] [--pod-network] [--share-pid]" >&2; exit 2 ;;
    *) N=$a ;;
  esac
done
[ "$N" -ge 1 ] || { echo "N must be at least 1" >&2; exit 2; }
PARALLEL=${PARALLEL:-1}
WARMUP=${WARMUP:-3}
BERTHD=${BERTHD_DIR:-$top/target/release}/berthd
BERTHCTL=$top/target/release/berthctl
SHIM=${BERTHD_DIR:-$top/target/release}/berth-shim
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
W=$(mktemp -d /tmp/berth-bench-lifecycle.XXXXXX)
CG=berth-bench-$$              # cgroup parents: /$CG-berth/podI and /$CG-containerd/podI
daemons=()
bench_pid=

# shellcheck source=hack/bench-net.sh
. "$here/bench-net.sh"
if [ "$NET" = pod ]; then pod_networks_init "$N"; fi

# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"

trap_net_run_cleanup

pss_kib() { awk '/^Pss:/ {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
mib() { echo "scale=2; $1 / 1024" | bc; }
ratio() { if [ "$(echo "$2 == 0" | bc)" = 1 ]; then echo "-"; else printf '%.2f' "$(echo "$1 / $2" | bc -l)"; fi; }

start_berthd() {
  local d=$W/berth net=() level=${BERTH_LOG_LEVEL:-warn}
  mkdir -p "$d"
  if [ "$NET" = pod ]; then
    write_conflist berth
    net=(--cni-conf-dir "$d/net.d" --cni-bin-dir "$CNI_BIN")
    level+=,berth::net=info # for the per-ADD timing
  fi
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" "${net[@]}" --no-agent \
    --log-level "$level" >"$d/log" 2>&1 &
  daemons+=("$!"); berthd_pid=$!
  wait_sock "$d/berth.sock"
}

start_containerd() {
  local d=$W/containerd
  if [ "$NET" = pod ]; then
    write_conflist containerd
    write_containerd_config "$d" "$PAUSE" "$CNI_BIN"
  else
    write_containerd_config "$d" "$PAUSE"
  fi
  containerd --config "$d/config.toml" --log-level warn >"$d/log" 2>&1 &
  daemons+=("$!"); containerd_pid=$!
  wait_sock "$d/containerd.sock"
}

# bench KIND SOCKET DAEMON_PID SHIM_COMM: runs the benchmark, measuring memory while all N pods
# run; leaves KIND.json (berthctl's report) and KIND.mem ("daemon_rss shims shim_rss_total
# shim_pss_total pause_rss_total", KiB) in $W.
bench() {
  local kind=$1 sock=$2 dpid=$3 comm=$4 n=0 total=0 pss=0 pause=0 p
  local args=(-r "$sock" bench lifecycle --image "$IMAGE" --parallel "$PARALLEL"
    --cgroup-parent "/$CG-$kind" --log-dir "$W/$kind/logs")
  [ "$NET" = pod ] && args+=(--pod-network)
  [ "$SHARE_PID" = 1 ] && args+=(--share-pid)
  make_cgroup_parent "$CG-$kind"
  if [ "$WARMUP" -gt 0 ]; then
    "$BERTHCTL" "${args[@]}" --count "$WARMUP" >/dev/null 2>"$W/$kind.warmup.err" ||
      { cat "$W/$kind.warmup.err" >&2; return 1; }
  fi
  "$BERTHCTL" -o json "${args[@]}" --count "$N" --hold >"$W/$kind.json" 2>"$W/$kind.err" &
  bench_pid=$!
  until grep -qs '^ready' "$W/$kind.err"; do
    kill -0 "$bench_pid" 2>/dev/null || { cat "$W/$kind.err" >&2; return 1; }
    sleep 0.2
  done
  sleep 2 # let the shims go idle
  for p in $(our_procs "$comm"); do
    n=$((n + 1)); total=$((total + $(rss_kib "$p"))); pss=$((pss + $(pss_kib "$p")))
  done
  # containerd's pause processes: one per pod, in the pods' cgroups; Berth's pod inits, one per
  # pod that shares its PID namespace.
  while read -r p; do
    case "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" in
      "/bin/sleep 2147483647 " | "berth-pod-init "*) pause=$((pause + $(rss_kib "$p"))) ;;
    esac
  done < <(find /sys/fs/cgroup/pids/"$CG-$kind" -name cgroup.procs -exec cat {} + 2>/dev/null)
  echo "$(rss_kib "$dpid") $n $total $pss $pause" >"$W/$kind.mem"
  kill -USR1 "$bench_pid"
  wait "$bench_pid" || { bench_pid=; cat "$W/$kind.err" >&2; return 1; }
  bench_pid=
}

if [ "$NET" = pod ]; then
  netdesc="pod network: bridge+host-local+portmap from $CNI_BIN, berth $BR_berth $SUBNET_berth, containerd $BR_containerd $SUBNET_containerd"
  [ "$GATEWAY" != 1 ] || netdesc+=", isGateway+ipMasq"
else
  netdesc="host network"
fi
[ "$SHARE_PID" = 1 ] && netdesc+=", one PID namespace per pod"
echo "pods: $N ($( [ "$PARALLEL" = 1 ] && echo sequential || echo "$PARALLEL at a time"), $netdesc, after $WARMUP warm-up pods)   image: $IMAGE"
echo "berthd: $BERTHD"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
push_pause "$W" "$PAUSE"
start_berthd
start_containerd
"$BERTHCTL" -r "$W/containerd/containerd.sock" pull -q "$PAUSE" >/dev/null
sleep 1
berthd_idle=$(rss_kib "$berthd_pid"); containerd_idle=$(rss_kib "$containerd_pid")
bench berth "$W/berth/berth.sock" "$berthd_pid" berth-shim
bench containerd "$W/containerd/containerd.sock" "$containerd_pid" containerd-shim
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

B=$W/berth.json; C=$W/containerd.json
echo
printf '%-22s %9s %9s %6s   %9s %9s %6s\n' step "berth p50" "ctrd p50" ratio "berth p99" "ctrd p99" ratio
for s in RunPodSandbox CreateContainer StartContainer sandbox+create+start \
  StopContainer RemoveContainer StopPodSandbox RemovePodSandbox stop+remove; do
  b50=$(jq -r --arg s "$s" '.steps[$s].p50Ms' "$B"); c50=$(jq -r --arg s "$s" '.steps[$s].p50Ms' "$C")
  b99=$(jq -r --arg s "$s" '.steps[$s].p99Ms' "$B"); c99=$(jq -r --arg s "$s" '.steps[$s].p99Ms' "$C")
  printf '%-22s %9.1f %9.1f %6s   %9.1f %9.1f %6s\n' "$s" "$b50" "$c50" "$(ratio "$b50" "$c50")" \
    "$b99" "$c99" "$(ratio "$b99" "$c99")"
done
# Does a pod start slower with more pods running? Medians of the first and the last tenth.
tenth() { jq -r --arg s sandbox+create+start --argjson k "$(( (N + 9) / 10 ))" \
  '.samplesMs[$s] as $a | ($a[:$k] | sort | .[length/2|floor]), ($a[-$k:] | sort | .[length/2|floor])' "$1" | paste -sd' '; }
read -r bf bl < <(tenth "$B"); read -r cf cl < <(tenth "$C")
printf 'sandbox+create+start median, first/last tenth of the pods: berth %s/%s ms, containerd %s/%s ms\n' "$bf" "$bl" "$cf" "$cl"
printf 'up (wall, %d pods):    berth %.2f s, containerd %.2f s; down: berth %.2f s, containerd %.2f s\n' "$N" \
  "$(jq .upSeconds "$B")" "$(jq .upSeconds "$C")" "$(jq .downSeconds "$B")" "$(jq .downSeconds "$C")"

read -r bd bn bt bp bpause <"$W/berth.mem"
read -r cdm cn ct cp cpause <"$W/containerd.mem"
echo
echo "memory with $N pods running (KiB from /proc; MiB shown):"
printf '%-34s %10s %12s %6s\n' "" berth containerd ratio
printf '%-34s %10s %12s %6s\n' "daemon RSS, idle after start" "$(mib "$berthd_idle")" "$(mib "$containerd_idle")" "$(ratio "$berthd_idle" "$containerd_idle")"
printf '%-34s %10s %12s %6s\n' "daemon RSS, $N pods running" "$(mib "$bd")" "$(mib "$cdm")" "$(ratio "$bd" "$cdm")"
printf '%-34s %10s %12s\n' "shims (processes)" "$bn" "$cn"
ba=$((bn > 0 ? bt / bn : 0)); ca=$((cn > 0 ? ct / cn : 0))
printf '%-34s %10s %12s %6s\n' "shim RSS, average" "$(mib "$ba")" "$(mib "$ca")" "$(ratio "$ba" "$ca")"
printf '%-34s %10s %12s %6s\n' "shim RSS, total" "$(mib "$bt")" "$(mib "$ct")" "$(ratio "$bt" "$ct")"
printf '%-34s %10s %12s %6s\n' "shim PSS, total" "$(mib "$bp")" "$(mib "$cp")" "$(ratio "$bp" "$cp")"
printf '%-34s %10s %12s\n' "pause processes RSS, total" "$(mib "$bpause")" "$(mib "$cpause")"
bsum=$((bd + bt + bpause)); csum=$((cdm + ct + cpause))
printf '%-34s %10s %12s %6s\n' "daemon + shims + pause RSS" "$(mib "$bsum")" "$(mib "$csum")" "$(ratio "$bsum" "$csum")"

# log_pcts FIELD: "p50 p99 n" in ms (nearest rank, as berthctl) of FIELD (microseconds) in
# berthd's "pod network attached" lines, over the last N (the timed pods; the warm-up came first).
log_pcts() {
  grep -F 'pod network attached' "$W/berth/log" | grep -oE "(^|[^a-z_])$1=[0-9]+" | sed 's/.*=//' |
    tail -n "$N" | sort -n |
    awk 'function at(p,  r) { r = int(p / 100 * NR); if (r < p / 100 * NR) r++; if (r < 1) r = 1; return a[r] / 1000 }
      { a[NR] = $1 } END { if (NR) printf "%.2f %.2f %d\n", at(50), at(99), NR; else print "- - 0" }'
}
if [ "$NET" = pod ]; then
  echo
  read -r o50 o99 on < <(log_pcts berth_overhead_us)
  echo "berthd's CNI ADD per pod, from its log ($on of the $N timed pods; ms):"
  printf '%-34s %10s %10s\n' "" p50 p99
  for f in total_us plugins_us berth_overhead_us; do
    read -r p50 p99 _ < <(log_pcts "$f")
    printf '%-34s %10s %10s\n' "$f" "$p50" "$p99"
  done
fi

echo
verdict() { if [ "$(echo "$1" | bc -l)" = 1 ]; then echo met; else echo MISSED; fi; }
echo "targets:"
if [ "$NET" = pod ]; then
  b=$(jq '.steps.RunPodSandbox.p50Ms' "$B"); c=$(jq '.steps.RunPodSandbox.p50Ms' "$C")
  printf '  RunPodSandbox p50 (pod network) <= containerd'"'"'s: %.1f vs %.1f ms, %s  %s\n' "$b" "$c" \
    "$(ratio "$b" "$c")" "$(verdict "$b <= $c")"
  if [ "$o50" = - ]; then
    echo "  Berth's CNI overhead p50 < 5 ms: no timing in berthd's log  MISSED"
  else
    echo "  Berth's CNI overhead p50 < 5 ms: $o50 ms (p99 $o99 ms)  $(verdict "$o50 < 5")"
  fi
fi
b=$(jq '.steps["sandbox+create+start"].p50Ms' "$B"); c=$(jq '.steps["sandbox+create+start"].p50Ms' "$C")
echo "  sandbox+create+start p50 <= 0.5x containerd's: $(ratio "$b" "$c")  $(verdict "$b <= 0.5 * $c")"
echo "  berth-shim idle RSS <= 2 MiB (containerd-shim-runc-v2: $(mib "$ca") MiB): $(mib "$ba") MiB  $(verdict "$ba <= 2048")"
echo "  berthd RSS with $N pods <= 0.5x containerd's: $(ratio "$bd" "$cdm")  $(verdict "$bd <= 0.5 * $cdm")"
