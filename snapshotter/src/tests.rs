//! Unit tests of the snapshotter: lifecycle, mounts (as root), crash recovery and usage.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{CWD, FileType, Mode, XattrFlags, makedev};

use crate::{Error, Kind, Mount, Snapshotter, unmount};

/// A directory under /tmp, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from(format!(
            "/tmp/berth-snapshotter-test-{tag}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// A new empty subdirectory, e.g. a mount point.
    fn subdir(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir_all(&dir).expect("create subdir");
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A performed mount, unmounted on drop (also when a test fails).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = unmount(&self.0) {
            eprintln!("cleanup: {e}");
        }
    }
}

fn mount_at(mounts: &[Mount], target: &Path) -> Mounted {
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    mounts[0]
        .mount(target)
        .unwrap_or_else(|e| panic!("mount {:?}: {e}", mounts[0]));
    Mounted(target.to_path_buf())
}

fn is_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!("skipping mount checks: not running as root");
    false
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn none() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn write(dir: &Path, rel: &str, content: &str) {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create parent dirs");
    }
    std::fs::write(&path, content).expect("write file");
}

fn whiteout(dir: &Path, rel: &str) {
    rustix::fs::mknodat(
        CWD,
        dir.join(rel),
        FileType::CharacterDevice,
        Mode::empty(),
        makedev(0, 0),
    )
    .expect("mknod whiteout");
}

fn make_opaque(dir: &Path, rel: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(&path).expect("create opaque dir");
    rustix::fs::lsetxattr(&path, "trusted.overlay.opaque", b"y", XattrFlags::empty())
        .expect("set opaque xattr");
}

/// Every path below `root`, relative to it.
fn walk(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(root).expect("prefix");
            out.insert(rel.to_string_lossy().into_owned());
            if path.symlink_metadata().expect("lstat").is_dir() {
                pending.push(path);
            }
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn assert_read_only(dir: &Path) {
    let err = std::fs::write(dir.join("should-fail"), "x").expect_err("mount should be read-only");
    assert_eq!(
        err.raw_os_error(),
        Some(rustix::io::Errno::ROFS.raw_os_error())
    );
}

/// Entries of `snapshots/`, sorted.
fn snapshot_dirs(s: &Snapshotter) -> BTreeSet<String> {
    std::fs::read_dir(s.root().join("snapshots"))
        .expect("read snapshots dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn snapshotter_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Snapshotter>();
}

#[test]
fn lifecycle_and_errors() {
    let tmp = TempDir::new("lifecycle");
    let s = Snapshotter::open(tmp.path()).expect("open");
    assert_eq!(s.root(), tmp.path().canonicalize().expect("canonical"));
    assert!(s.list().expect("list").is_empty());
    let second = Snapshotter::open(tmp.path()).expect_err("root is locked while open");
    assert!(matches!(second, Error::Db { .. }), "{second}");

    let mounts = s
        .prepare("a", None, labels(&[("stage", "unpack")]))
        .expect("prepare a");
    let a = s.stat("a").expect("stat a");
    assert_eq!(a.kind, Kind::Active);
    assert_eq!(a.parent, None);
    assert_eq!(a.labels, labels(&[("stage", "unpack")]));
    let upper = s.upper_dir("a").expect("upper a");
    assert!(upper.is_dir());
    assert_eq!(upper, s.root().join(format!("snapshots/{}/fs", a.id)));
    assert_eq!(
        mounts,
        vec![Mount {
            fstype: "bind".into(),
            source: upper.to_string_lossy().into_owned(),
            options: vec!["rbind".into(), "rw".into()],
            cwd: None,
        }]
    );
    assert_eq!(s.mounts("a").expect("mounts a"), mounts);
    write(&upper, "hello", "world");

    // Errors around prepare.
    assert!(matches!(s.prepare("a", None, none()), Err(Error::AlreadyExists(k)) if k == "a"));
    assert!(
        matches!(s.prepare("x", Some("missing"), none()), Err(Error::NotFound(k)) if k == "missing")
    );
    assert!(
        matches!(s.prepare("x", Some("a"), none()), Err(Error::InvalidState(k, _)) if k == "a")
    );
    assert!(matches!(s.view("x", Some("a"), none()), Err(Error::InvalidState(k, _)) if k == "a"));
    assert!(matches!(
        s.prepare("", None, none()),
        Err(Error::InvalidState(..))
    ));
    assert!(s.stat("x").is_err(), "failed prepares leave no record");

    // Commit: same directory, new name, labels replaced.
    s.commit("c1", "a", labels(&[("layer", "1")]))
        .expect("commit");
    assert!(matches!(s.stat("a"), Err(Error::NotFound(k)) if k == "a"));
    let c1 = s.stat("c1").expect("stat c1");
    assert_eq!(c1.kind, Kind::Committed);
    assert_eq!(c1.id, a.id);
    assert_eq!(c1.parent, None);
    assert_eq!(c1.labels, labels(&[("layer", "1")]));
    assert_eq!(read(&upper.join("hello")), "world");
    assert!(matches!(s.upper_dir("c1"), Err(Error::InvalidState(k, _)) if k == "c1"));
    assert!(matches!(s.commit("c2", "c1", none()), Err(Error::InvalidState(k, _)) if k == "c1"));
    assert!(matches!(s.commit("c2", "nope", none()), Err(Error::NotFound(k)) if k == "nope"));

    // Children.
    s.prepare("b", Some("c1"), none()).expect("prepare b");
    s.view("v", Some("c1"), none()).expect("view v");
    let b = s.stat("b").expect("stat b");
    assert_eq!(b.parent.as_deref(), Some("c1"));
    assert_eq!(s.stat("v").expect("stat v").kind, Kind::View);
    assert!(matches!(s.commit("c1", "b", none()), Err(Error::AlreadyExists(k)) if k == "c1"));
    assert!(matches!(s.commit("cv", "v", none()), Err(Error::InvalidState(k, _)) if k == "v"));
    assert!(matches!(s.upper_dir("v"), Err(Error::InvalidState(k, _)) if k == "v"));
    assert!(matches!(s.remove("c1"), Err(Error::InUse(k)) if k == "c1"));
    let err = s.remove("c1").expect_err("in use");
    assert!(err.to_string().contains("\"c1\""), "{err}");

    let names: Vec<_> = s
        .list()
        .expect("list")
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["b", "c1", "v"]);

    // Committing b keeps its parent; then c1 still has a child.
    s.commit("c2", "b", none()).expect("commit b");
    assert_eq!(s.stat("c2").expect("stat c2").parent.as_deref(), Some("c1"));
    s.remove("v").expect("remove v");
    assert!(matches!(s.remove("c1"), Err(Error::InUse(_))));
    s.remove("c2").expect("remove c2");
    s.remove("c1").expect("remove c1");
    assert!(matches!(s.remove("c1"), Err(Error::NotFound(k)) if k == "c1"));
    assert!(s.list().expect("list").is_empty());
    assert!(snapshot_dirs(&s).is_empty(), "{:?}", snapshot_dirs(&s));

    // Ids are not reused.
    s.prepare("again", None, none()).expect("prepare again");
    assert!(s.stat("again").expect("stat").id > b.id);
}

#[test]
fn mount_descriptions() {
    let tmp = TempDir::new("shapes");
    let s = Snapshotter::open(tmp.path()).expect("open");
    let snaps = s.root().join("snapshots");
    let fs = |key: &str| {
        let id = s.stat(key).expect("stat").id;
        snaps
            .join(format!("{id}/fs"))
            .to_string_lossy()
            .into_owned()
    };
    let work = |key: &str| {
        let id = s.stat(key).expect("stat").id;
        snaps
            .join(format!("{id}/work"))
            .to_string_lossy()
            .into_owned()
    };

    s.prepare("l1", None, none()).expect("l1");
    s.commit("c1", "l1", none()).expect("c1");
    s.prepare("l2", Some("c1"), none()).expect("l2");
    s.commit("c2", "l2", none()).expect("c2");

    // View of nothing: its own empty directory, read-only.
    let m = s.view("v0", None, none()).expect("v0");
    assert_eq!(m[0].fstype, "bind");
    assert_eq!(m[0].source, fs("v0"));
    assert_eq!(m[0].options, ["rbind", "ro"]);

    // View of one layer: a read-only bind of that layer.
    let m = s.view("v1", Some("c1"), none()).expect("v1");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].fstype, "bind");
    assert_eq!(m[0].source, fs("c1"));
    assert_eq!(m[0].options, ["rbind", "ro"]);

    // View of two layers: lower-only overlay, nearest parent first.
    let m = s.view("v2", Some("c2"), none()).expect("v2");
    assert_eq!(m[0].fstype, "overlay");
    assert_eq!(m[0].source, "overlay");
    assert_eq!(m[0].cwd, None);
    assert_eq!(
        m[0].options,
        [
            "ro".to_string(),
            "index=off".to_string(),
            format!("lowerdir={}:{}", fs("c2"), fs("c1")),
        ]
    );

    // Active on two layers.
    let m = s.prepare("a", Some("c2"), none()).expect("a");
    assert_eq!(
        m[0].options,
        [
            "index=off".to_string(),
            format!("lowerdir={}:{}", fs("c2"), fs("c1")),
            format!("upperdir={}", fs("a")),
            format!("workdir={}", work("a")),
        ]
    );
    assert_eq!(s.mounts("a").expect("mounts a"), m);

    // A committed snapshot's mounts show it read-only.
    let m = s.mounts("c2").expect("mounts c2");
    assert_eq!(m, s.mounts("v2").expect("mounts v2"));
    let m = s.mounts("c1").expect("mounts c1");
    assert_eq!(m, s.mounts("v1").expect("mounts v1"));
    assert!(matches!(s.mounts("zz"), Err(Error::NotFound(_))));
}

#[test]
fn overlay_merges_whiteouts_and_opaque_dirs() {
    if !is_root() {
        return;
    }
    let tmp = TempDir::new("overlay");
    let s = Snapshotter::open(tmp.path()).expect("open");

    s.prepare("u1", None, none()).expect("u1");
    let l1 = s.upper_dir("u1").expect("upper u1");
    write(&l1, "a", "a1");
    write(&l1, "gone", "g");
    write(&l1, "dir/x", "x");
    write(&l1, "dir/y", "y");
    write(&l1, "keep/k", "k");
    s.commit("c1", "u1", none()).expect("c1");

    s.prepare("u2", Some("c1"), none()).expect("u2");
    let l2 = s.upper_dir("u2").expect("upper u2");
    whiteout(&l2, "gone");
    make_opaque(&l2, "dir");
    write(&l2, "dir/z", "z");
    write(&l2, "b", "b2");
    s.commit("c2", "u2", none()).expect("c2");

    s.prepare("u3", Some("c2"), none()).expect("u3");
    let l3 = s.upper_dir("u3").expect("upper u3");
    write(&l3, "a", "a3");
    write(&l3, "c", "c3");
    write(&l3, "keep/k2", "k2");
    s.commit("c3", "u3", none()).expect("c3");

    let expected = set(&["a", "b", "c", "dir", "dir/z", "keep", "keep/k", "keep/k2"]);

    let view_mounts = s.view("v", Some("c3"), none()).expect("view");
    assert_eq!(view_mounts[0].fstype, "overlay");
    let target = tmp.subdir("view");
    {
        let _m = mount_at(&view_mounts, &target);
        assert_eq!(walk(&target), expected);
        assert_eq!(read(&target.join("a")), "a3");
        assert_eq!(read(&target.join("keep/k")), "k");
        assert_read_only(&target);
    }

    // A view of a single layer is a read-only bind.
    let single = s.view("v1", Some("c1"), none()).expect("view c1");
    {
        let _m = mount_at(&single, &target);
        assert_eq!(
            walk(&target),
            set(&["a", "gone", "dir", "dir/x", "dir/y", "keep", "keep/k"])
        );
        assert_read_only(&target);
    }

    // An active snapshot on top is writable and its writes land in its own upper dir.
    let active = s.prepare("rw", Some("c3"), none()).expect("active");
    let upper = s.upper_dir("rw").expect("upper rw");
    let rootfs = tmp.subdir("rootfs");
    {
        let _m = mount_at(&active, &rootfs);
        assert_eq!(walk(&rootfs), expected);
        write(&rootfs, "new/file", "fresh");
        std::fs::write(rootfs.join("keep/k"), "changed").expect("modify lower file");
        std::fs::remove_file(rootfs.join("a")).expect("delete lower file");
        assert_eq!(
            walk(&rootfs),
            set(&[
                "b", "c", "dir", "dir/z", "keep", "keep/k", "keep/k2", "new", "new/file"
            ])
        );
    }
    assert_eq!(read(&upper.join("new/file")), "fresh");
    assert_eq!(read(&upper.join("keep/k")), "changed");
    let wh = upper
        .join("a")
        .symlink_metadata()
        .expect("whiteout in upper");
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    // Lower layers are untouched.
    assert_eq!(read(&l1.join("keep/k")), "k");
    assert_eq!(read(&l3.join("a")), "a3");
}

#[test]
fn parallel_unpack_with_commit_with_parent() {
    let tmp = TempDir::new("parallel");
    let s = Arc::new(Snapshotter::open(tmp.path()).expect("open"));

    // Every layer is prepared without a parent and unpacked concurrently.
    let layers: Vec<(&str, &str)> = vec![("k1", "sha-1"), ("k2", "sha-2"), ("k3", "sha-3")];
    for (key, _) in &layers {
        s.prepare(key, None, labels(&[("unpacking", "true")]))
            .expect("prepare");
    }
    let handles: Vec<_> = layers
        .iter()
        .enumerate()
        .map(|(i, (key, _))| {
            let s = Arc::clone(&s);
            let key = key.to_string();
            std::thread::spawn(move || {
                let dir = s.upper_dir(&key).expect("upper");
                match i {
                    0 => {
                        write(&dir, "base", "1");
                        write(&dir, "etc/conf", "1");
                        write(&dir, "etc/old", "1");
                    }
                    1 => {
                        std::fs::create_dir_all(dir.join("etc")).expect("mkdir");
                        whiteout(&dir, "etc/old");
                        write(&dir, "etc/conf", "2");
                    }
                    _ => write(&dir, "top", "3"),
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("unpack thread");
    }

    // Errors: parent missing, parent not committed.
    assert!(matches!(
        s.commit_with_parent("sha-2", "k2", Some("sha-1"), none()),
        Err(Error::NotFound(k)) if k == "sha-1"
    ));
    assert!(matches!(
        s.commit_with_parent("sha-2", "k2", Some("k1"), none()),
        Err(Error::InvalidState(k, _)) if k == "k1"
    ));

    // Commit in chain order, each onto the previous one.
    let mut parent: Option<&str> = None;
    for (key, chain_id) in &layers {
        s.commit_with_parent(chain_id, key, parent, labels(&[("chain", chain_id)]))
            .expect("commit_with_parent");
        parent = Some(chain_id);
    }
    let infos = s.list().expect("list");
    let parents: Vec<_> = infos
        .iter()
        .map(|i| (i.name.as_str(), i.parent.as_deref(), i.kind))
        .collect();
    assert_eq!(
        parents,
        [
            ("sha-1", None, Kind::Committed),
            ("sha-2", Some("sha-1"), Kind::Committed),
            ("sha-3", Some("sha-2"), Kind::Committed),
        ]
    );
    assert!(matches!(s.remove("sha-1"), Err(Error::InUse(_))));

    // An active prepared on a parent can only be committed onto that parent.
    s.prepare("on1", Some("sha-1"), none())
        .expect("prepare on1");
    assert!(matches!(
        s.commit_with_parent("x", "on1", Some("sha-2"), none()),
        Err(Error::InvalidState(k, _)) if k == "on1"
    ));
    assert!(matches!(
        s.commit_with_parent("x", "on1", None, none()),
        Err(Error::InvalidState(k, _)) if k == "on1"
    ));
    s.commit_with_parent("x", "on1", Some("sha-1"), none())
        .expect("same parent is fine");
    s.remove("x").expect("remove x");

    let view = s.view("v", Some("sha-3"), none()).expect("view");
    if !is_root() {
        return;
    }
    let target = tmp.subdir("merged");
    let _m = mount_at(&view, &target);
    assert_eq!(walk(&target), set(&["base", "etc", "etc/conf", "top"]));
    assert_eq!(read(&target.join("etc/conf")), "2");
}

#[test]
fn deep_chain_uses_relative_paths() {
    const LAYERS: usize = 120;
    let tmp = TempDir::new("deep-chain-with-a-longish-name");
    let s = Snapshotter::open(tmp.path()).expect("open");
    let mut parent: Option<String> = None;
    for i in 0..LAYERS {
        let key = format!("active-{i}");
        let name = format!("layer-{i}");
        s.prepare(&key, parent.as_deref(), none()).expect("prepare");
        let upper = s.upper_dir(&key).expect("upper");
        write(&upper, &format!("file-{i}"), &i.to_string());
        write(&upper, "shared", &i.to_string());
        s.commit(&name, &key, none()).expect("commit");
        parent = Some(name);
    }
    let top = parent.expect("top layer");

    let view = s.view("view", Some(&top), none()).expect("view");
    let snapshots = s.root().join("snapshots");
    assert_eq!(view[0].cwd.as_deref(), Some(snapshots.as_path()));
    let absolute_len = LAYERS * (snapshots.as_os_str().len() + "/123/fs:".len());
    assert!(absolute_len > 4000, "test root too short: {absolute_len}");
    let lowerdir = view[0]
        .options
        .iter()
        .find_map(|o| o.strip_prefix("lowerdir="))
        .expect("lowerdir");
    assert_eq!(lowerdir.split(':').count(), LAYERS);
    assert!(!lowerdir.starts_with('/'));
    assert!(view[0].options.join(",").len() < 4000);

    let active = s.prepare("rootfs", Some(&top), none()).expect("active");
    assert!(active[0].cwd.is_some());
    assert!(
        active[0]
            .options
            .iter()
            .any(|o| o.starts_with("upperdir=") && !o.starts_with("upperdir=/"))
    );

    if !is_root() {
        return;
    }
    let cwd_before = std::env::current_dir().expect("cwd");
    let target = tmp.subdir("view");
    {
        let _m = mount_at(&view, &target);
        assert_eq!(read(&target.join("file-0")), "0");
        assert_eq!(read(&target.join(format!("file-{}", LAYERS - 1))), "119");
        assert_eq!(read(&target.join("shared")), "119");
        assert_eq!(walk(&target).len(), LAYERS + 1);
        assert_read_only(&target);
    }
    assert_eq!(std::env::current_dir().expect("cwd"), cwd_before);

    let rootfs = tmp.subdir("rootfs");
    {
        let _m = mount_at(&active, &rootfs);
        assert_eq!(read(&rootfs.join("file-0")), "0");
        write(&rootfs, "written", "yes");
    }
    let upper = s.upper_dir("rootfs").expect("upper");
    assert_eq!(read(&upper.join("written")), "yes");
}

#[test]
fn awkward_root_paths_use_relative_paths() {
    let tmp = TempDir::new("awkward");
    let root = tmp.path().join("with,comma:colon");
    let s = Snapshotter::open(&root).expect("open");
    s.prepare("l1", None, none()).expect("l1");
    write(&s.upper_dir("l1").expect("upper"), "f", "1");
    s.commit("c1", "l1", none()).expect("c1");
    let m = s.prepare("a", Some("c1"), none()).expect("a");
    assert_eq!(
        m[0].cwd.as_deref(),
        Some(s.root().join("snapshots").as_path())
    );
    if !is_root() {
        return;
    }
    let target = tmp.subdir("target");
    {
        let _m = mount_at(&m, &target);
        assert_eq!(read(&target.join("f")), "1");
    }

    // Failures, through /bin/mount and through mount(2), name the target.
    let missing = tmp.path().join("missing");
    let err = m[0].mount(&missing).expect_err("no such target");
    assert!(err.to_string().contains("missing"), "{err}");
    let bind = s.mounts("c1").expect("mounts c1");
    assert!(bind[0].cwd.is_none());
    let err = bind[0].mount(&missing).expect_err("no such target");
    assert!(err.to_string().contains("missing"), "{err}");
    assert!(unmount(&missing).is_err());
}

#[test]
fn open_removes_crash_leftovers_and_keeps_metadata() {
    let tmp = TempDir::new("crash");
    let (c1_id, a_id) = {
        let s = Snapshotter::open(tmp.path()).expect("open");
        s.prepare("l1", None, labels(&[("k", "v")])).expect("l1");
        write(&s.upper_dir("l1").expect("upper"), "data", "kept");
        s.commit("c1", "l1", labels(&[("k", "v")])).expect("c1");
        s.prepare("a", Some("c1"), none()).expect("a");
        (s.stat("c1").expect("c1").id, s.stat("a").expect("a").id)
    };
    let snaps = tmp.path().join("snapshots");
    // Leftovers: an unrecorded id (crash before commit of a create, or after a remove's
    // commit), a half-built directory, a half-removed one, and stray files.
    write(&snaps, "999/fs/junk", "x");
    write(&snaps, "new-7/fs/junk", "x");
    std::fs::create_dir_all(snaps.join("new-8/work")).expect("mkdir");
    write(&snaps, "rm-3/fs/junk", "x");
    write(&snaps, "stray-file", "x");
    write(&snaps, &format!("0{c1_id}/fs/junk"), "x");

    let s = Snapshotter::open(tmp.path()).expect("reopen");
    assert_eq!(
        snapshot_dirs(&s),
        [c1_id.to_string(), a_id.to_string()].into_iter().collect()
    );
    let c1 = s.stat("c1").expect("c1 survives");
    assert_eq!(c1.id, c1_id);
    assert_eq!(c1.kind, Kind::Committed);
    assert_eq!(c1.labels, labels(&[("k", "v")]));
    let a = s.stat("a").expect("a survives");
    assert_eq!(a.parent.as_deref(), Some("c1"));
    assert_eq!(a.kind, Kind::Active);
    assert_eq!(read(&snaps.join(format!("{c1_id}/fs/data"))), "kept");
    assert!(matches!(s.remove("c1"), Err(Error::InUse(_))));

    // The counter survives too: new ids are fresh.
    s.prepare("b", None, none()).expect("b");
    assert!(s.stat("b").expect("b").id > a_id);

    // A stale directory at the next id (never recorded) does not break creation.
    let next = s.stat("b").expect("b").id + 1;
    write(&snaps, &format!("{next}/fs/stale"), "x");
    write(&snaps, &format!("new-{next}"), "a file, not a directory");
    s.prepare("c", None, none()).expect("c");
    let c_upper = s.upper_dir("c").expect("upper c");
    assert_eq!(c_upper, snaps.join(format!("{next}/fs")));
    assert!(walk(&c_upper).is_empty());
}

#[test]
fn usage_counts_blocks_and_inodes_once() {
    let tmp = TempDir::new("usage");
    let s = Snapshotter::open(tmp.path()).expect("open");
    s.prepare("a", None, none()).expect("a");
    let upper = s.upper_dir("a").expect("upper");

    let empty = s.usage("a").expect("usage empty");
    assert_eq!(empty.inodes, 1, "only the directory itself");

    let data = vec![7u8; 100_000];
    let file = upper.join("big");
    std::fs::write(&file, &data).expect("write");
    std::fs::File::open(&file)
        .and_then(|f| f.sync_all())
        .expect("sync");
    std::fs::create_dir(upper.join("sub")).expect("mkdir");
    std::os::unix::fs::symlink("big", upper.join("link")).expect("symlink");
    let before_link = s.usage("a").expect("usage");
    assert_eq!(before_link.inodes, 4);
    assert!(before_link.bytes >= 100_000, "{before_link:?}");

    std::fs::hard_link(&file, upper.join("sub/hard")).expect("hard link");
    let after_link = s.usage("a").expect("usage");
    assert_eq!(after_link, before_link, "hard links are counted once");

    let expected: u64 = [&upper, &file, &upper.join("sub"), &upper.join("link")]
        .iter()
        .map(|p| p.symlink_metadata().expect("lstat").blocks() * 512)
        .sum();
    assert_eq!(after_link.bytes, expected);

    // Parents are not counted.
    s.commit("c", "a", none()).expect("commit");
    s.prepare("b", Some("c"), none()).expect("b");
    assert_eq!(s.usage("b").expect("usage b").inodes, 1);
    assert_eq!(s.usage("c").expect("usage c"), after_link);
    assert!(matches!(s.usage("zz"), Err(Error::NotFound(_))));
}

#[test]
fn concurrent_prepares_get_distinct_ids() {
    let tmp = TempDir::new("concurrent");
    let s = Arc::new(Snapshotter::open(tmp.path()).expect("open"));
    s.prepare("base", None, none()).expect("base");
    s.commit("base-c", "base", none()).expect("commit");
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..10 {
                    let key = format!("t{t}-{i}");
                    s.prepare(&key, Some("base-c"), none()).expect("prepare");
                    if i % 2 == 0 {
                        s.remove(&key).expect("remove");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let infos = s.list().expect("list");
    assert_eq!(infos.len(), 1 + 4 * 5);
    let ids: BTreeSet<u64> = infos.iter().map(|i| i.id).collect();
    assert_eq!(ids.len(), infos.len());
    let dirs = snapshot_dirs(&s);
    assert_eq!(dirs, ids.iter().map(|i| i.to_string()).collect());
}

#[test]
fn a_full_disk_fails_writes_and_they_work_again_once_space_is_back() {
    if !is_root() {
        return;
    }
    let tmp = TempDir::new("full");
    let fs = tmp.subdir("fs");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&fs)
        .status()
        .expect("mount");
    assert!(st.success());
    let _fs = Mounted(fs.clone());
    let s = Snapshotter::open(&fs.join("snap")).expect("open");
    s.prepare("before", None, none())
        .expect("prepare with room");
    // Fill the file system to the last block.
    let filler = fs.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&block[..512]).is_ok() {}
        let _ = f.sync_all();
    }
    let mut failed = 0;
    for i in 0..50 {
        if s.prepare(&format!("full-{i}"), None, none()).is_err() {
            failed += 1;
        }
    }
    assert!(failed > 0, "some write failed on the full disk");
    std::fs::remove_file(&filler).expect("free space");
    s.prepare("after", None, none())
        .expect("prepare once space is back");
    s.remove("before").expect("remove once space is back");
}
