#!/usr/bin/env bash
# Installs what building, running and testing Berth needs, from Debian's packages and crates.io only.
set -euo pipefail
pkgs=(gcc libc6-dev protobuf-compiler netcat-openbsd iproute2 util-linux libseccomp-dev docker-registry skopeo apache2-utils jq zstd curl bc busybox-static containernetworking-plugins iptables openssl dbus-daemon python3-dbus python3-gi debootstrap)
pkgs+=(prometheus)
# The node VM tier (tests/node_vm.rs, hack/node-vm.sh).
pkgs+=(qemu-system-x86 qemu-utils e2fsprogs)
[ "${1:-}" = "--bench" ] && pkgs+=(containerd runc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # A package's maintainer script must not start a system service (prometheus) on the host:
  # the tests start their own.
  policy=/usr/sbin/policy-rc.d had_policy=0
  [ -e $policy ] && had_policy=1
  if [ $had_policy = 0 ]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; fi
  rc=0
  lean=() full=()
  for p in "${missing[@]}"; do
    case $p in prometheus | qemu-system-x86) lean+=("$p") ;; *) full+=("$p") ;; esac
  done
  [ ${#full[@]} = 0 ] || apt-get install -y -qq "${full[@]}" >/dev/null || rc=$?
  # Prometheus (which the metrics tests scrape with) without its recommended exporters, qemu
  # without its recommended extras.
  [ $rc != 0 ] || [ ${#lean[@]} = 0 ] ||
    apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null || rc=$?
  [ $had_policy = 1 ] || rm -f $policy
  [ $rc = 0 ] || exit $rc
fi
if ! command -v cargo-nextest >/dev/null 2>&1 && ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
# The Debian package is built with cargo-deb (make deb, and the package test).
if ! command -v cargo-deb >/dev/null 2>&1; then
  cargo install --locked cargo-deb --version 3.8.0
fi
