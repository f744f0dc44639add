#!/usr/bin/env bash
# Installs what building, running and testing Berth needs, from Debian's packages and crates.io only.
set -euo pipefail
pkgs=(protobuf-compiler iproute2 util-linux libseccomp-dev docker-registry skopeo apache2-utils jq zstd curl bc busybox-static containernetworking-plugins iptables openssl dbus-daemon python3-dbus python3-gi)
[ "${1:-}" = "--bench" ] && pkgs+=(containerd runc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo-nextest >/dev/null 2>&1 && ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
