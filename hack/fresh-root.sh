#!/usr/bin/env bash
# A fresh Debian 12 root (debootstrap minbase, plus systemd and iptables) for testing the
# package: made once from Debian's archive and cached as a tarball, then unpacked into DIR.
# Usage: hack/fresh-root.sh DIR
set -euo pipefail
dir=$1
cache=${BERTH_CACHE:-/var/cache/berth}/debian12-root.tar.zst
mirror=${BERTH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ ! -s "$cache" ]; then
  command -v debootstrap >/dev/null || apt-get install -y debootstrap >&2
  mkdir -p "$(dirname "$cache")"
  build=$(mktemp -d /var/tmp/berth-debootstrap.XXXXXX)
  trap 'rm -rf "$build"' EXIT
  debootstrap --variant=minbase --include=systemd,iptables bookworm "$build" "$mirror" >&2
  rm -rf "$build"/var/cache/apt/archives/*.deb
  tar -C "$build" --zstd -cf "$cache.tmp" .
  mv "$cache.tmp" "$cache"
fi
mkdir -p "$dir"
tar -C "$dir" --zstd -xf "$cache"
