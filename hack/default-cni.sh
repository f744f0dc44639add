#!/usr/bin/env bash
# Installs Berth's default pod network, packaging/10-berth.conflist (bridge berth0 + host-local
# 10.88.0.0/16 + portmap + bandwidth, CNI 1.0.0, Debian's containernetworking-plugins), when the
# CNI conf dir has no network config yet, as the Debian package's postinst does. Loopback needs no plugin: Berth brings
# `lo` up in every pod itself.
# Usage: hack/default-cni.sh [CONF_DIR]   (default /etc/cni/net.d)
set -euo pipefail
dir=${1:-/etc/cni/net.d}
mkdir -p "$dir"
if compgen -G "$dir/*.conflist" >/dev/null || compgen -G "$dir/*.conf" >/dev/null ||
    compgen -G "$dir/*.json" >/dev/null; then
    echo "default-cni: $dir already has a network config; leaving it"
    exit 0
fi
tmp=$(mktemp "$dir/.10-berth.XXXXXX")
cp "$(dirname "$0")/../packaging/10-berth.conflist" "$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$dir/10-berth.conflist"
echo "default-cni: wrote $dir/10-berth.conflist (bridge berth0, 10.88.0.0/16)"
