#!/usr/bin/env bash
# Builds the images the Kubernetes 1.20 node e2e specs run (no base image is downloaded) and
# pushes them to REGISTRY under the repositories of the repo list it prints (KUBE_TEST_REPO_LIST
# format: e2e.test then pulls REGISTRY/<repo>/<name>:<upstream tag>):
#   library/busybox:1.29              Debian's busybox (the test registry's busybox:latest)
#   e2e-test-images/agnhost:2.21      agnhost built from the same source tree, on busybox
#   library/nginx:1.14-alpine         busybox httpd serving /usr/share/nginx/html on port 80
#   library/httpd:2.4.38-alpine       busybox httpd serving /usr/local/apache2/htdocs on port 80
#   pause:3.2                         busybox sleep (also containerd's sandbox image)
# nginx and httpd are stand-ins: the specs run them as long-running pods that serve HTTP on 80.
# Usage: hack/e2e-images.sh REGISTRY AGNHOST_BINARY REPO_LIST_OUT. Idempotent (skips pushed images).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REG=$1 AGNHOST=$2 OUT=$3
W=$(mktemp -d /tmp/berth-e2e-images.XXXXXX)
trap 'rm -rf "$W"' EXIT
SKOPEO=(skopeo --insecure-policy)

pushed() { "${SKOPEO[@]}" inspect --tls-verify=false "docker://$REG/$1" >/dev/null 2>&1; }

if ! pushed library/busybox:1.29; then
  "${SKOPEO[@]}" copy -q --src-tls-verify=false --dest-tls-verify=false \
    "docker://$REG/busybox:latest" "docker://$REG/library/busybox:1.29"
fi

mkdir -p "$W/busybox/bin"
ln -s "$(command -v busybox)" "$W/busybox/bin/busybox"
python3 - "$here" "$W/busybox" "$W/oci" "$AGNHOST" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import imagebuild as ib
layout = ib.Layout(sys.argv[3])
base = layout.layer(ib.busybox_layer(sys.argv[2]), "gzip", "busybox rootfs")

t = ib.Tar()
with open(sys.argv[4], "rb") as f:
    t.file("agnhost", f.read(), mode=0o755)
t.symlink("agnhost-2", "agnhost")
t.dir("uploads")
agnhost = layout.layer(t.finish(), "gzip", "agnhost")
layout.tag(layout.image([base, agnhost], {"Env": [ib.PATH_ENV], "Entrypoint": ["/agnhost"],
                                          "Cmd": ["pause"]}), "agnhost")

def web(root):
    t = ib.Tar()
    t.file(root + "/index.html", b"<html><body>It works!</body></html>\n")
    layer = layout.layer(t.finish(), "gzip", "web root " + root)
    return layout.image([base, layer], {"Env": [ib.PATH_ENV], "ExposedPorts": {"80/tcp": {}},
                                        "Cmd": ["httpd", "-f", "-p", "80", "-h", "/" + root]})
layout.tag(web("usr/share/nginx/html"), "nginx")
layout.tag(web("usr/local/apache2/htdocs"), "httpd")
layout.close()
PY
for pair in agnhost:e2e-test-images/agnhost:2.21 nginx:library/nginx:1.14-alpine \
  httpd:library/httpd:2.4.38-alpine; do
  ref=${pair%%:*} dest=${pair#*:}
  pushed "$dest" && continue
  "${SKOPEO[@]}" copy -q --dest-tls-verify=false "oci:$W/oci:$ref" "docker://$REG/$dest"
done
# The sandbox image, as the containerd benchmarks build it.
# shellcheck source=hack/bench-common.sh
. "$here/bench-common.sh"
pushed pause:3.2 || push_pause "$W" "$REG/pause:3.2"

cat >"$OUT" <<YAML
dockerLibraryRegistry: $REG/library
e2eRegistry: $REG/e2e
e2eVolumeRegistry: $REG/e2e/volume
promoterE2eRegistry: $REG/e2e-test-images
buildImageRegistry: $REG/build-image
gcRegistry: $REG
sigStorageRegistry: $REG/sig-storage
gcrReleaseRegistry: $REG/gke-release
privateRegistry: $REG/private
sampleRegistry: $REG/samples
YAML
