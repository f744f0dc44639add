//! The Debian package of this build (hack/deb.sh with cargo-deb), installed with dpkg into a
//! fresh Debian 12 root (hack/fresh-root.sh): its files and modes, the conffile kept across a
//! reinstall, the default CNI network and crictl.yaml only where the node has none, the unit
//! enabled and accepted by `systemd-analyze verify`, the man pages, and berthd started from the
//! unit's own ExecStart line telling the service manager it is ready.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A fresh root with /proc, /sys and /dev from the host while berthd runs in it; unmounted and
/// removed on drop.
struct Root {
    dir: TempDir,
}

impl Root {
    fn path(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn chroot(&self, args: &[&str]) -> std::process::Output {
        Command::new("chroot")
            .arg(self.path())
            .args(args)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("chroot")
    }

    fn chroot_ok(&self, args: &[&str]) -> String {
        let out = self.chroot(args);
        assert!(
            out.status.success(),
            "{args:?} in the fresh root:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn file(&self, path: &str) -> PathBuf {
        self.path().join(path.trim_start_matches('/'))
    }

    fn mode(&self, path: &str) -> u32 {
        std::fs::metadata(self.file(path))
            .unwrap_or_else(|e| panic!("{path} in the package: {e}"))
            .permissions()
            .mode()
            & 0o7777
    }
}

fn package() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_berthd"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    assert!(
        bin.ends_with("debug"),
        "the test packages the debug build: {bin:?}"
    );
    PathBuf::from(hack("deb.sh", &["--profile", "dev"]).trim())
}

fn fresh_root() -> Root {
    let dir = TempDir::new("pkgroot");
    hack(
        "fresh-root.sh",
        &[&dir.path().join("root").to_string_lossy()],
    );
    Root { dir }
}

fn install(root: &Root, deb: &Path) {
    std::fs::copy(deb, root.file("/tmp/berth.deb")).expect("copy the package");
    root.chroot_ok(&["dpkg", "-i", "/tmp/berth.deb"]);
}

#[test]
fn the_package_installs_into_a_fresh_debian_root_and_its_unit_starts_berthd() {
    let deb = package();
    let root = fresh_root();
    install(&root, &deb);

    // Files and modes.
    for bin in [
        "/usr/bin/berthd",
        "/usr/bin/berthctl",
        "/usr/bin/berth-shim",
    ] {
        assert_eq!(root.mode(bin), 0o755, "{bin}");
    }
    for file in [
        "/etc/berth/config.toml",
        "/usr/lib/systemd/system/berthd.service",
        "/usr/share/man/man8/berthd.8.gz",
        "/usr/share/man/man1/berthctl.1.gz",
        "/usr/share/man/man5/berth.toml.5.gz",
        "/usr/share/doc/berth/examples/no-agent.conf",
        "/etc/cni/net.d/10-berth.conflist",
        "/etc/crictl.yaml",
    ] {
        assert_eq!(root.mode(file), 0o644, "{file}");
    }
    let conffiles = root.chroot_ok(&["dpkg-query", "-W", "-f=${Conffiles}", "berth"]);
    assert!(conffiles.contains("/etc/berth/config.toml"), "{conffiles}");
    // The binaries run in the fresh root: their libraries are the package's dependencies.
    assert!(
        root.chroot_ok(&["berthd", "--version"])
            .starts_with("berthd ")
    );
    // The config file parses and changes nothing (every key commented out).
    let shown = root.chroot_ok(&["berthd", "config", "show"]);
    let defaults = root.chroot_ok(&["berthd", "config", "default"]);
    assert!(
        defaults.ends_with(&shown),
        "the shipped config is the defaults"
    );
    // The man pages are roff with their names.
    for (page, title) in [
        ("/usr/share/man/man8/berthd.8.gz", ".TH berthd 8"),
        ("/usr/share/man/man1/berthctl.1.gz", ".TH berthctl 1"),
        ("/usr/share/man/man5/berth.toml.5.gz", ".TH BERTH.TOML 5"),
    ] {
        let text = root.chroot_ok(&["zcat", page]);
        assert!(text.contains(title), "{page}: {}", tail(&text, 5));
    }
    // The unit: enabled, and accepted by systemd's own checker in the root.
    // (The link is absolute: it points into the root, not at the host's file.)
    let wants = root.file("/etc/systemd/system/multi-user.target.wants/berthd.service");
    assert_eq!(
        std::fs::read_link(&wants).ok(),
        Some(PathBuf::from("/lib/systemd/system/berthd.service")),
        "enabled"
    );
    // (The fresh root has no man-db; the pages were checked above.)
    let verify = root.chroot(&["systemd-analyze", "verify", "--man=no", "berthd.service"]);
    let complaints = String::from_utf8_lossy(&verify.stderr).into_owned();
    assert!(
        verify.status.success() && !complaints.contains("berthd.service"),
        "systemd-analyze verify: {complaints}"
    );
    let unit =
        std::fs::read_to_string(root.file("/usr/lib/systemd/system/berthd.service")).expect("unit");
    for line in [
        "Type=notify",
        "Delegate=yes",
        "KillMode=process",
        "Restart=always",
        "OOMScoreAdjust=-999",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} in the unit");
    }

    // berthd from the unit's ExecStart line (the agent off, as the example drop-in does), as
    // systemd would start it: it says READY=1 once its socket serves.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart")
        .replace("$BERTHD_ARGS", "--no-agent");
    let _mounts = Mounts::new(&root.path());
    let notify = root.file("/run/notify.sock");
    let listener = UnixDatagram::bind(&notify).expect("notify socket");
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut berthd = Command::new("chroot")
        .arg(root.path())
        .args(["sh", "-c", &format!("exec {exec}")])
        .env("NOTIFY_SOCKET", "/run/notify.sock")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stderr(std::fs::File::create(root.dir.path().join("berthd.log")).expect("log"))
        .spawn()
        .expect("berthd");
    let mut buf = [0u8; 256];
    let got = listener.recv(&mut buf);
    let log = || std::fs::read_to_string(root.dir.path().join("berthd.log")).unwrap_or_default();
    let n = got.unwrap_or_else(|e| panic!("no READY=1 from berthd ({e}):\n{}", log()));
    assert_eq!(&buf[..n], b"READY=1");
    let version = root.chroot_ok(&["berthctl", "version"]);
    assert!(version.contains("RuntimeName:  berth"), "{version}");
    let _ = Command::new("kill")
        .args(["-TERM", &berthd.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while berthd.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = berthd.kill();
    let _ = berthd.wait();
    let n = listener.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");

    // A changed conffile survives a reinstall; a node with its own CNI network keeps it alone.
    let edited = "# mine\nlog_level = \"debug\"\n";
    std::fs::write(root.file("/etc/berth/config.toml"), edited).expect("edit");
    root.chroot_ok(&["dpkg", "--force-confold", "-i", "/tmp/berth.deb"]);
    assert_eq!(
        std::fs::read_to_string(root.file("/etc/berth/config.toml")).expect("config"),
        edited
    );
    root.chroot_ok(&["dpkg", "--purge", "berth"]);
    assert!(!root.file("/usr/bin/berthd").exists());
    std::fs::remove_file(root.file("/etc/cni/net.d/10-berth.conflist")).expect("rm");
    std::fs::write(root.file("/etc/cni/net.d/05-other.conflist"), "{}").expect("other");
    install(&root, &deb);
    assert!(!root.file("/etc/cni/net.d/10-berth.conflist").exists());
}

/// /proc, /sys, /dev and a tmpfs /run in the root for berthd; unmounted on drop.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn new(root: &Path) -> Self {
        let mut done = Vec::new();
        for (what, target, args) in [
            ("proc", "proc", vec!["-t", "proc"]),
            ("/sys", "sys", vec!["--rbind"]),
            ("/dev", "dev", vec!["--rbind"]),
            ("tmpfs", "run", vec!["-t", "tmpfs"]),
        ] {
            let point = root.join(target);
            std::fs::create_dir_all(&point).expect("mount point");
            let st = Command::new("mount")
                .args(&args)
                .arg(what)
                .arg(&point)
                .status()
                .expect("mount");
            assert!(st.success(), "mount {what} on {point:?}");
            done.push(point);
        }
        Self(done)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for point in self.0.iter().rev() {
            let _ = Command::new("umount")
                .arg("-R")
                .arg("-l")
                .arg(point)
                .status();
        }
    }
}
