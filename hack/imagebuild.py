#!/usr/bin/env python3
"""Build Berth's test container images as one OCI image layout.

Used by hack/make-test-images.sh; it can also be run by hand:

  imagebuild.py build --busybox-root DIR --out LAYOUT
      Build every test image into the OCI image layout LAYOUT (which must not
      exist yet).  DIR is a directory holding bin/busybox (for example a
      `dpkg-deb -x` of Debian's busybox package).  Each image is tagged in
      LAYOUT/index.json with a ref name (org.opencontainers.image.ref.name)
      listed by `imagebuild.py refs`, so `skopeo copy oci:LAYOUT:REF ...`
      works.
  imagebuild.py refs
      Print the ref names that `build` creates, one per line.
  imagebuild.py expect
      Print the expectation list for the `layers` image (the content of
      hack/testdata/layers.expect).
  imagebuild.py check-expect ROOTFS EXPECT
      Check an unpacked root filesystem against an expectation file; prints
      one line per failed check and exits 1 if any failed.

Everything is reproducible: fixed timestamps, numeric owners only, seeded
random content, gzip without a timestamp, single-threaded zstd.  Tar entries
are written with Python's tarfile by setting TarInfo fields directly, so
names and link targets are stored exactly as given (this matters for the
hostile images).
"""

import argparse
import concurrent.futures
import hashlib
import io
import json
import os
import random
import stat
import subprocess
import sys
import tarfile
import zlib

EPOCH = 1704067200  # 2024-01-01T00:00:00Z, the mtime of every tar entry
CREATED = "2024-01-01T00:00:00Z"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_TAR = "application/vnd.oci.image.layer.v1.tar"
MT_TAR_GZIP = MT_TAR + "+gzip"
MT_TAR_ZSTD = MT_TAR + "+zstd"
REF_NAME = "org.opencontainers.image.ref.name"

REFS = [
    "busybox",
    "layers",
    "multiarch",
    "large",
    "hostile-dotdot",
    "hostile-symlink",
    "hostile-hardlink",
    "hostile-abs-path",
]


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------
# Tar layer writer


class Tar:
    """An in-memory tar stream whose entries are stored exactly as given."""

    def __init__(self):
        self._buf = io.BytesIO()
        self._tf = tarfile.open(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)
        self._dirs = set()

    def _info(self, name, kind, mode, uid, gid):
        ti = tarfile.TarInfo()
        ti.name = name  # verbatim: no normalisation, no stripping of "/" or ".."
        ti.type = kind
        ti.mode = mode
        ti.uid = uid
        ti.gid = gid
        ti.uname = ""
        ti.gname = ""
        ti.mtime = EPOCH
        return ti

    def _parents(self, name):
        """Add directory entries (0755 root) for missing parents of name."""
        parts = name.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self._dirs:
                self.dir(d)

    def dir(self, name, mode=0o755, uid=0, gid=0, parents=True):
        name = name.rstrip("/")
        if parents:
            self._parents(name)
        self._dirs.add(name)
        self._tf.addfile(self._info(name + "/", tarfile.DIRTYPE, mode, uid, gid))

    def file(self, name, data, mode=0o644, uid=0, gid=0, xattrs=None, parents=True):
        if isinstance(data, str):
            data = data.encode()
        if parents:
            self._parents(name)
        ti = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        ti.size = len(data)
        if xattrs:
            ti.pax_headers = {"SCHILY.xattr." + k: v for k, v in xattrs.items()}
        self._tf.addfile(ti, io.BytesIO(data))

    def symlink(self, name, target, uid=0, gid=0, parents=True):
        if parents:
            self._parents(name)
        ti = self._info(name, tarfile.SYMTYPE, 0o777, uid, gid)
        ti.linkname = target
        self._tf.addfile(ti)

    def hardlink(self, name, target, uid=0, gid=0, mode=0o644, parents=True):
        if parents:
            self._parents(name)
        ti = self._info(name, tarfile.LNKTYPE, mode, uid, gid)
        ti.linkname = target
        self._tf.addfile(ti)

    def chardev(self, name, major, minor, mode=0o666, uid=0, gid=0):
        self._parents(name)
        ti = self._info(name, tarfile.CHRTYPE, mode, uid, gid)
        ti.devmajor = major
        ti.devminor = minor
        self._tf.addfile(ti)

    def fifo(self, name, mode=0o644, uid=0, gid=0):
        self._parents(name)
        self._tf.addfile(self._info(name, tarfile.FIFOTYPE, mode, uid, gid))

    def whiteout(self, name):
        """Whiteout entry: an empty regular file named .wh.<name>."""
        head, _, base = name.rpartition("/")
        self.file((head + "/" if head else "") + ".wh." + base, b"", mode=0o644)

    def opaque(self, dirname):
        self.file(dirname.rstrip("/") + "/.wh..wh..opq", b"", mode=0o644)

    def finish(self):
        self._tf.close()
        return self._buf.getvalue()


def compress(raw, compression):
    if compression == "gzip":
        co = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: gzip wrapper, mtime 0
        return co.compress(raw) + co.flush(), MT_TAR_GZIP
    if compression == "gzip-fast":
        co = zlib.compressobj(1, zlib.DEFLATED, 31)
        return co.compress(raw) + co.flush(), MT_TAR_GZIP
    if compression == "zstd":
        out = subprocess.run(
            ["zstd", "-q", "-c", "-3", "-T1", "--no-progress"],
            input=raw, stdout=subprocess.PIPE, check=True,
        ).stdout
        return out, MT_TAR_ZSTD
    if compression == "none":
        return raw, MT_TAR
    raise ValueError(compression)


# --------------------------------------------------------------------------
# OCI image layout writer


class Layout:
    def __init__(self, root, create=True):
        self.root = root
        self.index = []
        if create:
            os.makedirs(os.path.join(root, "blobs", "sha256"))
            with open(os.path.join(root, "oci-layout"), "w") as f:
                f.write('{"imageLayoutVersion":"1.0.0"}')

    def blob(self, data, media_type):
        hexd = sha256_hex(data)
        path = os.path.join(self.root, "blobs", "sha256", hexd)
        if not os.path.exists(path):
            tmp = path + ".tmp%d" % os.getpid()
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, path)
        return {"mediaType": media_type, "digest": "sha256:" + hexd, "size": len(data)}

    def layer(self, tar_bytes, compression, comment):
        """Store a layer blob; returns (descriptor, diff_id, comment)."""
        blob, media_type = compress(tar_bytes, compression)
        return (self.blob(blob, media_type), "sha256:" + sha256_hex(tar_bytes), comment)

    def image(self, layers, config, arch="amd64", variant=None):
        """Store config + manifest; returns the manifest descriptor with platform."""
        cfg = {
            "created": CREATED,
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [l[1] for l in layers]},
            "history": [
                {"created": CREATED, "created_by": "hack/imagebuild.py: " + l[2]}
                for l in layers
            ],
        }
        if variant:
            cfg["variant"] = variant
        cfg_desc = self.blob(canonical_json(cfg), MT_CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": cfg_desc,
            "layers": [l[0] for l in layers],
        }
        desc = self.blob(canonical_json(manifest), MT_MANIFEST)
        desc["platform"] = {"architecture": arch, "os": "linux"}
        if variant:
            desc["platform"]["variant"] = variant
        return desc

    def image_index(self, manifests):
        idx = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests}
        return self.blob(canonical_json(idx), MT_INDEX)

    def tag(self, desc, ref):
        entry = {k: v for k, v in desc.items() if k != "platform"}
        entry["annotations"] = {REF_NAME: ref}
        self.index.append(entry)

    def close(self):
        idx = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": self.index}
        with open(os.path.join(self.root, "index.json"), "wb") as f:
            f.write(canonical_json(idx))


# --------------------------------------------------------------------------
# Images

PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP = "root:x:0:\nnobody:x:65534:\n"
PASSWD_APP = PASSWD + "app:x:1000:1000::/home/app:/bin/sh\n"
GROUP_APP = GROUP + "app:x:1000:\n"


def shared_libs(binary):
    """Paths (as the loader names them) of the shared libraries binary needs."""
    proc = subprocess.run(["ldd", binary], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or "not a dynamic executable" in proc.stdout:
        return []
    libs = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            path = line.split("=>", 1)[1].strip().split(" ")[0]
        else:
            path = line.split(" ")[0]
        if path.startswith("/"):
            libs.append(path)
    return libs


def add_host_binaries(t, binaries):
    """Adds the host's dynamically linked binaries ((host path, path in the image) pairs) to t,
    with each shared library they need once, at the path the loader names (contents copied,
    host symlinks followed)."""
    libs = set()
    for binary, dest in binaries:
        with open(binary, "rb") as f:
            t.file(dest, f.read(), mode=0o755)
        libs.update(shared_libs(binary))
    for lib in sorted(libs):
        with open(os.path.realpath(lib), "rb") as f:
            t.file(lib.lstrip("/"), f.read(), mode=0o755)


def busybox_layer(busybox_root):
    busybox = os.path.join(busybox_root, "bin", "busybox")
    t = Tar()
    for d, mode in [("bin", 0o755), ("sbin", 0o755), ("usr", 0o755), ("usr/bin", 0o755),
                    ("usr/sbin", 0o755), ("etc", 0o755), ("root", 0o700), ("home", 0o755),
                    ("tmp", 0o1777), ("var", 0o755), ("var/tmp", 0o1777), ("dev", 0o755),
                    ("proc", 0o555), ("sys", 0o555), ("run", 0o755)]:
        t.dir(d, mode)
    with open(busybox, "rb") as f:
        t.file("bin/busybox", f.read(), mode=0o755)
    for lib in shared_libs(busybox):
        # Copy the library's content (following host symlinks) to the exact
        # path the loader uses, as a regular file, so no merged-/usr layout
        # is needed in the image.
        with open(os.path.realpath(lib), "rb") as f:
            data = f.read()
        t.file(lib.lstrip("/"), data, mode=0o755)
    applets = subprocess.run([busybox, "--list-full"], stdout=subprocess.PIPE,
                             check=True, text=True).stdout.split()
    seen = {"bin/busybox"}
    for a in sorted(set(applets)):
        a = a.strip("/")
        if "/" in a and a not in seen:  # skips top-level "linuxrc"
            seen.add(a)
            t.symlink(a, "/bin/busybox")
    if "bin/sh" not in seen:
        t.symlink("bin/sh", "/bin/busybox")
    t.file("etc/passwd", PASSWD)
    t.file("etc/group", GROUP)
    return t.finish()


# The `layers` image: busybox base plus four layers with every kind of entry.
TXT = {
    "profile": "export PS1='app$ '\n",
    "to-delete": "deleted by a whiteout in layer 3\n",
    "kept": "this file survives\n",
    "nested": "the whole directory is whited out in layer 3\n",
    "lower": "hidden by the opaque directory in layer 3\n",
    "deep": "hidden too\n",
    "upper": "visible: added together with the opaque marker\n",
    "file-to-dir": "a file in layer 1, a directory in layer 3\n",
    "dir-to-file-child": "child of a directory replaced by a file in layer 3\n",
    "dir-to-file": "a directory in layer 1, a file in layer 3\n",
    "file-to-dir-child": "child of a file that became a directory\n",
    "file-to-symlink": "a file in layer 1, a symlink in layer 3\n",
    "original": "hard linked content\n",
    "xattr": "this file carries the xattr user.berth=hello\n",
    "app.conf": "owner=1000:1000 mode=0640\n",
    "setuid": "#!/bin/sh\necho berth-setuid\n",
    "secret": "only root may read this\n",
    "release": "berth layers test image\n",
}


def layers_layers():
    """The four layers above busybox: list of (tar bytes, compression, comment)."""
    l1 = Tar()
    l1.dir("etc")
    l1.file("etc/passwd", PASSWD_APP)
    l1.file("etc/group", GROUP_APP)
    l1.dir("home")
    l1.dir("home/app", 0o755, 1000, 1000)
    l1.file("home/app/.profile", TXT["profile"], 0o644, 1000, 1000)
    l1.dir("data")
    l1.file("data/to-delete.txt", TXT["to-delete"])
    l1.file("data/kept.txt", TXT["kept"])
    l1.dir("data/subdir")
    l1.file("data/subdir/nested.txt", TXT["nested"])
    l1.dir("opaque")
    l1.file("opaque/lower.txt", TXT["lower"])
    l1.dir("opaque/lowerdir")
    l1.file("opaque/lowerdir/deep.txt", TXT["deep"])
    l1.dir("replace")
    l1.file("replace/file-to-dir", TXT["file-to-dir"])
    l1.dir("replace/dir-to-file")
    l1.file("replace/dir-to-file/child.txt", TXT["dir-to-file-child"])
    l1.file("replace/file-to-symlink", TXT["file-to-symlink"])

    l2 = Tar()
    l2.dir("links")
    l2.file("links/original", TXT["original"])
    l2.hardlink("links/hardlink", "links/original")
    l2.symlink("links/rel-symlink", "original")
    l2.symlink("links/abs-symlink", "/bin/busybox")
    l2.symlink("links/dir-symlink", "../etc")
    l2.symlink("links/dangling", "/nonexistent/berth-target")
    l2.dir("dev-test")
    l2.chardev("dev-test/null", 1, 3, 0o666)
    l2.fifo("dev-test/fifo", 0o644)
    l2.dir("xattr")
    l2.file("xattr/file", TXT["xattr"], xattrs={"user.berth": "hello"})

    l3 = Tar()
    l3.dir("data")
    l3.whiteout("data/to-delete.txt")
    l3.whiteout("data/subdir")
    l3.dir("opaque")
    l3.opaque("opaque")
    l3.file("opaque/upper.txt", TXT["upper"])
    l3.dir("owned", 0o755, 1000, 1000)
    l3.file("owned/app.conf", TXT["app.conf"], 0o640, 1000, 1000)
    l3.file("owned/setuid-bin", TXT["setuid"], 0o4755, 0, 0)
    l3.dir("private", 0o700)
    l3.file("private/secret", TXT["secret"], 0o600)
    l3.dir("replace")
    l3.dir("replace/file-to-dir", 0o755)
    l3.file("replace/file-to-dir/child.txt", TXT["file-to-dir-child"])
    l3.file("replace/dir-to-file", TXT["dir-to-file"])
    l3.symlink("replace/file-to-symlink", "/data/kept.txt")

    l4 = Tar()
    l4.dir("etc")
    l4.file("etc/berth-release", TXT["release"])
    l4.dir("links")
    l4.whiteout("links/dangling")
    l4.dir("home")
    l4.dir("home/app", 0o750, 1000, 1000)  # mode change of an existing directory

    return [
        (l1.finish(), "gzip", "layers 1/4 (gzip): files, dirs to be whited out, opaque lower"),
        (l2.finish(), "none", "layers 2/4 (uncompressed): hard link, symlinks, char device, fifo, xattr"),
        (l3.finish(), "zstd", "layers 3/4 (zstd): whiteouts, opaque dir, owners, setuid, 0700 dir, type changes"),
        (l4.finish(), "gzip", "layers 4/4 (gzip): new file, symlink whiteout, dir mode change"),
    ]


def layers_expect():
    def h(key):
        return sha256_hex(TXT[key].encode())

    passwd = sha256_hex(PASSWD_APP.encode())
    group = sha256_hex(GROUP_APP.encode())
    lines = [
        "# Expected state of the rootfs of the `layers` test image after all",
        "# layers are applied (generated by `hack/imagebuild.py expect`).",
        "#",
        "# Format: one path per line, fields separated by single spaces:",
        "#   PATH KIND [KEY=VALUE ...]",
        "# PATH  absolute path inside the rootfs; no whitespace.",
        "# KIND  file | dir | symlink | char | block | fifo | absent",
        "#       absent: lstat must fail with ENOENT or ENOTDIR.",
        "# KEYs (check only the ones given; each value has no whitespace):",
        "#   mode=OOOO    st_mode & 07777 in octal (includes setuid/setgid/sticky);",
        "#                never given for symlinks. Unpackers must not apply umask.",
        "#   uid=N gid=N  numeric owner (lstat, not following symlinks)",
        "#   size=N       file size in bytes",
        "#   sha256=HEX   sha256 of the file content",
        "#   target=T     symlink target, verbatim (readlink), not resolved",
        "#   dev=MAJ:MIN  device numbers of a char/block device",
        "#   nlink=N      link count",
        "#   samefile=P   same inode (same st_dev and st_ino) as path P",
        "#   xattr=N=V    extended attribute N has value V (may repeat)",
        "#   mtime=S      st_mtime in whole seconds since the epoch",
        "# Lines starting with # and empty lines are ignored.",
        "",
        "# from the busybox base layer",
        "/bin/busybox file mode=0755 uid=0 gid=0",
        "/bin/sh symlink target=/bin/busybox uid=0 gid=0",
        "/tmp dir mode=1777 uid=0 gid=0",
        "/root dir mode=0700 uid=0 gid=0",
        "",
        "# files replaced in a later layer",
        "/etc/passwd file mode=0644 uid=0 gid=0 sha256=" + passwd,
        "/etc/group file mode=0644 uid=0 gid=0 sha256=" + group,
        "/etc/berth-release file mode=0644 uid=0 gid=0 mtime=%d sha256=%s" % (EPOCH, h("release")),
        "",
        "# directory re-declared with another mode: children stay",
        "/home/app dir mode=0750 uid=1000 gid=1000",
        "/home/app/.profile file mode=0644 uid=1000 gid=1000 sha256=" + h("profile"),
        "",
        "# whiteouts",
        "/data dir mode=0755 uid=0 gid=0",
        "/data/kept.txt file mode=0644 sha256=" + h("kept"),
        "/data/to-delete.txt absent",
        "/data/.wh.to-delete.txt absent",
        "/data/subdir absent",
        "/data/subdir/nested.txt absent",
        "/data/.wh.subdir absent",
        "/links/dangling absent",
        "/links/.wh.dangling absent",
        "",
        "# opaque directory",
        "/opaque dir mode=0755 uid=0 gid=0",
        "/opaque/upper.txt file mode=0644 sha256=" + h("upper"),
        "/opaque/lower.txt absent",
        "/opaque/lowerdir absent",
        "/opaque/lowerdir/deep.txt absent",
        "/opaque/.wh..wh..opq absent",
        "",
        "# hard link and symlinks",
        "/links/original file mode=0644 uid=0 gid=0 nlink=2 mtime=%d sha256=%s" % (EPOCH, h("original")),
        "/links/hardlink file mode=0644 uid=0 gid=0 nlink=2 samefile=/links/original sha256=" + h("original"),
        "/links/rel-symlink symlink target=original",
        "/links/abs-symlink symlink target=/bin/busybox",
        "/links/dir-symlink symlink target=../etc",
        "",
        "# device node, fifo, xattr",
        "/dev-test/null char mode=0666 uid=0 gid=0 dev=1:3",
        "/dev-test/fifo fifo mode=0644 uid=0 gid=0",
        "/xattr/file file mode=0644 xattr=user.berth=hello sha256=" + h("xattr"),
        "",
        "# owners and modes",
        "/owned dir mode=0755 uid=1000 gid=1000",
        "/owned/app.conf file mode=0640 uid=1000 gid=1000 sha256=" + h("app.conf"),
        "/owned/setuid-bin file mode=4755 uid=0 gid=0 sha256=" + h("setuid"),
        "/private dir mode=0700 uid=0 gid=0",
        "/private/secret file mode=0600 uid=0 gid=0 sha256=" + h("secret"),
        "",
        "# type changes between layers",
        "/replace/file-to-dir dir mode=0755",
        "/replace/file-to-dir/child.txt file sha256=" + h("file-to-dir-child"),
        "/replace/dir-to-file file sha256=" + h("dir-to-file"),
        "/replace/dir-to-file/child.txt absent",
        "/replace/file-to-symlink symlink target=/data/kept.txt",
    ]
    return "\n".join(lines) + "\n"


def platform_layer(platform):
    t = Tar()
    t.file("platform", platform + "\n")
    return t.finish()


LARGE_LAYERS = 8


def large_layer_tar(i):
    """~25 MiB of seeded random bytes in files of 4 KiB, 1 MiB and 5 MiB."""
    rng = random.Random("berth-large-layer-%d" % i)
    t = Tar()
    base = "large/layer%d" % i
    t.dir("large")
    t.dir(base)
    remaining = 25 << 20
    if i % 3 == 0:  # a few 5 MiB files: layers 0, 3, 6
        t.file(base + "/big-0.bin", rng.randbytes(5 << 20))
        remaining -= 5 << 20
    small = 1280  # 5 MiB of 4 KiB files
    remaining -= small * 4096
    for j in range(remaining >> 20):
        t.file("%s/medium/m%02d.bin" % (base, j), rng.randbytes(1 << 20))
    for j in range(small):
        t.file("%s/small/%02d/s%04d.bin" % (base, j % 16, j), rng.randbytes(4096))
    return t.finish()


def build_large_layer(args):
    root, i = args
    layout = Layout(root, create=False)
    raw = large_layer_tar(i)
    return layout.layer(raw, "gzip-fast", "large %d/%d: random data" % (i + 1, LARGE_LAYERS))


def hostile_layers():
    out = {}
    t = Tar()
    t.file("../../../../tmp/berth-escape-dotdot", "escaped via ..\n", parents=False)
    out["hostile-dotdot"] = (t.finish(), [("../../../../tmp/berth-escape-dotdot", "0", "")])

    t = Tar()
    t.symlink("evil", "/tmp", parents=False)
    t.file("evil/berth-escape-symlink", "escaped via a symlink\n", parents=False)
    out["hostile-symlink"] = (t.finish(), [("evil", "2", "/tmp"),
                                           ("evil/berth-escape-symlink", "0", "")])

    t = Tar()
    t.hardlink("passwd", "../../../../etc/passwd", parents=False)
    out["hostile-hardlink"] = (t.finish(), [("passwd", "1", "../../../../etc/passwd")])

    t = Tar()
    t.file("/../../tmp/berth-escape-abs", "escaped via an absolute path\n", parents=False)
    out["hostile-abs-path"] = (t.finish(), [("/../../tmp/berth-escape-abs", "0", "")])
    return out


def raw_entries(tar_bytes):
    """(name, typeflag, linkname) of each entry, read from the raw headers."""
    entries = []
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tf:
        for m in tf:
            entries.append((m.name, m.type.decode(), m.linkname))
    return entries


def build(busybox_root, out):
    layout = Layout(out)
    base_config = {"Env": [PATH_ENV], "Cmd": ["sh"]}

    bb = layout.layer(busybox_layer(busybox_root), "gzip", "busybox rootfs")
    layout.tag(layout.image([bb], dict(base_config)), "busybox")

    layers = [bb] + [layout.layer(raw, comp, comment) for raw, comp, comment in layers_layers()]
    cfg = dict(base_config, User="1000:1000", WorkingDir="/home/app")
    layout.tag(layout.image(layers, cfg), "layers")

    manifests = []
    for arch, variant in [("amd64", None), ("arm64", None), ("arm", "v7")]:
        plat = "linux/" + arch + ("/" + variant if variant else "")
        pl = layout.layer(platform_layer(plat), "gzip", "/platform = " + plat)
        image_layers = [bb, pl] if arch == "amd64" else [pl]
        manifests.append(layout.image(image_layers, dict(base_config), arch, variant))
    layout.tag(layout.image_index(manifests), "multiarch")

    workers = min(LARGE_LAYERS, os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        large = list(pool.map(build_large_layer, [(out, i) for i in range(LARGE_LAYERS)]))
    layout.tag(layout.image([bb] + large, dict(base_config)), "large")

    for ref, (raw, want) in hostile_layers().items():
        got = raw_entries(raw)
        if got != want:
            sys.exit("imagebuild: %s: tar entries %r, wanted %r" % (ref, got, want))
        layer = layout.layer(raw, "gzip", "hostile layer")
        layout.tag(layout.image([layer], dict(base_config)), ref)

    layout.close()
    refs = [e["annotations"][REF_NAME] for e in layout.index]
    assert refs == REFS, refs


# --------------------------------------------------------------------------
# Checking an unpacked rootfs against an expectation file

KIND_OF = {
    stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
    stat.S_IFCHR: "char", stat.S_IFBLK: "block", stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


def check_expect(rootfs, expect_path):
    failures = []
    checked = 0
    with open(expect_path) as f:
        lines = f.read().splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(" ")
        path, kind, keys = fields[0], fields[1], fields[2:]
        full = os.path.join(rootfs, path.lstrip("/"))
        checked += 1

        def fail(msg):
            failures.append("%s:%d: %s: %s" % (expect_path, lineno, path, msg))

        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            if kind != "absent":
                fail("missing")
            continue
        if kind == "absent":
            fail("exists but must be absent")
            continue
        got_kind = KIND_OF.get(stat.S_IFMT(st.st_mode), "unknown")
        if got_kind != kind:
            fail("is a %s, want %s" % (got_kind, kind))
            continue
        for kv in keys:
            key, _, want = kv.partition("=")
            if key == "mode":
                got = "%04o" % stat.S_IMODE(st.st_mode)
            elif key == "uid":
                got = str(st.st_uid)
            elif key == "gid":
                got = str(st.st_gid)
            elif key == "size":
                got = str(st.st_size)
            elif key == "nlink":
                got = str(st.st_nlink)
            elif key == "mtime":
                got = str(int(st.st_mtime))
            elif key == "sha256":
                with open(full, "rb") as fh:
                    got = sha256_hex(fh.read())
            elif key == "target":
                got = os.readlink(full)
            elif key == "dev":
                got = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
            elif key == "samefile":
                try:
                    other = os.lstat(os.path.join(rootfs, want.lstrip("/")))
                    got = want if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino) else "another inode"
                except OSError as e:
                    got = "error: %s" % e
            elif key == "xattr":
                name, _, want = want.partition("=")
                try:
                    got = os.getxattr(full, name, follow_symlinks=False).decode(errors="replace")
                except OSError as e:
                    got = "error: %s" % e
                key = "xattr " + name
            else:
                fail("unknown key %r in expectation" % key)
                continue
            if got != want:
                fail("%s is %s, want %s" % (key, got, want))
    for msg in failures:
        print(msg)
    print("check-expect: %d paths checked, %d failures" % (checked, len(failures)))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--busybox-root", required=True)
    b.add_argument("--out", required=True)
    sub.add_parser("refs")
    sub.add_parser("expect")
    c = sub.add_parser("check-expect")
    c.add_argument("rootfs")
    c.add_argument("expect")
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.busybox_root, args.out)
    elif args.cmd == "refs":
        print("\n".join(REFS))
    elif args.cmd == "expect":
        sys.stdout.write(layers_expect())
    elif args.cmd == "check-expect":
        sys.exit(check_expect(args.rootfs, args.expect))


if __name__ == "__main__":
    main()
