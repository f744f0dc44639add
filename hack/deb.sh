#!/usr/bin/env bash
# Builds Berth's Debian package with cargo-deb (from crates.io): berthd, berthctl and berth-shim
# in /usr/bin, berthd.service (Type=notify, Delegate=yes, KillMode=process), the default
# configuration as a conffile (every key commented out, so the defaults apply), man pages
# berthd(8), berthctl(1) and berth.toml(5) printed by the binaries themselves, the default CNI
# network and /etc/crictl.yaml installed by the postinst only where the node has none.
# Usage: hack/deb.sh [--profile release|dev]   (dev packages the debug binaries already built)
# Prints the path of the .deb.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
profile=release
if [ "${1:-}" = --profile ]; then
  profile=$2
fi
case $profile in
  release) bin=target/release ;;
  dev) bin=target/debug ;;
  *) echo "deb.sh: --profile release or dev" >&2; exit 2 ;;
esac
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --version 3.8.0 >&2
if [ "$profile" = release ]; then
  cargo build --release --workspace >&2
fi

assets=target/deb-assets
mkdir -p "$assets"
"$bin/berthd" man berthd | gzip -9n >"$assets/berthd.8.gz"
"$bin/berthd" man berth-toml | gzip -9n >"$assets/berth.toml.5.gz"
"$bin/berthctl" man | gzip -9n >"$assets/berthctl.1.gz"
{
  echo "# Berth's configuration. Every key is commented out: berthd's defaults apply, and a newer"
  echo "# package's defaults too. Uncomment a key to change it; 'berthd config reference' (or"
  echo "# man berth.toml) explains each. Drop-in files go in /etc/berth/config.d/."
  echo
  "$bin/berthd" config default | grep -v '^#' | sed -E '/./s/^/# /'
} >"$assets/config.toml"

out=target/debian
mkdir -p "$out"
cargo deb --no-build --profile "$profile" --output "$out" >&2
ls -t "$out"/berth_*.deb | head -1
