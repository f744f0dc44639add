#!/usr/bin/env bash
# Build Berth's test images locally (no base image is downloaded) and push
# them to a plain-HTTP registry with skopeo.
#
#   hack/make-test-images.sh REGISTRY [AUTH_REGISTRY USER:PASS]
#
# REGISTRY and AUTH_REGISTRY are HOST:PORT of plain-HTTP registries, e.g.
# 127.0.0.1:5050 (see hack/registry.sh).  Pushed to REGISTRY:
#   busybox:latest     Debian's busybox + its glibc libs (Docker schema2)
#   busybox:oci        the same image as an OCI manifest
#   layers:latest      busybox + 4 layers of whiteouts, links, devices, xattrs,
#                      owners and modes (gzip, uncompressed and zstd layers);
#                      see hack/testdata/layers.expect
#   multiarch:latest   OCI index: linux/amd64, linux/arm64, linux/arm/v7
#   large:latest       busybox + 8 layers of ~25 MiB seeded random data
#   hostile-dotdot:latest, hostile-symlink:latest, hostile-hardlink:latest,
#   hostile-abs-path:latest    one-layer images with path-escape attempts
# With AUTH_REGISTRY USER:PASS, busybox:latest is also pushed there with
# those credentials.
#
# OCI images are pushed with --preserve-digests, so registry digests equal
# the digests in the local OCI layout and layer media types stay as built.
# The built layout is cached in $WORKDIR (default /tmp/berth-test-images)
# keyed on the content of this script and hack/imagebuild.py.
#
# The last lines of output are machine readable:
#   LAYOUT <path of the OCI image layout>
#   IMAGE <name>:<tag> digest <manifest digest> ref <REGISTRY>/<name>:<tag>
#   AUTH_IMAGE <name>:<tag> digest <manifest digest> ref <AUTH_REGISTRY>/<name>:<tag>
set -euo pipefail

HACK_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
SELF=$HACK_DIR/make-test-images.sh
BUILDER=$HACK_DIR/imagebuild.py
WORKDIR=${WORKDIR:-/tmp/berth-test-images}

usage() {
    sed -n '2,/^set -euo/p' "$SELF" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}
log() { printf 'make-test-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $# -eq 1 || $# -eq 3 ]] || usage
[[ $1 != -h && $1 != --help ]] || usage
REGISTRY=$1
AUTH_REGISTRY=${2:-}
AUTH_CREDS=${3:-}
addr_re='^[][A-Za-z0-9.:_-]+$'
for r in "$REGISTRY" ${AUTH_REGISTRY:+"$AUTH_REGISTRY"}; do
    [[ $r =~ $addr_re ]] || die "bad registry address: $r (want HOST:PORT)"
done
if [[ -n $AUTH_REGISTRY && $AUTH_CREDS != *:* ]]; then
    die "credentials must be USER:PASS"
fi

START=$SECONDS

apt_updated=""
ensure_cmd() { # command package
    command -v "$1" >/dev/null 2>&1 && return 0
    log "installing $2"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y "$2" >/dev/null 2>&1; then
        [[ -n $apt_updated ]] || { apt-get update >/dev/null; apt_updated=1; }
        apt-get install -y "$2" >/dev/null
    fi
}
ensure_cmd skopeo skopeo
ensure_cmd jq jq
ensure_cmd zstd zstd
ensure_cmd curl curl
ensure_cmd python3 python3
ensure_cmd flock util-linux
ensure_cmd dpkg-deb dpkg

# Fail early with a useful message if a registry is not up.
check_registry() {
    local code
    code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$1/v2/" || true)
    [[ $code == 200 || $code == 401 ]] ||
        die "no registry answers on http://$1/v2/ (HTTP ${code:-none}); start one with hack/registry.sh"
}
check_registry "$REGISTRY"
[[ -z $AUTH_REGISTRY ]] || check_registry "$AUTH_REGISTRY"

mkdir -p "$WORKDIR"
WORKDIR=$(cd -- "$WORKDIR" && pwd -P)
# One build at a time per WORKDIR.
exec 9>"$WORKDIR/lock"
flock 9

KEY=$(cat "$SELF" "$BUILDER" | sha256sum | cut -c1-16)
BUILD=$WORKDIR/build-$KEY
LAYOUT=$BUILD/oci

# Put an extracted busybox with bin/busybox into $1.
get_busybox() {
    local dest=$1 dl=$1/download deb
    mkdir -p "$dl" "$dest"
    if (cd "$dl" && apt-get download -o APT::Sandbox::User=root busybox >/dev/null 2>&1) ||
        { apt-get update >/dev/null 2>&1 && (cd "$dl" && apt-get download -o APT::Sandbox::User=root busybox >/dev/null 2>&1); }; then
        deb=$(find "$dl" -maxdepth 1 -name 'busybox_*.deb' | head -n 1)
        if [[ -n $deb ]] && dpkg-deb -x "$deb" "$dest/deb" && [[ -x $dest/deb/bin/busybox ]]; then
            ln -s deb/bin "$dest/bin"
            echo "Debian package $(basename "$deb") (dynamically linked)" >"$dest/source"
            return 0
        fi
    fi
    log "warning: cannot download Debian's busybox package; falling back to busybox-static"
    local bin
    if ! bin=$(dpkg -L busybox-static 2>/dev/null | grep -E '/bin/busybox$' | head -n 1) || [[ -z $bin ]]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y busybox-static >/dev/null
        bin=$(dpkg -L busybox-static | grep -E '/bin/busybox$' | head -n 1)
    fi
    mkdir -p "$dest/bin"
    cp "$bin" "$dest/bin/busybox"
    echo "busybox-static from the host ($bin)" >"$dest/source"
}

if [[ -f $BUILD/complete ]]; then
    log "using cached build $BUILD ($(<"$BUILD/busybox/source"))"
else
    TMP=$BUILD.tmp
    rm -rf "$TMP"
    trap 'rm -rf "$TMP"' EXIT
    mkdir -p "$TMP"
    t0=$SECONDS
    get_busybox "$TMP/busybox"
    log "building images from busybox: $(<"$TMP/busybox/source")"
    python3 "$BUILDER" build --busybox-root "$TMP/busybox" --out "$TMP/oci"
    rm -rf "$TMP/busybox/download"
    touch "$TMP/complete"
    mv "$TMP" "$BUILD"
    trap - EXIT
    # Drop builds made by other versions of the scripts.
    for old in "$WORKDIR"/build-*; do
        [[ $old == "$BUILD" ]] || rm -rf "$old"
    done
    log "built OCI layout $LAYOUT in $((SECONDS - t0))s"
fi

# The committed expectation file must match what the builder produces.
if ! python3 "$BUILDER" expect | cmp -s - "$HACK_DIR/testdata/layers.expect"; then
    log "WARNING: hack/testdata/layers.expect differs from 'hack/imagebuild.py expect'; regenerate it"
fi

SKOPEO=(skopeo --insecure-policy)

# push LAYOUT_REF REGISTRY NAME:TAG [skopeo copy options...]
push() {
    local ref=$1 reg=$2 dest=$3
    shift 3
    local t0=$SECONDS
    "${SKOPEO[@]}" copy -q --retry-times 3 --dest-tls-verify=false "$@" \
        "oci:$LAYOUT:$ref" "docker://$reg/$dest"
    local opts="$*"
    [[ -z $AUTH_CREDS ]] || opts=${opts//"$AUTH_CREDS"/"${AUTH_CREDS%%:*}:***"}
    log "pushed $ref -> $reg/$dest ($opts) in $((SECONDS - t0))s"
}

OCI=(--preserve-digests)
push busybox "$REGISTRY" busybox:latest --format v2s2
push busybox "$REGISTRY" busybox:oci "${OCI[@]}"
push layers "$REGISTRY" layers:latest "${OCI[@]}"
push multiarch "$REGISTRY" multiarch:latest --all "${OCI[@]}"
push large "$REGISTRY" large:latest "${OCI[@]}"
for h in hostile-dotdot hostile-symlink hostile-hardlink hostile-abs-path; do
    push "$h" "$REGISTRY" "$h:latest" "${OCI[@]}"
done
if [[ -n $AUTH_REGISTRY ]]; then
    push busybox "$AUTH_REGISTRY" busybox:latest --format v2s2 --dest-creds "$AUTH_CREDS"
fi

# manifest_digest REGISTRY NAME:TAG [skopeo inspect options...]
manifest_digest() {
    local reg=$1 ref=$2
    shift 2
    "${SKOPEO[@]}" inspect --retry-times 3 --tls-verify=false --raw "$@" "docker://$reg/$ref" |
        sha256sum | sed 's/^\([0-9a-f]*\).*/sha256:\1/'
}

echo "LAYOUT $LAYOUT"
for ref in busybox:latest busybox:oci layers:latest multiarch:latest large:latest \
    hostile-dotdot:latest hostile-symlink:latest hostile-hardlink:latest hostile-abs-path:latest; do
    echo "IMAGE $ref digest $(manifest_digest "$REGISTRY" "$ref") ref $REGISTRY/$ref"
done
if [[ -n $AUTH_REGISTRY ]]; then
    echo "AUTH_IMAGE busybox:latest digest $(manifest_digest "$AUTH_REGISTRY" busybox:latest --creds "$AUTH_CREDS") ref $AUTH_REGISTRY/busybox:latest"
fi
log "done in $((SECONDS - START))s"
