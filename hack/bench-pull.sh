#!/usr/bin/env bash
# Benchmark: cold pull+unpack of the `large` test image (~200 MiB, 8 layers) through berthd and,
# in the same run, through containerd (Debian's package, CRI plugin) pointed at the same local
# registry. Both are driven over CRI by berthctl. Prints per-run times, medians, the ratio, and
# berthd's and containerd's RSS idle after start and after the pull.
# Usage: hack/bench-pull.sh [RUNS] (default 5). Needs root, release binaries (make build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
RUNS=${1:-5}
IMAGE_NAME=${IMAGE_NAME:-large}
BERTHD=$top/target/release/berthd
BERTHCTL=$top/target/release/berthctl
[ -x "$BERTHD" ] && [ -x "$BERTHCTL" ] || { echo "build first: make build" >&2; exit 1; }
command -v containerd >/dev/null || bash "$here/install-deps.sh" --bench
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
REG=$BERTH_TEST_REGISTRY
REF=$REG/$IMAGE_NAME:latest
W=$(mktemp -d /tmp/berth-bench-pull.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  grep " $W" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
now_ms() { date +%s%3N; }
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

start_berthd() {
  local d=$1
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" --no-agent --log-level warn >"$d/log" 2>&1 &
  echo $!
}

start_containerd() {
  local d=$1
  write_containerd_config "$d"
  containerd --config "$d/config.toml" --log-level warn >"$d/log" 2>&1 &
  echo $!
}

# One cold pull in a fresh root: prints "ms rss_idle_kib rss_after_kib".
run_one() {
  local kind=$1 pid sock t0 t1 idle after
  local d=$W/$kind-$2
  mkdir -p "$d"
  if [ "$kind" = berth ]; then pid=$(start_berthd "$d"); sock=$d/berth.sock
  else pid=$(start_containerd "$d"); sock=$d/containerd.sock; fi
  pids+=("$pid")
  wait_sock "$sock"
  "$BERTHCTL" -r "$sock" version >/dev/null
  sleep 1
  idle=$(rss_kib "$pid")
  sync   # start each run with no dirty pages from the previous one
  t0=$(now_ms)
  "$BERTHCTL" -r "$sock" pull -q "$REF" >/dev/null
  t1=$(now_ms)
  sleep 1
  after=$(rss_kib "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  # Roots are kept until the end: deleting 200 MiB of small files right before the next run
  # makes ext4's inode allocator crawl (recently_deleted), which would measure the disk.
  echo "$((t1 - t0)) $idle $after"
}

echo "image: $REF   runs: $RUNS   (each a cold pull into a fresh root)"
run_one berth warmup >/dev/null   # warm the registry's page cache for both
: >"$W/berth.txt"; : >"$W/containerd.txt"
for i in $(seq "$RUNS"); do
  b=$(run_one berth "$i"); c=$(run_one containerd "$i")
  echo "$b" >>"$W/berth.txt"; echo "$c" >>"$W/containerd.txt"
  printf 'run %d: berth %5d ms   containerd %5d ms\n' "$i" "${b%% *}" "${c%% *}"
done
bm=$(awk '{print $1}' "$W/berth.txt" | median); cm=$(awk '{print $1}' "$W/containerd.txt" | median)
bi=$(awk '{print $2}' "$W/berth.txt" | median); ba=$(awk '{print $3}' "$W/berth.txt" | median)
ci=$(awk '{print $2}' "$W/containerd.txt" | median); ca=$(awk '{print $3}' "$W/containerd.txt" | median)
echo
printf 'median cold pull: berth %s ms, containerd %s ms, ratio %.2f (target <= 0.70)\n' "$bm" "$cm" "$(echo "$bm / $cm" | bc -l)"
printf 'RSS idle:   berthd %.1f MiB, containerd %.1f MiB\n' "$(echo "$bi/1024" | bc -l)" "$(echo "$ci/1024" | bc -l)"
printf 'RSS after:  berthd %.1f MiB, containerd %.1f MiB (target berthd < 20 MiB)\n' "$(echo "$ba/1024" | bc -l)" "$(echo "$ca/1024" | bc -l)"
