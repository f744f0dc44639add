#!/usr/bin/env bash
# Benchmark: importing the `large` test image (~200 MiB, 8 layers) from an archive against a
# cold pull of it from the local registry, each into a fresh berthd root, same run. Archives:
# skopeo's OCI archive (the registry's gzip layers) and Berth's own export (uncompressed
# layers). Prints per-run times, medians and the ratios to the pull.
# Usage: hack/bench-import.sh [RUNS] (default 5). Needs root, release binaries (make build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
RUNS=${1:-5}
BERTHD=$top/target/release/berthd
BERTHCTL=$top/target/release/berthctl
[ -x "$BERTHD" ] && [ -x "$BERTHCTL" ] || { echo "build first: make build" >&2; exit 1; }
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
REG=$BERTH_TEST_REGISTRY
REF=$REG/large:latest
W=$(mktemp -d /tmp/berth-bench-import.XXXXXX)
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  sleep 0.5
  grep " $W" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
now_ms() { date +%s%3N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

start_berthd() {
  local d=$1
  mkdir -p "$d"
  "$BERTHD" --root "$d/root" --state-dir "$d/state" --socket "$d/berth.sock" \
    --insecure-registry "$REG" --registry-config-dir "$d/certs.d" --no-agent --log-level warn >"$d/log" 2>&1 &
  pid=$!
  wait_sock "$d/berth.sock"
  "$BERTHCTL" -r "$d/berth.sock" version >/dev/null
}
stop_berthd() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

# The archives, made once.
skopeo --insecure-policy copy -q --src-tls-verify=false "docker://$REF" "oci-archive:$W/skopeo.tar"
start_berthd "$W/maker"
"$BERTHCTL" -r "$W/maker/berth.sock" pull -q "$REF" >/dev/null
"$BERTHCTL" -r "$W/maker/berth.sock" image export "$REF" -o "$W/berth.tar"
stop_berthd
rm -rf "$W/maker"
echo "archives: skopeo OCI $(($(stat -c %s "$W/skopeo.tar") / 1048576)) MiB, berth export $(($(stat -c %s "$W/berth.tar") / 1048576)) MiB"

# One timed operation in a fresh root: prints ms.
run_one() {
  local kind=$1 d=$W/$1-$2 t0 t1
  start_berthd "$d"
  sync
  t0=$(now_ms)
  case $kind in
    pull) "$BERTHCTL" -r "$d/berth.sock" pull -q "$REF" >/dev/null ;;
    skopeo) "$BERTHCTL" -r "$d/berth.sock" image import "$W/skopeo.tar" >/dev/null ;;
    berth) "$BERTHCTL" -r "$d/berth.sock" image import "$W/berth.tar" >/dev/null ;;
  esac
  t1=$(now_ms)
  stop_berthd
  # Roots are kept to the end: deleting 200 MiB of small files before the next run would make
  # ext4's inode allocator dominate it (as in bench-pull.sh).
  echo $((t1 - t0))
}

declare -A times
for i in $(seq "$RUNS"); do
  for kind in pull skopeo berth; do
    ms=$(run_one "$kind" "$i")
    times[$kind]+="$ms "
    echo "run $i $kind ${ms} ms"
  done
done
p=$(echo "${times[pull]}" | tr ' ' '\n' | grep . | median)
for kind in pull skopeo berth; do
  m=$(echo "${times[$kind]}" | tr ' ' '\n' | grep . | median)
  echo "median $kind ${m} ms ($(ratio "$m" "$p")x the cold pull)"
done
