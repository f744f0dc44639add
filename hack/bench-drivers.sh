#!/usr/bin/env bash
# Benchmark: the pod lifecycle with each cgroup driver, in the node VM (hack/node-vm.sh: systemd
# as PID 1, pure cgroup v2, Debian's kernel). Berth's release package is installed there; berthd,
# started by systemd with its agent off, runs `berthctl bench lifecycle` (N pods one after the
# other: RunPodSandbox + CreateContainer + StartContainer of a busybox container from the test
# registry on the host, then the teardown) once with runtime.cgroup_driver = "cgroupfs" (pod
# cgroups /bench/podI) and once with "systemd" (pod slices bench-podI.slice, a scope per
# container), each after a warm-up. Prints p50/p99 per step and the ratios systemd/cgroupfs.
# The VM is software-emulated where /dev/kvm cannot run it: absolute times are the emulation's;
# the ratio, both drivers measured in the same boot, is the figure.
# Usage: hack/bench-drivers.sh [N] (default 30). Needs root; builds the release package.
# Environment: SHARE_PID=1 gives the pods a shared PID namespace (berth-pod-init in a scope of
# its own under systemd); KEEP=1 keeps the share directory (the reports, the guest's log).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
N=${1:-30}
case $N in
  '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;;
esac
[ "$N" -ge 1 ] || { echo "N must be at least 1" >&2; exit 2; }
command -v jq >/dev/null || apt-get install -y --no-install-recommends jq >&2
eval "$(bash "$here/test-env.sh" 2>/dev/null)"
deb=$(bash "$here/deb.sh")
share=$(mktemp -d /var/tmp/berth-bench-drivers.XXXXXX)
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $share" >&2 || rm -rf "$share"; }
trap cleanup EXIT
cp "$deb" "$share/berth.deb"
printf 'REGISTRY=10.0.2.2:%s\nN=%s\nSHARE_PID=%s\n' "${BERTH_TEST_REGISTRY##*:}" "$N" \
  "${SHARE_PID:-0}" >"$share/env"
cat >"$share/guest.sh" <<'GUEST'
set -euo pipefail
cd /mnt/share
. ./env
DEBIAN_FRONTEND=noninteractive dpkg -i berth.deb >/dev/null
mkdir -p /etc/systemd/system/berthd.service.d
cp /usr/share/doc/berth/examples/no-agent.conf /etc/systemd/system/berthd.service.d/
printf '[registry]\ninsecure_registries = ["%s"]\n' "$REGISTRY" >/etc/berth/config.d/bench.toml
systemctl daemon-reload
extra=()
[ "$SHARE_PID" = 1 ] && extra+=(--share-pid)
for driver in cgroupfs systemd; do
  printf '[runtime]\ncgroup_driver = "%s"\n' "$driver" >/etc/berth/config.d/driver.toml
  systemctl restart berthd
  for _ in $(seq 120); do berthctl version >/dev/null 2>&1 && break; sleep 0.5; done
  parent=/bench
  [ "$driver" = systemd ] && parent=bench.slice
  args=(bench lifecycle --image "$REGISTRY/busybox:latest" --cgroup-parent "$parent" "${extra[@]}")
  berthctl "${args[@]}" --count 3 >/dev/null
  berthctl -o json "${args[@]}" --count "$N" >"$driver.json"
  echo "$driver: $(berthctl -o json info | jq -r '.info.berth | fromjson | .cgroupDriver')"
done
GUEST
bash "$here/node-vm.sh" run "$share" 3600 || { cat "$share/guest.log" >&2; exit 1; }
grep -q '^systemd: systemd$' "$share/guest.log" || { cat "$share/guest.log" >&2; exit 1; }

F=$share/cgroupfs.json; S=$share/systemd.json
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo "N=$N pods, one after the other, in the node VM (share-pid=${SHARE_PID:-0})"
printf '%-22s %9s %9s %6s   %9s %9s %6s\n' step "sd p50" "fs p50" ratio "sd p99" "fs p99" ratio
for s in RunPodSandbox CreateContainer StartContainer sandbox+create+start \
  StopContainer RemoveContainer StopPodSandbox RemovePodSandbox stop+remove; do
  s50=$(jq -r --arg s "$s" '.steps[$s].p50Ms' "$S"); f50=$(jq -r --arg s "$s" '.steps[$s].p50Ms' "$F")
  s99=$(jq -r --arg s "$s" '.steps[$s].p99Ms' "$S"); f99=$(jq -r --arg s "$s" '.steps[$s].p99Ms' "$F")
  printf '%-22s %9.1f %9.1f %6s   %9.1f %9.1f %6s\n' "$s" "$s50" "$f50" "$(ratio "$s50" "$f50")" \
    "$s99" "$f99" "$(ratio "$s99" "$f99")"
done
s=$(jq '.steps["sandbox+create+start"].p50Ms' "$S"); f=$(jq '.steps["sandbox+create+start"].p50Ms' "$F")
echo "target: sandbox+create+start p50 with systemd at most 1.3x cgroupfs: $(ratio "$s" "$f")x"
