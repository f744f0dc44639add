#!/usr/bin/env bash
# critest in the node VM (hack/node-vm.sh: systemd as PID 1, pure cgroup v2, AppArmor enforced,
# Debian's kernel): Berth's package installed there, berthd started by systemd with its agent
# off, and critest run against it once with runtime.cgroup_driver = "systemd" and once with
# "cgroupfs", each followed by the streaming specs over WebSocket. Prints critest's summary per
# run and exits non-zero when any spec failed.
# Usage: CRITEST=/path/to/critest hack/vm-critest.sh [FOCUS]
#   CRITEST   a critest binary, built from kubernetes-sigs/cri-tools separately
#   REGISTRY  a plain-HTTP registry on this host holding critest's images under their upstream
#             repository paths (default 127.0.0.1:5000); the guest reaches it at 10.0.2.2 and
#             every registry critest names is pointed at it (hosts.toml `server`), so nothing
#             is fetched from elsewhere
#   FOCUS     a ginkgo focus regexp (default: every spec but the upstream-digest one and the
#             benchmarks)
#   KEEP=1    keeps the share directory (critest's output per run, the guest's log)
# Needs root; builds the release package. The VM is software-emulated where /dev/kvm cannot run
# it, which makes a full run per driver take several minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CRITEST=${CRITEST:-}
[ -x "$CRITEST" ] || { echo "set CRITEST to a critest binary" >&2; exit 2; }
REGISTRY=${REGISTRY:-127.0.0.1:5000}
FOCUS=${1:-}
port=${REGISTRY##*:}
curl -fsS "http://$REGISTRY/v2/" >/dev/null ||
  { echo "no registry answers at http://$REGISTRY/v2/" >&2; exit 2; }
deb=$(bash "$here/deb.sh")
share=$(mktemp -d /var/tmp/berth-vm-critest.XXXXXX)
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $share" >&2 || rm -rf "$share"; }
trap cleanup EXIT
cp "$deb" "$share/berth.deb"
cp "$CRITEST" "$share/critest"
{
  printf 'MIRROR=10.0.2.2:%s\n' "$port"
  printf 'FOCUS=%q\n' "$FOCUS"
} >"$share/env"
cat >"$share/guest.sh" <<'GUEST'
set -euo pipefail
cd /mnt/share
. ./env
DEBIAN_FRONTEND=noninteractive dpkg -i berth.deb >/dev/null
mkdir -p /etc/systemd/system/berthd.service.d
cp /usr/share/doc/berth/examples/no-agent.conf /etc/systemd/system/berthd.service.d/
# Every registry critest's images come from, served by the host's registry only.
for host in registry.k8s.io k8s.gcr.io gcr.io public.ecr.aws docker.io quay.io 127.0.0.1:5000; do
  mkdir -p "/etc/berth/certs.d/$host"
  printf 'server = "http://%s"\n' "$MIRROR" >"/etc/berth/certs.d/$host/hosts.toml"
done
printf '[registry]\ninsecure_registries = ["%s"]\n' "$MIRROR" >/etc/berth/config.d/critest.toml
# critest loads its AppArmor test profiles with `sudo apparmor_parser`; the guest runs as root
# and has no sudo, so a pass-through stands in for it.
command -v sudo >/dev/null || printf '#!/bin/sh\nexec "$@"\n' >/usr/local/bin/sudo
chmod 755 /usr/local/bin/sudo 2>/dev/null || true
systemctl daemon-reload
echo "apparmor: $(cat /sys/module/apparmor/parameters/enabled 2>/dev/null || echo absent)"
skip='public image with digest|benchmark'
# run NAME ARGS...: one critest run; its output in NAME.log, its summary printed.
run() {
  local name=$1
  shift
  local rc=0
  ./critest -runtime-endpoint unix:///run/berth/berth.sock \
    -image-endpoint unix:///run/berth/berth.sock -ginkgo.skip "$skip" -ginkgo.no-color \
    "$@" >"$name.log" 2>&1 || rc=$?
  echo "$name: $(grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!)' "$name.log" | tr '\n' ' ')(exit $rc)"
  grep -E '^\s*\[FAIL\]' "$name.log" | sed "s/^/  $name /" || true
  return "$rc"
}
failed=0
for driver in systemd cgroupfs; do
  printf '[runtime]\ncgroup_driver = "%s"\n' "$driver" >/etc/berth/config.d/driver.toml
  systemctl restart berthd
  for _ in $(seq 120); do berthctl version >/dev/null 2>&1 && break; sleep 0.5; done
  echo "berthd: $(berthctl -o json info | jq -r '.info.berth | fromjson | .cgroupDriver') driver"
  focus=()
  [ -n "$FOCUS" ] && focus=(-ginkgo.focus "$FOCUS")
  run "$driver" "${focus[@]}" || failed=1
  run "$driver-websocket" -ginkgo.focus Streaming -websocket-exec -websocket-attach \
    -websocket-portforward || failed=1
  units=$(systemctl list-units --all --plain --no-legend 'berth-*' | awk '{print $1}' |
    { grep -v '^berth-guest' || true; } | xargs)
  echo "$driver: berth units left after the runs: ${units:-none}"
done
exit "$failed"
GUEST
rc=0
bash "$here/node-vm.sh" run "$share" 7200 || rc=$?
grep -E '^(apparmor|berthd|systemd|cgroupfs|  )' "$share/guest.log" || cat "$share/guest.log" >&2
exit "$rc"
