//! Unit tests of the layer unpacker: real tars, real files, escapes refused.

#![allow(clippy::unwrap_used)]

use super::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::atomic::{AtomicU64, Ordering};
use tar::{Builder, EntryType, Header};

const MTIME: u64 = 1_600_000_000;

fn unique(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "berth-unpack-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `/tmp/berth-unpack-<tag>-<pid>-<n>/layer` is the destination; the directory around it
/// catches (and lets tests detect) anything that would escape one level up.
struct TestDir {
    root: PathBuf,
}

impl TestDir {
    fn new(tag: &str) -> Self {
        let root = Path::new("/tmp").join(unique(tag));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("layer")).unwrap();
        Self { root }
    }

    fn layer(&self) -> PathBuf {
        self.root.join("layer")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.layer().join(rel)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn header(kind: EntryType, mode: u32, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(MTIME);
    header
}

fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

struct Layer(Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(Builder::new(Vec::new()))
    }

    fn file(self, path: &str, data: &[u8]) -> Self {
        self.file_with(path, data, 0o644, 0, 0)
    }

    fn file_with(mut self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> Self {
        let mut header = header(EntryType::Regular, mode, data.len() as u64);
        header.set_uid(uid);
        header.set_gid(gid);
        self.0.append_data(&mut header, path, data).unwrap();
        self
    }

    fn dir(mut self, path: &str, mode: u32) -> Self {
        let mut header = header(EntryType::Directory, mode, 0);
        self.0.append_data(&mut header, path, io::empty()).unwrap();
        self
    }

    fn link(mut self, kind: EntryType, path: &str, target: &str, uid: u64) -> Self {
        let mut header = header(kind, 0o777, 0);
        header.set_uid(uid);
        if target.len() <= 100 {
            header.set_link_name_literal(target).unwrap();
            self.0.append_data(&mut header, path, io::empty()).unwrap();
        } else {
            self.0.append_link(&mut header, path, target).unwrap();
        }
        self
    }

    fn symlink(self, path: &str, target: &str) -> Self {
        self.link(EntryType::Symlink, path, target, 0)
    }

    fn hardlink(self, path: &str, target: &str) -> Self {
        self.link(EntryType::Link, path, target, 0)
    }

    fn device(mut self, kind: EntryType, path: &str, mode: u32, major: u32, minor: u32) -> Self {
        let mut header = header(kind, mode, 0);
        header.set_device_major(major).unwrap();
        header.set_device_minor(minor).unwrap();
        self.0.append_data(&mut header, path, io::empty()).unwrap();
        self
    }

    fn pax(mut self, records: &[(&str, &[u8])]) -> Self {
        let data: Vec<u8> = records
            .iter()
            .flat_map(|(key, value)| pax_record(key, value))
            .collect();
        let mut header = header(EntryType::XHeader, 0o644, data.len() as u64);
        self.0
            .append_data(&mut header, "PaxHeaders/entry", data.as_slice())
            .unwrap();
        self
    }

    /// A header written byte for byte, bypassing the builder's path checks.
    fn raw(mut self, name: &[u8], kind: EntryType, data: &[u8], link: &[u8]) -> Self {
        let mut header = header(kind, 0o644, data.len() as u64);
        let old = header.as_old_mut();
        old.name = [0; 100];
        old.name[..name.len()].copy_from_slice(name);
        old.linkname = [0; 100];
        old.linkname[..link.len()].copy_from_slice(link);
        header.set_cksum();
        self.0.append(&header, data).unwrap();
        self
    }

    fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zstd_compress(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn unpack_tar_bytes(tar: &[u8], dest: &Path) -> Result<UnpackStats, UnpackError> {
    unpack_layer(tar, Compression::None, dest)
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let n = rfs::lgetxattr(path, name, &mut buf[..]).ok()?;
    buf.truncate(n);
    Some(buf)
}

fn assert_escape(result: Result<UnpackStats, UnpackError>, entry: &str, reason: &str) {
    match result {
        Err(UnpackError::Escape {
            entry: got_entry,
            reason: got_reason,
        }) => {
            assert_eq!(got_entry, entry);
            assert!(
                got_reason.contains(reason),
                "{got_reason:?} lacks {reason:?}"
            );
        }
        other => panic!("expected an Escape error, got {other:?}"),
    }
}

#[test]
fn regular_file_content_mode_owner_mtime() {
    let dir = TestDir::new("file");
    let tar = Layer::new()
        .file_with("etc/app.conf", b"hello world", 0o640, 1000, 1001)
        .finish();
    let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(
        stats,
        UnpackStats {
            entries: 1,
            bytes: 11
        }
    );
    let path = dir.path("etc/app.conf");
    assert_eq!(fs::read(&path).unwrap(), b"hello world");
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!((meta.uid(), meta.gid()), (1000, 1001));
    assert_eq!(meta.mtime(), MTIME as i64);
    // The parent was not listed: created 0755 root:root.
    let parent = fs::symlink_metadata(dir.path("etc")).unwrap();
    assert_eq!(parent.mode() & 0o7777, 0o755);
    assert_eq!((parent.uid(), parent.gid()), (0, 0));
}

#[test]
fn directory_mode_0700_and_mtime_set_after_children() {
    let dir = TestDir::new("dir");
    let tar = Layer::new()
        .dir("secret/", 0o700)
        .file("secret/key", b"k")
        .dir("secret/sub/", 0o750)
        .file("secret/sub/deeper", b"d")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    for (rel, mode) in [("secret", 0o700), ("secret/sub", 0o750)] {
        let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, mode, "{rel}");
        assert_eq!(meta.mtime(), MTIME as i64, "{rel}");
    }
}

#[test]
fn setuid_setgid_sticky_preserved() {
    let dir = TestDir::new("suid");
    let tar = Layer::new()
        .file_with("bin/su", b"x", 0o4755, 0, 0)
        .file_with("bin/tool", b"y", 0o6750, 1000, 1000)
        .dir("tmp/", 0o1777)
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    let mode = |rel: &str| fs::symlink_metadata(dir.path(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("bin/su"), 0o4755);
    // Owned by a non-root user: chown would have cleared the bits had chmod come first.
    assert_eq!(mode("bin/tool"), 0o6750);
    assert_eq!(mode("tmp"), 0o1777);
}

#[test]
fn symlinks_relative_and_absolute_created_verbatim() {
    let dir = TestDir::new("symlink");
    let tar = Layer::new()
        .file("bin/busybox", b"bb")
        .symlink("bin/sh", "busybox")
        .symlink("bin/ls", "/bin/busybox")
        .symlink("up", "../../..")
        .link(EntryType::Symlink, "owned", "/nowhere", 1000)
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    for (rel, target) in [
        ("bin/sh", "busybox"),
        ("bin/ls", "/bin/busybox"),
        ("up", "../../.."),
        ("owned", "/nowhere"),
    ] {
        let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
        assert!(meta.file_type().is_symlink(), "{rel}");
        assert_eq!(fs::read_link(dir.path(rel)).unwrap(), Path::new(target));
        assert_eq!(meta.mtime(), MTIME as i64, "{rel}");
    }
    assert_eq!(fs::symlink_metadata(dir.path("owned")).unwrap().uid(), 1000);
}

#[test]
fn hard_links_share_the_inode() {
    let dir = TestDir::new("hardlink");
    let tar = Layer::new()
        .file("usr/bin/python3.11", b"interpreter")
        .hardlink("usr/bin/python3", "usr/bin/python3.11")
        .hardlink("other/py", "/usr/bin/python3.11")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    let a = fs::symlink_metadata(dir.path("usr/bin/python3.11")).unwrap();
    let b = fs::symlink_metadata(dir.path("usr/bin/python3")).unwrap();
    let c = fs::symlink_metadata(dir.path("other/py")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.ino(), c.ino());
    assert_eq!(a.nlink(), 3);
}

#[test]
fn hard_link_to_a_missing_target_is_invalid() {
    let dir = TestDir::new("hardlink-missing");
    let tar = Layer::new().hardlink("b", "not/here").finish();
    match unpack_tar_bytes(&tar, &dir.layer()) {
        Err(UnpackError::Invalid { entry, reason }) => {
            assert_eq!(entry, "b");
            assert!(reason.contains("does not exist"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn char_device_and_fifo() {
    let dir = TestDir::new("nodes");
    let tar = Layer::new()
        .device(EntryType::Char, "dev/null", 0o666, 1, 3)
        .device(EntryType::Block, "dev/loop0", 0o660, 7, 0)
        .device(EntryType::Fifo, "run/fifo", 0o600, 0, 0)
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    let null = fs::symlink_metadata(dir.path("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!((rfs::major(null.rdev()), rfs::minor(null.rdev())), (1, 3));
    assert_eq!(null.mode() & 0o7777, 0o666);
    let lp = fs::symlink_metadata(dir.path("dev/loop0")).unwrap();
    assert!(lp.file_type().is_block_device());
    assert_eq!((rfs::major(lp.rdev()), rfs::minor(lp.rdev())), (7, 0));
    let fifo = fs::symlink_metadata(dir.path("run/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.mode() & 0o7777, 0o600);
    assert_eq!(fifo.mtime(), MTIME as i64);
}

#[test]
fn xattrs_from_pax_records() {
    let dir = TestDir::new("xattr");
    let tar = Layer::new()
        .pax(&[
            ("SCHILY.xattr.user.berth", b"hello"),
            ("SCHILY.xattr.trusted.overlay.redirect", b"/elsewhere"),
        ])
        .file("f", b"data")
        .pax(&[("SCHILY.xattr.user.dir", b"d")])
        .dir("d/", 0o755)
        .pax(&[("SCHILY.xattr.user.link", b"l")])
        .symlink("l", "f")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(
        xattr(&dir.path("f"), "user.berth").as_deref(),
        Some(&b"hello"[..])
    );
    assert_eq!(
        xattr(&dir.path("d"), "user.dir").as_deref(),
        Some(&b"d"[..])
    );
    // overlayfs-private xattrs are never taken from a layer.
    assert_eq!(xattr(&dir.path("f"), "trusted.overlay.redirect"), None);
    // user.* is not allowed on symlinks: skipped with a warning, the link is still made.
    assert!(
        fs::symlink_metadata(dir.path("l"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn pax_subsecond_mtime() {
    let dir = TestDir::new("pax-mtime");
    let tar = Layer::new()
        .pax(&[("mtime", b"1600000000.25")])
        .file("f", b"x")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    let meta = fs::symlink_metadata(dir.path("f")).unwrap();
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_600_000_000, 250_000_000)
    );
}

#[test]
fn parse_pax_times() {
    let t = |s: &str| parse_pax_time(s.as_bytes()).map(|t| (t.tv_sec, t.tv_nsec));
    assert_eq!(t("10"), Some((10, 0)));
    assert_eq!(t("1.5"), Some((1, 500_000_000)));
    assert_eq!(t("-1.5"), Some((-2, 500_000_000)));
    assert_eq!(t("-3"), Some((-3, 0)));
    assert_eq!(t("0.1234567891"), Some((0, 123_456_789)));
    assert_eq!(t(""), None);
    assert_eq!(t("1e9"), None);
}

#[test]
fn whiteouts_become_char_0_0() {
    let dir = TestDir::new("whiteout");
    let tar = Layer::new()
        .file("etc/.wh.passwd", b"")
        .file(".wh.gone", b"")
        .finish();
    let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(stats.entries, 2);
    for rel in ["etc/passwd", "gone"] {
        let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
        assert!(meta.file_type().is_char_device(), "{rel}");
        assert_eq!(meta.rdev(), 0, "{rel}");
    }
    assert!(fs::symlink_metadata(dir.path("etc/.wh.passwd")).is_err());
    assert!(fs::symlink_metadata(dir.path(".wh.gone")).is_err());
}

#[test]
fn opaque_marker_before_and_after_its_directory() {
    let dir = TestDir::new("opaque");
    let tar = Layer::new()
        .file("before/.wh..wh..opq", b"")
        .dir("before/", 0o750)
        .dir("after/", 0o755)
        .file("after/.wh..wh..opq", b"")
        .file("implicit/deep/.wh..wh..opq", b"")
        .file(".wh..wh.plnk/12.34", b"aufs")
        .file(".wh..wh.aufs", b"")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    for rel in ["before", "after", "implicit/deep"] {
        assert_eq!(
            xattr(&dir.path(rel), OPAQUE_XATTR).as_deref(),
            Some(&b"y"[..]),
            "{rel}"
        );
        assert!(fs::symlink_metadata(dir.path(rel).join(".wh..wh..opq")).is_err());
    }
    assert_eq!(
        fs::symlink_metadata(dir.path("before")).unwrap().mode() & 0o7777,
        0o750
    );
    assert!(fs::symlink_metadata(dir.path(".wh..wh.plnk")).is_err());
    assert!(fs::symlink_metadata(dir.path(".wh..wh.aufs")).is_err());
}

#[test]
fn same_path_twice_later_wins() {
    let dir = TestDir::new("twice");
    let tar = Layer::new()
        .file("x", b"one")
        .file("x", b"two")
        .file("y", b"file")
        .dir("y/", 0o700)
        .dir("z/", 0o755)
        .file("z/child", b"c")
        .file("z", b"now a file")
        .symlink("s", "/tmp")
        .file("s", b"regular")
        .dir("m/", 0o700)
        .file("m/kept", b"k")
        .dir("m/", 0o751)
        .file("w", b"w")
        .file(".wh.w", b"")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(fs::read(dir.path("x")).unwrap(), b"two");
    assert!(fs::symlink_metadata(dir.path("y")).unwrap().is_dir());
    assert_eq!(fs::read(dir.path("z")).unwrap(), b"now a file");
    let s = fs::symlink_metadata(dir.path("s")).unwrap();
    assert!(s.file_type().is_file());
    assert_eq!(fs::read(dir.path("s")).unwrap(), b"regular");
    assert_eq!(fs::read(dir.path("m/kept")).unwrap(), b"k");
    assert_eq!(
        fs::symlink_metadata(dir.path("m")).unwrap().mode() & 0o7777,
        0o751
    );
    assert!(
        fs::symlink_metadata(dir.path("w"))
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn plain_gzip_and_zstd() {
    let tar = Layer::new()
        .dir("app/", 0o755)
        .file("app/data", &vec![7u8; 300_000])
        .finish();
    for (compression, blob) in [
        (Compression::None, tar.clone()),
        (Compression::Gzip, gzip(&tar)),
        (Compression::Zstd, zstd_compress(&tar)),
    ] {
        let dir = TestDir::new("formats");
        let stats = unpack_layer(blob.as_slice(), compression, &dir.layer()).unwrap();
        assert_eq!(
            stats,
            UnpackStats {
                entries: 2,
                bytes: 300_000
            }
        );
        assert_eq!(fs::read(dir.path("app/data")).unwrap(), vec![7u8; 300_000]);
    }
}

#[test]
fn concatenated_gzip_members() {
    let tar = Layer::new().file("a", b"a").finish();
    let (head, tail) = tar.split_at(700);
    let mut blob = gzip(head);
    blob.extend(gzip(tail));
    let dir = TestDir::new("multigz");
    unpack_layer(blob.as_slice(), Compression::Gzip, &dir.layer()).unwrap();
    assert_eq!(fs::read(dir.path("a")).unwrap(), b"a");
}

#[test]
fn media_types() {
    let cases = [
        (
            "application/vnd.oci.image.layer.v1.tar",
            Some(Compression::None),
        ),
        (
            "application/vnd.oci.image.layer.v1.tar+gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.oci.image.layer.v1.tar+zstd",
            Some(Compression::Zstd),
        ),
        (
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
            Some(Compression::Gzip),
        ),
        (
            "Application/VND.oci.image.layer.v1.tar+gzip; x=y",
            Some(Compression::Gzip),
        ),
        ("application/vnd.oci.image.config.v1+json", None),
        ("application/vnd.oci.image.layer.v1.tar+encrypted", None),
    ];
    for (media_type, expected) in cases {
        assert_eq!(
            Compression::from_media_type(media_type),
            expected,
            "{media_type}"
        );
    }
}

#[test]
fn long_names_and_long_link_targets() {
    let dir = TestDir::new("long");
    let long_dir = format!("{}/{}", "d".repeat(80), "e".repeat(80));
    let long_file = format!("{long_dir}/{}", "f".repeat(120));
    let long_target = format!("/{}", "t".repeat(150));
    let pax_path = format!("{}/pax-{}", "p".repeat(90), "q".repeat(60));
    let tar = Layer::new()
        .file(&long_file, b"gnu long name")
        .symlink("long-link", &long_target)
        .hardlink("long-hard", &long_file)
        .pax(&[("path", pax_path.as_bytes())])
        .file("short-placeholder", b"pax path")
        .pax(&[("linkpath", long_target.as_bytes())])
        .symlink("pax-link", "short")
        .finish();
    unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(fs::read(dir.path(&long_file)).unwrap(), b"gnu long name");
    assert_eq!(
        fs::read_link(dir.path("long-link")).unwrap(),
        Path::new(&long_target)
    );
    assert_eq!(
        fs::symlink_metadata(dir.path("long-hard")).unwrap().ino(),
        fs::symlink_metadata(dir.path(&long_file)).unwrap().ino()
    );
    assert_eq!(fs::read(dir.path(&pax_path)).unwrap(), b"pax path");
    assert!(fs::symlink_metadata(dir.path("short-placeholder")).is_err());
    assert_eq!(
        fs::read_link(dir.path("pax-link")).unwrap(),
        Path::new(&long_target)
    );
}

#[test]
fn root_entry_sets_layer_root_metadata() {
    let dir = TestDir::new("root");
    let tar = Layer::new().dir("./", 0o751).file("./a", b"a").finish();
    let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(stats.entries, 2);
    let meta = fs::symlink_metadata(dir.layer()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o751);
    assert_eq!(meta.mtime(), MTIME as i64);
    assert_eq!(fs::read(dir.path("a")).unwrap(), b"a");
}

#[test]
fn pax_global_headers_are_skipped() {
    let dir = TestDir::new("global");
    let mut layer = Layer::new();
    let data = pax_record("comment", b"built by test");
    let mut header = header(EntryType::XGlobalHeader, 0o644, data.len() as u64);
    layer
        .0
        .append_data(&mut header, "pax_global_header", data.as_slice())
        .unwrap();
    let tar = layer.file("a", b"a").finish();
    let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(stats.entries, 1);
    assert!(fs::symlink_metadata(dir.path("pax_global_header")).is_err());
}

#[test]
fn dotdot_paths_are_refused() {
    for name in [
        &b"../escape"[..],
        b"a/../../escape",
        b"/../escape",
        b"./../escape",
        b"a/../b",
    ] {
        let dir = TestDir::new("dotdot");
        let tar = Layer::new()
            .raw(name, EntryType::Regular, b"pwned", b"")
            .finish();
        let entry = String::from_utf8_lossy(name);
        assert_escape(unpack_tar_bytes(&tar, &dir.layer()), &entry, "`..`");
        assert!(!dir.root.join("escape").exists());
        assert!(!dir.path("b").exists());
        assert!(!Path::new("/escape").exists());
    }
}

#[test]
fn hard_link_out_of_the_layer_is_refused() {
    let dir = TestDir::new("hardlink-escape");
    let tar = Layer::new()
        .raw(b"passwd", EntryType::Link, b"", b"../../etc/passwd")
        .finish();
    assert_escape(unpack_tar_bytes(&tar, &dir.layer()), "passwd", "`..`");
    assert!(fs::symlink_metadata(dir.path("passwd")).is_err());

    let dir = TestDir::new("hardlink-escape-symlink");
    let tar = Layer::new()
        .symlink("etc", "/etc")
        .hardlink("passwd", "etc/passwd")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        "passwd",
        "parent component etc is a symlink",
    );
    assert!(fs::symlink_metadata(dir.path("passwd")).is_err());
}

#[test]
fn entry_below_an_absolute_symlink_is_refused() {
    let dir = TestDir::new("symlink-escape");
    let victim = unique("escape-victim");
    let tar = Layer::new()
        .symlink("evil", "/tmp")
        .file(&format!("evil/{victim}"), b"pwned")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        &format!("evil/{victim}"),
        "parent component evil is a symlink",
    );
    assert!(!Path::new("/tmp").join(&victim).exists());
}

#[test]
fn entry_below_a_relative_symlink_is_refused() {
    let dir = TestDir::new("symlink-escape-rel");
    let tar = Layer::new()
        .symlink("evil", "..")
        .file("evil/x", b"pwned")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        "evil/x",
        "parent component evil is a symlink",
    );
    assert!(!dir.root.join("x").exists());
}

#[test]
fn directory_replaced_by_symlink_then_child_is_refused() {
    let dir = TestDir::new("symlink-swap");
    let victim = unique("escape-victim");
    let tar = Layer::new()
        .dir("d/", 0o755)
        .file("d/ok", b"fine")
        .symlink("d", "/tmp")
        .file(&format!("d/{victim}"), b"pwned")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        &format!("d/{victim}"),
        "parent component d is a symlink",
    );
    assert!(!Path::new("/tmp").join(&victim).exists());
}

#[test]
fn whiteout_and_opaque_below_a_symlink_are_refused() {
    let outside = TestDir::new("outside");
    fs::write(outside.path("keep"), b"keep").unwrap();
    let target = outside.layer();
    let target = target.to_str().unwrap();

    let dir = TestDir::new("whiteout-escape");
    let tar = Layer::new()
        .symlink("evil", target)
        .file("evil/.wh.keep", b"")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        "evil/.wh.keep",
        "parent component evil is a symlink",
    );
    assert_eq!(fs::read(outside.path("keep")).unwrap(), b"keep");

    let dir = TestDir::new("opaque-escape");
    let tar = Layer::new()
        .symlink("evil", target)
        .file("evil/.wh..wh..opq", b"")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        "evil/.wh..wh..opq",
        "parent component evil is a symlink",
    );
    assert_eq!(xattr(&outside.layer(), OPAQUE_XATTR), None);

    let dir = TestDir::new("whiteout-dotdot");
    let tar = Layer::new()
        .raw(b"a/.wh...", EntryType::Regular, b"", b"")
        .finish();
    assert_escape(
        unpack_tar_bytes(&tar, &dir.layer()),
        "a/.wh...",
        "whiteout of `..`",
    );
}

#[test]
fn non_directory_parent_is_invalid() {
    let dir = TestDir::new("file-parent");
    let tar = Layer::new().file("f", b"x").file("f/y", b"y").finish();
    match unpack_tar_bytes(&tar, &dir.layer()) {
        Err(UnpackError::Invalid { entry, .. }) => assert_eq!(entry, "f/y"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncated_or_damaged_gzip_fails_cleanly() {
    let tar = Layer::new()
        .file(
            "a",
            &(0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )
        .file("b", b"tail")
        .finish();
    let blob = gzip(&tar);
    let mut cuts = vec![
        0,
        5,
        10,
        100,
        blob.len() / 2,
        blob.len() - 8,
        blob.len() - 1,
    ];
    cuts.dedup();
    for cut in cuts {
        let dir = TestDir::new("truncated");
        match unpack_layer(&blob[..cut], Compression::Gzip, &dir.layer()) {
            Err(UnpackError::Corrupt { .. }) => {}
            other => panic!("cut at {cut}: expected Corrupt, got {other:?}"),
        }
    }
    let mut damaged = blob.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x55;
    let dir = TestDir::new("damaged");
    assert!(matches!(
        unpack_layer(damaged.as_slice(), Compression::Gzip, &dir.layer()),
        Err(UnpackError::Corrupt { .. })
    ));
    let dir = TestDir::new("garbage");
    assert!(matches!(
        unpack_layer(
            &b"this is not gzip at all"[..],
            Compression::Gzip,
            &dir.layer()
        ),
        Err(UnpackError::Corrupt { .. })
    ));
    let dir = TestDir::new("zstd-truncated");
    let blob = zstd_compress(&tar);
    assert!(matches!(
        unpack_layer(&blob[..blob.len() / 2], Compression::Zstd, &dir.layer()),
        Err(UnpackError::Corrupt { .. })
    ));
}

#[test]
fn truncated_plain_tar_fails_cleanly() {
    let tar = Layer::new().file("big", &vec![1u8; 10_000]).finish();
    let dir = TestDir::new("truncated-tar");
    match unpack_tar_bytes(&tar[..2_000], &dir.layer()) {
        Err(UnpackError::Corrupt { context, .. }) => assert!(context.contains("big")),
        other => panic!("{other:?}"),
    }
    let dir = TestDir::new("truncated-header");
    assert!(matches!(
        unpack_tar_bytes(&tar[..300], &dir.layer()),
        Err(UnpackError::Corrupt { .. })
    ));
}

#[test]
fn source_read_errors_are_read_errors() {
    struct Failing<'a>(&'a [u8]);
    impl Read for Failing<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "network down",
                ));
            }
            let n = self.0.read(buf)?;
            Ok(n)
        }
    }
    let tar = Layer::new().file("a", &vec![3u8; 100_000]).finish();
    let blob = gzip(&tar);
    let dir = TestDir::new("read-error");
    match unpack_layer(
        Failing(&blob[..blob.len() / 2]),
        Compression::Gzip,
        &dir.layer(),
    ) {
        Err(UnpackError::Read { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::ConnectionReset)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn diff_id_is_the_sha256_of_the_uncompressed_tar() {
    let tar = Layer::new().file("a", b"content").dir("d/", 0o755).finish();
    let expected = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
    let dir = TestDir::new("diffid");
    let (stats, diff_id) =
        unpack_layer_with_diff_id(gzip(&tar).as_slice(), Compression::Gzip, &dir.layer(), None)
            .unwrap();
    assert_eq!(stats.entries, 2);
    assert_eq!(diff_id, expected);
}

#[test]
fn missing_destination_is_reported() {
    let dir = TestDir::new("nodest");
    let tar = Layer::new().file("a", b"a").finish();
    assert!(matches!(
        unpack_tar_bytes(&tar, &dir.root.join("absent")),
        Err(UnpackError::Destination { .. })
    ));
}

#[test]
fn error_messages_carry_entry_and_operation() {
    let dir = TestDir::new("message");
    let tar = Layer::new()
        .raw(b"dev/bad", EntryType::new(b'V'), b"", b"")
        .finish();
    let err = unpack_tar_bytes(&tar, &dir.layer()).unwrap_err();
    assert!(err.to_string().contains("dev/bad"), "{err}");
    let err = UnpackError::Io {
        entry: "usr/bin/x".into(),
        op: "chown".into(),
        source: io::Error::from(io::ErrorKind::PermissionDenied),
    };
    assert_eq!(
        err.to_string(),
        "layer entry usr/bin/x: chown: permission denied"
    );
}

#[test]
fn gnu_sparse_file_is_expanded() {
    let dir = TestDir::new("sparse");
    let source = dir.root.join("sparse-source");
    let file = File::create(&source).unwrap();
    file.set_len(4 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&file, b"middle", 2 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&file, b"end", (4 << 20) - 3).unwrap();
    drop(file);
    let mut builder = Builder::new(Vec::new());
    builder.sparse(true);
    builder.append_path_with_name(&source, "holes").unwrap();
    let tar = builder.into_inner().unwrap();
    let kind = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .header()
        .entry_type();
    assert!(kind.is_gnu_sparse(), "{kind:?}");
    let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
    assert_eq!(stats.bytes, 4 << 20);
    assert_eq!(
        fs::read(dir.path("holes")).unwrap(),
        fs::read(&source).unwrap()
    );
}

#[test]
fn far_future_and_epoch_mtimes() {
    let dir = TestDir::new("mtimes");
    let mut layer = Layer::new();
    for (name, mtime) in [("epoch", 0u64), ("future", 1 << 33), ("huge", 1 << 62)] {
        let mut header = header(EntryType::Regular, 0o644, 1);
        header.set_mtime(mtime);
        layer.0.append_data(&mut header, name, &b"x"[..]).unwrap();
    }
    unpack_tar_bytes(&layer.finish(), &dir.layer()).unwrap();
    assert_eq!(fs::symlink_metadata(dir.path("epoch")).unwrap().mtime(), 0);
    assert_eq!(
        fs::symlink_metadata(dir.path("future")).unwrap().mtime(),
        1 << 33
    );
    assert!(fs::symlink_metadata(dir.path("huge")).is_ok());
}

#[test]
fn worker_failure_stops_the_decompressor() {
    // The first entry is refused; the rest of a large stream must not be needed.
    let mut layer = Layer::new().raw(b"../escape", EntryType::Regular, b"x", b"");
    let mut seed = 1u64;
    let noise: Vec<u8> = (0..(16 << 20))
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 56) as u8
        })
        .collect();
    layer = layer.file("big", &noise);
    let blob = gzip(&layer.finish());
    let dir = TestDir::new("early-failure");
    let started = std::time::Instant::now();
    assert_escape(
        unpack_layer(blob.as_slice(), Compression::Gzip, &dir.layer()),
        "../escape",
        "`..`",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn single_thread_fallback_path() {
    let tar = Layer::new()
        .dir("d/", 0o750)
        .file("d/f", b"fallback")
        .symlink("l", "/d/f")
        .finish();
    let dir = TestDir::new("fallback");
    let mut hasher = Sha256::new();
    let stream = DigestReader {
        inner: tar.as_slice(),
        hasher: Some(&mut hasher),
    };
    let stats = unpack_tar(stream, &dir.layer(), None, 0, &AtomicBool::new(false)).unwrap();
    assert_eq!(
        stats,
        UnpackStats {
            entries: 3,
            bytes: 8
        }
    );
    assert_eq!(fs::read(dir.path("d/f")).unwrap(), b"fallback");
    assert_eq!(
        hasher.finalize().as_slice(),
        Sha256::digest(&tar).as_slice()
    );
}

#[test]
fn overlayfs_honours_whiteouts_and_opaque_dirs() {
    let dir = TestDir::new("overlay");
    let lower = dir.root.join("lower");
    let upper = dir.layer();
    let merged = dir.root.join("merged");
    for d in [&lower, &merged] {
        fs::create_dir_all(d).unwrap();
    }
    let base = Layer::new()
        .dir("etc/", 0o755)
        .file("etc/passwd", b"root")
        .file("etc/shadow", b"secret")
        .dir("cache/", 0o755)
        .file("cache/old", b"old")
        .finish();
    unpack_layer(gzip(&base).as_slice(), Compression::Gzip, &lower).unwrap();
    let diff = Layer::new()
        .dir("etc/", 0o755)
        .file("etc/.wh.shadow", b"")
        .dir("cache/", 0o755)
        .file("cache/.wh..wh..opq", b"")
        .file("cache/new", b"new")
        .finish();
    unpack_layer(zstd_compress(&diff).as_slice(), Compression::Zstd, &upper).unwrap();
    // Two lower layers, no upper: a read-only overlay, as a container image is stacked.
    let options = format!("lowerdir={}:{}", upper.display(), lower.display());
    let status = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        eprintln!("skipping: cannot mount overlayfs here ({status:?})");
        return;
    }
    let read = |rel: &str| fs::read(merged.join(rel)).ok();
    let outcome = (
        read("etc/passwd"),
        read("etc/shadow"),
        read("cache/old"),
        read("cache/new"),
    );
    let _ = std::process::Command::new("umount").arg(&merged).status();
    assert_eq!(
        outcome,
        (Some(b"root".to_vec()), None, None, Some(b"new".to_vec()))
    );
}

/// Throughput of decompress + unpack on a generated ~200 MiB layer of mixed files.
///
/// `cargo test --release -- --ignored --nocapture bench_unpack_throughput`; set
/// `BERTH_UNPACK_BENCH_DIR` to keep the generated layer files (for a `tar xzf` baseline),
/// `BERTH_UNPACK_BENCH_OUT` to unpack on another filesystem (e.g. /dev/shm) and
/// `BERTH_UNPACK_BENCH_MIB` to change the size. Outputs are only removed at the end: on a
/// filesystem mounted with `discard`, deleting between runs slows the next run down.
#[test]
#[ignore = "benchmark; run explicitly in a release build"]
fn bench_unpack_throughput() {
    use std::time::Instant;

    let scratch = TestDir::new("bench");
    let dir = std::env::var_os("BERTH_UNPACK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| scratch.root.clone());
    let out_root = std::env::var_os("BERTH_UNPACK_BENCH_OUT")
        .map(|p| PathBuf::from(p).join(unique("bench-out")))
        .unwrap_or_else(|| scratch.root.join("out"));
    let mib: u64 = std::env::var("BERTH_UNPACK_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    fs::create_dir_all(&dir).unwrap();
    let tar_path = dir.join("layer.tar");
    let gz_path = dir.join("layer.tar.gz");
    let zst_path = dir.join("layer.tar.zst");
    if !tar_path.exists() || !gz_path.exists() || !zst_path.exists() {
        let started = Instant::now();
        generate_layer(&tar_path, mib << 20);
        let tar = fs::read(&tar_path).unwrap();
        fs::write(&gz_path, gzip(&tar)).unwrap();
        fs::write(&zst_path, zstd_compress(&tar)).unwrap();
        eprintln!("generated layer in {:.1?}", started.elapsed());
    }
    let size = |p: &Path| fs::metadata(p).unwrap().len();
    let tar_len = size(&tar_path);
    eprintln!(
        "layer: tar {:.1} MiB, gzip {:.1} MiB, zstd {:.1} MiB",
        tar_len as f64 / 1048576.0,
        size(&gz_path) as f64 / 1048576.0,
        size(&zst_path) as f64 / 1048576.0
    );
    let mib_s = |bytes: u64, secs: f64| bytes as f64 / 1048576.0 / secs;

    for (label, path, compression) in [
        ("gzip", &gz_path, Compression::Gzip),
        ("zstd", &zst_path, Compression::Zstd),
        ("plain", &tar_path, Compression::None),
    ] {
        // Decompression alone, for reference.
        let started = Instant::now();
        let file = File::open(path).unwrap();
        let source = BufReader::with_capacity(STREAM_BUFFER, file);
        let n = match compression {
            Compression::None => io::copy(&mut { source }, &mut io::sink()).unwrap(),
            Compression::Gzip => io::copy(
                &mut flate2::bufread::MultiGzDecoder::new(source),
                &mut io::sink(),
            )
            .unwrap(),
            Compression::Zstd => io::copy(
                &mut zstd::stream::read::Decoder::with_buffer(source).unwrap(),
                &mut io::sink(),
            )
            .unwrap(),
        };
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{label:>5} decompress only: {:7.1} MiB/s of tar",
            mib_s(n, secs)
        );
        let mut best = f64::MAX;
        for run in 0..3 {
            let out = out_root.join(format!("{label}-{run}"));
            fs::create_dir_all(&out).unwrap();
            let started = Instant::now();
            let stats = unpack_layer(File::open(path).unwrap(), compression, &out).unwrap();
            let secs = started.elapsed().as_secs_f64();
            best = best.min(secs);
            eprintln!(
                "{label:>5} unpack run {run}: {secs:.2} s, {:7.1} MiB/s of tar, {:7.1} MiB/s compressed, {} entries",
                mib_s(tar_len, secs),
                mib_s(size(path), secs),
                stats.entries
            );
        }
        eprintln!(
            "{label:>5} unpack best: {:7.1} MiB/s of tar",
            mib_s(tar_len, best)
        );
    }
    let _ = fs::remove_dir_all(&out_root);
}

/// Writes a tar of about `target` bytes shaped like a distro/runtime layer: mostly small
/// files (average about 25 KiB, a few up to 8 MiB) in a few hundred directories, with
/// text-like, binary-like and incompressible content.
fn generate_layer(path: &Path, target: u64) {
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let words: Vec<Vec<u8>> = (0..2048)
        .map(|_| {
            let len = 2 + rng.below(9);
            (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
        })
        .collect();
    let out = io::BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
    let mut builder = Builder::new(out);
    let mut written = 0u64;
    let mut index = 0u64;
    let mut current_dir = String::new();
    while written < target {
        let dir = format!("usr/lib/pkg{:03}/sub{}", index / 200, (index / 25) % 8);
        if dir != current_dir {
            let mut header = header(EntryType::Directory, 0o755, 0);
            builder
                .append_data(&mut header, format!("{dir}/"), io::empty())
                .unwrap();
            current_dir = dir.clone();
        }
        let bucket = rng.below(1000);
        let size = match bucket {
            0..880 => rng.below(8 << 10),
            880..985 => (8 << 10) + rng.below(120 << 10),
            985..999 => (128 << 10) + rng.below(896 << 10),
            _ => (1 << 20) + rng.below(7 << 20),
        } as usize;
        let kind = rng.below(100);
        let mut data = Vec::with_capacity(size);
        while data.len() < size {
            match kind {
                0..45 => {
                    let word = &words[rng.below(words.len() as u64) as usize];
                    data.extend_from_slice(word);
                    data.push(if rng.below(12) == 0 { b'\n' } else { b' ' });
                }
                45..85 => {
                    let r = rng.next();
                    for i in 0..8 {
                        let b = (r >> (i * 8)) as u8;
                        data.push(match b % 4 {
                            0 => 0,
                            1 => b & 0x1f,
                            _ => b,
                        });
                    }
                }
                _ => data.extend_from_slice(&rng.next().to_le_bytes()),
            }
        }
        data.truncate(size);
        let mut header = header(EntryType::Regular, 0o644, size as u64);
        builder
            .append_data(
                &mut header,
                format!("{dir}/file{index}.bin"),
                data.as_slice(),
            )
            .unwrap();
        written += size as u64 + 512;
        index += 1;
    }
    builder.into_inner().unwrap().flush().unwrap();
}

/// Unpacks `tar` with a tape and rebuilds the stream from the tape and the files.
fn replayed(tar: &[u8], dir: &TestDir) -> Result<Vec<u8>, io::Error> {
    let tape = dir.root.join("tape");
    unpack_layer_with_diff_id(
        zstd_compress(tar).as_slice(),
        Compression::Zstd,
        &dir.layer(),
        Some(&tape),
    )
    .unwrap();
    assert_eq!(TapeReader::size(&tape).unwrap(), tar.len() as u64);
    let mut out = Vec::new();
    TapeReader::open(&tape, &dir.layer())
        .unwrap()
        .read_to_end(&mut out)?;
    Ok(out)
}

#[test]
fn a_tape_and_the_files_rebuild_the_exact_stream() {
    let long = format!("{}/file", "d".repeat(150));
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let tar = Layer::new()
        .dir("etc/", 0o755)
        .file("etc/hosts", b"127.0.0.1 localhost\n")
        .file("empty", b"")
        .file_with("bin/tool", &big, 0o4755, 7, 8)
        .file(&long, b"under a GNU long name")
        .pax(&[("SCHILY.xattr.user.k", b"v"), ("mtime", b"1600000000.5")])
        .file("x", b"with pax")
        .symlink("link", "/etc/hosts")
        .hardlink("hard", "etc/hosts")
        .device(EntryType::Char, "dev/null", 0o666, 1, 3)
        .file("gone/.wh.f", b"")
        .file("opq/.wh..wh..opq", b"")
        .finish();
    let dir = TestDir::new("tape");
    let out = replayed(&tar, &dir).unwrap();
    assert_eq!(out.len(), tar.len());
    assert!(out == tar, "the rebuilt stream differs");
    // The tape holds the headers, not the contents.
    let tape_len = fs::metadata(dir.root.join("tape")).unwrap().len();
    assert!(tape_len < 8 * 1024, "tape of {tape_len} bytes");
}

#[test]
fn a_changed_or_missing_file_fails_the_replay() {
    let tar = Layer::new()
        .file("a", b"0123456789")
        .file("b", b"x")
        .finish();
    let dir = TestDir::new("tape-changed");
    replayed(&tar, &dir).unwrap();
    fs::write(dir.path("a"), b"012345678").unwrap();
    let mut out = Vec::new();
    let err = TapeReader::open(&dir.root.join("tape"), &dir.layer())
        .unwrap()
        .read_to_end(&mut out)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("layer file a: it has 9 bytes, the layer had 10"),
        "{err}"
    );
    fs::remove_file(dir.path("a")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.path("a")).unwrap();
    let err = TapeReader::open(&dir.root.join("tape"), &dir.layer())
        .unwrap()
        .read_to_end(&mut Vec::new())
        .unwrap_err();
    assert!(
        err.to_string().contains("layer file a: opening it"),
        "{err}"
    );
    fs::write(dir.root.join("tape"), b"garbage").unwrap();
    assert!(matches!(
        TapeReader::open(&dir.root.join("tape"), &dir.layer()),
        Err(TapeError::Corrupt { .. })
    ));
}

#[test]
fn oversized_extension_records_are_refused_before_their_data() {
    let dir = TestDir::new("ext-too-large");
    // A 1.5 GiB long name declared, 4 KiB behind it: refused at its header.
    let mut tar = header(EntryType::GNULongName, 0o644, 3 << 29)
        .as_bytes()
        .to_vec();
    tar.extend_from_slice(&[b'n'; 4096]);
    match unpack_tar_bytes(&tar, &dir.layer()) {
        Err(UnpackError::ExtensionTooLarge(refused)) => {
            assert_eq!((refused.kind, refused.size), ("GNU long name", 3 << 29))
        }
        other => panic!("{other:?}"),
    }
    let value = vec![b'v'; 2 << 20];
    let tar = Layer::new()
        .pax(&[("SCHILY.xattr.user.big", &value)])
        .file("f", b"x")
        .finish();
    assert!(matches!(
        unpack_tar_bytes(&tar, &dir.layer()),
        Err(UnpackError::ExtensionTooLarge(_))
    ));
}

#[test]
fn a_layer_past_its_size_limit_is_refused() {
    let tar = Layer::new()
        .file("small", &[1u8; 1000])
        .file("big", &vec![0u8; 64 * 1024])
        .finish();
    let blob = zstd_compress(&tar);
    let dir = TestDir::new("too-large");
    match unpack_layer_limited(&blob[..], Compression::Zstd, &dir.layer(), None, 32 * 1024) {
        Err(UnpackError::TooLarge { entry, limit }) => {
            assert_eq!((entry.as_str(), limit), ("big", 32 * 1024));
        }
        other => panic!("{other:?}"),
    }
    // Refused before it was created.
    assert!(fs::symlink_metadata(dir.path("big")).is_err());

    let dir = TestDir::new("within-limit");
    let (stats, _) =
        unpack_layer_limited(&blob[..], Compression::Zstd, &dir.layer(), None, 1 << 20).unwrap();
    assert_eq!(stats.bytes, 1000 + 64 * 1024);

    // Many empty files count too.
    let mut many = Layer::new();
    for i in 0..100 {
        many = many.file(&format!("e{i}"), b"");
    }
    let dir = TestDir::new("many-entries");
    assert!(matches!(
        unpack_layer_limited(
            &many.finish()[..],
            Compression::None,
            &dir.layer(),
            None,
            10 * 512
        ),
        Err(UnpackError::TooLarge { .. })
    ));
}

#[test]
fn sparse_holes_count_against_the_limit() {
    // A GNU sparse file of 1 GiB whose archive holds one 512-byte block.
    let mut h = header(EntryType::GNUSparse, 0o644, 512);
    h.set_path("sparse").unwrap();
    let gnu = h.as_gnu_mut().unwrap();
    gnu.sparse[0].offset = *b"07777777000\0";
    gnu.sparse[0].numbytes = *b"00000001000\0";
    gnu.set_real_size(1 << 30);
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.extend_from_slice(&[b's'; 512]);
    tar.extend_from_slice(&[0; 1024]);
    let dir = TestDir::new("sparse-limit");
    assert!(matches!(
        unpack_layer_limited(&tar[..], Compression::None, &dir.layer(), None, 1 << 20),
        Err(UnpackError::TooLarge { .. })
    ));
    assert!(fs::symlink_metadata(dir.path("sparse")).is_err());
}
