#!/usr/bin/env bash
# Builds the images the Kubernetes 1.20 node e2e specs run (no base image is downloaded) and
# pushes them to REGISTRY under the repositories of the repo list it prints (KUBE_TEST_REPO_LIST
# format: e2e.test then pulls REGISTRY/<repo>/<name>:<upstream tag>):
#   library/busybox:1.29              Debian's busybox with every applet also in /bin, as in the
#                                     upstream image (specs run /bin/sysctl, /bin/ip, ...)
#   e2e-test-images/agnhost:2.21      agnhost built from the same source tree, on busybox, with
#                                     the host's curl and netcat-openbsd (the upstream image's
#                                     tools the networking specs run in it); its busybox is
#                                     Debian's dynamic one, whose shell runs commands from PATH as
#                                     the upstream image's does (busybox-static's runs its own
#                                     applets first: `sh -c "nc ..."` would get busybox's nc)
#   e2e/nonroot:1.0                   busybox run as user 1234
#   e2e/nonewprivs:1.0                a setuid-root program printing its effective uid
#   library/nginx:1.14-alpine         busybox httpd serving /usr/share/nginx/html on port 80
#   library/httpd:2.4.38-alpine       busybox httpd serving /usr/local/apache2/htdocs on port 80
#   pause:3.2                         busybox sleep (also containerd's sandbox image)
# nginx and httpd are stand-ins: the specs run them as long-running pods that serve HTTP on 80.
# Usage: hack/e2e-images.sh REGISTRY AGNHOST_BINARY REPO_LIST_OUT. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REG=$1 AGNHOST=$2 OUT=$3
W=$(mktemp -d /tmp/berth-e2e-images.XXXXXX)
trap 'rm -rf "$W"' EXIT
SKOPEO=(skopeo --insecure-policy)

pushed() { "${SKOPEO[@]}" inspect --tls-verify=false "docker://$REG/$1" >/dev/null 2>&1; }

mkdir -p "$W/busybox/bin"
ln -s "$(command -v busybox)" "$W/busybox/bin/busybox"
# Debian's dynamic busybox, for agnhost (its package conflicts with busybox-static: unpacked).
(cd "$W" && apt-get download -qq busybox && dpkg -x busybox_*.deb "$W/busybox-dynamic")
# nonewprivs' program: reports the effective uid it runs with (setuid root in the image).
printf '#include <stdio.h>\n#include <unistd.h>\nint main(void) { printf("Effective uid: %%d\\n", (int)geteuid()); return 0; }\n' >"$W/nnp.c"
cc -static -O2 -o "$W/nnp" "$W/nnp.c"
python3 - "$here" "$W/busybox" "$W/oci" "$AGNHOST" "$W/nnp" "$W/busybox-dynamic/bin/busybox" <<'PY'
import subprocess
import sys
sys.path.insert(0, sys.argv[1])
import imagebuild as ib
layout = ib.Layout(sys.argv[3])
base = layout.layer(ib.busybox_layer(sys.argv[2]), "gzip", "busybox rootfs")

t = ib.Tar()
applets = subprocess.run([sys.argv[2] + "/bin/busybox", "--list-full"], stdout=subprocess.PIPE,
                         check=True, text=True).stdout.split()
for a in sorted({a.rsplit("/", 1)[-1] for a in applets if "/" in a and not a.startswith("bin/")}):
    t.symlink("bin/" + a, "/bin/busybox")
bin_links = layout.layer(t.finish(), "gzip", "every applet in /bin")
layout.tag(layout.image([base, bin_links], {"Env": [ib.PATH_ENV], "Cmd": ["sh"]}), "busybox")

t = ib.Tar()
with open(sys.argv[4], "rb") as f:
    t.file("agnhost", f.read(), mode=0o755)
t.symlink("agnhost-2", "agnhost")
t.dir("uploads")
ib.add_host_binaries(t, [("/usr/bin/curl", "usr/local/bin/curl"),
                         ("/bin/nc.openbsd", "usr/local/bin/nc"),
                         (sys.argv[6], "bin/busybox")])
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
layout.tag(layout.image([base], {"Env": [ib.PATH_ENV], "User": "1234", "Cmd": ["sh"]}), "nonroot")
t = ib.Tar()
with open(sys.argv[5], "rb") as f:
    t.file("usr/local/bin/nnp", f.read(), mode=0o4755)
nnp = layout.layer(t.finish(), "gzip", "nonewprivs")
layout.tag(layout.image([base, nnp], {"Env": [ib.PATH_ENV], "Cmd": ["nnp"]}), "nonewprivs")
layout.close()
PY
for pair in busybox:library/busybox:1.29 agnhost:e2e-test-images/agnhost:2.21 nginx:library/nginx:1.14-alpine \
  httpd:library/httpd:2.4.38-alpine nonroot:e2e/nonroot:1.0 nonewprivs:e2e/nonewprivs:1.0; do
  ref=${pair%%:*} dest=${pair#*:}
  # Always copied: the build is reproducible, so an unchanged image re-pushes no blob, and a
  # changed one replaces the tag.
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
