//! Image archives through `berthctl image import/export` against a real berthd: round trips to
//! the same image ids, archives skopeo wrote (docker save and OCI layout, several images), bad
//! archives refused with nothing left, and the import directory.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sha2::{Digest, Sha256};

fn berthctl(d: &Daemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(format!("unix://{}", d.socket().display()))
        .args(args)
        .output()
        .expect("run berthctl")
}

fn berthctl_ok(d: &Daemon, args: &[&str]) -> String {
    let out = berthctl(d, args);
    assert!(
        out.status.success(),
        "berthctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// berthctl's error for a refused import.
fn import_err(d: &Daemon, file: &Path) -> String {
    let out = berthctl(d, &["image", "import", &file.display().to_string()]);
    assert!(
        !out.status.success(),
        "import of {} succeeded",
        file.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sha256_file(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).expect("read archive")))
}

fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The entries of a tar, in order, with their contents.
fn entries(archive: &Path) -> Vec<(String, Vec<u8>)> {
    let mut tar = tar::Archive::new(std::fs::File::open(archive).expect("open"));
    tar.entries()
        .expect("entries")
        .map(|e| {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").display().to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("read entry");
            (path, data)
        })
        .collect()
}

/// Writes `files` as a tar (paths written as given, `..` included).
fn write_tar(path: &Path, files: &[(String, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).expect("create"));
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, &data[..]).expect("append");
    }
    b.finish().expect("finish");
}

/// Nothing of a refused import: no image, no snapshot, no blob.
async fn assert_nothing_imported(d: &Daemon) {
    let c = d.client().await;
    assert!(list(&c).await.is_empty(), "images: {:?}", list(&c).await);
    assert!(
        d.snapshot_dirs().is_empty(),
        "snapshots left: {:?}",
        d.snapshot_dirs()
    );
    let blobs = settled_entries(&d.root().join("content/blobs/sha256"));
    assert!(blobs.is_empty(), "blobs left: {blobs:?}");
}

async fn pulled_ids(d: &Daemon, names: &[&str]) -> Vec<String> {
    let c = d.client().await;
    let mut ids = Vec::new();
    for name in names {
        pull(&c, &image(name)).await.expect("pull");
        ids.push(status(&c, &image(name)).await.expect("pulled").id);
    }
    ids
}

#[tokio::test]
async fn an_export_imports_back_to_the_same_images_and_the_same_bytes() {
    let d = Daemon::start();
    let dir = TempDir::new("archive-trip");
    let names = ["busybox:latest", "layers:latest"];
    let ids = pulled_ids(&d, &names).await;
    let both = dir.path().join("both.tar");
    let again = dir.path().join("again.tar");
    let refs: Vec<String> = names.iter().map(|n| image(n)).collect();
    let mut args = vec!["image", "export"];
    args.extend(refs.iter().map(String::as_str));
    berthctl_ok(
        &d,
        &[args.as_slice(), &["-o", &both.display().to_string()]].concat(),
    );
    berthctl_ok(
        &d,
        &[args.as_slice(), &["-o", &again.display().to_string()]].concat(),
    );
    assert_eq!(
        sha256_file(&both),
        sha256_file(&again),
        "two exports differ"
    );

    // Every layer's digest is its diff id; the config is the pulled one, byte for byte.
    let files = entries(&both);
    for (path, data) in &files {
        if let Some(hex) = path.strip_prefix("blobs/sha256/") {
            assert_eq!(hex::encode(Sha256::digest(data)), hex, "blob {path}");
        }
    }
    for id in &ids {
        let path = format!("blobs/sha256/{}", id.trim_start_matches("sha256:"));
        assert!(
            files.iter().any(|(p, _)| *p == path),
            "config {path} missing"
        );
    }

    // skopeo reads it as a docker archive and as an OCI archive.
    let layout = dir.path().join("layout");
    skopeo(&[
        "copy",
        &format!("docker-archive:{}:{}", both.display(), refs[1]),
        &format!("oci:{}:layers", layout.display()),
    ]);
    let single = dir.path().join("single.tar");
    berthctl_ok(
        &d,
        &[
            "image",
            "export",
            &refs[0],
            "-o",
            &single.display().to_string(),
        ],
    );
    skopeo(&[
        "copy",
        &format!("oci-archive:{}", single.display()),
        &format!("oci:{}:busybox", layout.display()),
    ]);

    // Removed and imported again (gzip-compressed, from stdin): the same ids and names.
    for r in &refs {
        berthctl_ok(&d, &["rmi", r]);
    }
    let c = d.client().await;
    assert!(list(&c).await.is_empty());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&std::fs::read(&both).expect("read"))
        .expect("gzip");
    let gz = gz.finish().expect("gzip");
    let mut child = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(format!("unix://{}", d.socket().display()))
        .args(["image", "import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berthctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&gz)
        .expect("feed the archive");
    let out = child.wait_with_output().expect("berthctl");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (id, r) in ids.iter().zip(&refs) {
        assert!(said.contains(id.as_str()), "{said}");
        let img = status(&c, r).await.expect("imported by name");
        assert_eq!(&img.id, id);
        assert!(img.repo_tags.contains(r), "{:?}", img.repo_tags);
    }
    // The imported image runs (no pull: the image is on the node).
    let log = TempDir::new("archive-run");
    let pod = pod_config("archive", log.path(), k8s_cri::v1::NamespaceMode::Pod);
    let pod_id = run_pod(&c, &pod).await;
    let config = sh_container(
        "sleeper",
        &refs[1],
        "sleep 60",
        k8s_cri::v1::NamespaceMode::Pod,
    );
    let cid = run_container(&c, &pod_id, &pod, config).await;
    let said = exec_ok(&c, &cid, &["sh", "-c", "echo from-the-$((6*7))"]).await;
    assert!(said.contains("from-the-42"), "{said}");
    remove_pod(&c, &pod_id).await;
    // And exports to the same bytes again.
    let third = dir.path().join("third.tar");
    let mut args = vec!["image", "export"];
    args.extend(refs.iter().map(String::as_str));
    berthctl_ok(
        &d,
        &[args.as_slice(), &["-o", &third.display().to_string()]].concat(),
    );
    assert_eq!(sha256_file(&both), sha256_file(&third));
}

#[tokio::test]
async fn archives_skopeo_wrote_import_with_their_names() {
    let d = Daemon::start();
    let dir = TempDir::new("archive-skopeo");
    let busybox = image("busybox:latest");
    let layers = image("layers:latest");
    let docker = dir.path().join("docker.tar");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{busybox}"),
        &format!("docker-archive:{}:{busybox}", docker.display()),
    ]);
    // Two images in one OCI layout, tarred.
    let layout = dir.path().join("layout");
    for r in [&busybox, &layers] {
        skopeo(&[
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{r}"),
            &format!("oci:{}:{r}", layout.display()),
        ]);
    }
    let oci = dir.path().join("oci.tar");
    let tarred = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .args(["-cf"])
        .arg(&oci)
        .arg(".")
        .status()
        .expect("tar");
    assert!(tarred.success());

    let said = berthctl_ok(&d, &["image", "import", &docker.display().to_string()]);
    assert!(said.contains(&busybox), "{said}");
    let c = d.client().await;
    let from_docker = status(&c, &busybox).await.expect("imported");
    berthctl_ok(&d, &["rmi", &busybox]);

    let said = berthctl_ok(
        &d,
        &["-o", "json", "image", "import", &oci.display().to_string()],
    );
    let imported: serde_json::Value = serde_json::from_str(&said).expect("json");
    assert_eq!(imported.as_array().map(Vec::len), Some(2), "{said}");
    let from_oci = status(&c, &busybox).await.expect("imported");
    assert!(status(&c, &layers).await.is_some());
    // A docker archive keeps the registry's config, so its id is the one a pull gives; skopeo
    // rewrites the config for an OCI layout, and the id is the one the layout's manifest names.
    let other = Daemon::start();
    assert_eq!(
        pulled_ids(&other, &["busybox:latest"]).await[0],
        from_docker.id
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index"))
            .expect("json");
    let entry = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == busybox.as_str())
        .expect("busybox in the layout");
    let manifest = layout.join("blobs/sha256").join(
        entry["digest"]
            .as_str()
            .expect("digest")
            .trim_start_matches("sha256:"),
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest).expect("manifest")).expect("json");
    assert_eq!(manifest["config"]["digest"], from_oci.id.as_str());
    // The OCI layout's manifest digest is kept as the repo digest.
    assert!(
        from_oci
            .repo_digests
            .iter()
            .any(|d| d.starts_with(&image("busybox@sha256:"))),
        "{:?}",
        from_oci.repo_digests
    );
}

#[tokio::test]
async fn bad_archives_are_refused_naming_the_file_and_entry_and_leave_nothing() {
    let source = Daemon::start();
    let dir = TempDir::new("archive-bad");
    let good = dir.path().join("good.tar");
    pulled_ids(&source, &["layers:latest"]).await;
    berthctl_ok(
        &source,
        &[
            "image",
            "export",
            &image("layers:latest"),
            "-o",
            &good.display().to_string(),
        ],
    );
    drop(source);
    let files = entries(&good);
    let d = Daemon::start();
    let path = |name: &str| dir.path().join(name);

    // Truncated in the middle of a layer.
    let bytes = std::fs::read(&good).expect("read");
    std::fs::write(path("truncated.tar"), &bytes[..bytes.len() / 2]).expect("write");
    let e = import_err(&d, &path("truncated.tar"));
    assert!(
        e.contains("truncated.tar") && e.contains("truncated"),
        "{e}"
    );
    assert_nothing_imported(&d).await;

    // One byte of a layer changed: its digest no longer holds.
    let layer = files
        .iter()
        .position(|(p, d)| p.starts_with("blobs/") && d.len() > 100_000)
        .expect("a layer");
    let mut corrupt = files.clone();
    let mid = corrupt[layer].1.len() / 2;
    corrupt[layer].1[mid] ^= 0x55;
    write_tar(&path("corrupt.tar"), &corrupt);
    let e = import_err(&d, &path("corrupt.tar"));
    assert!(
        e.contains("corrupt.tar") && e.contains(&files[layer].0) && e.contains("hashes to"),
        "{e}"
    );
    assert_nothing_imported(&d).await;

    // A config whose bytes are not its digest.
    let index: serde_json::Value = serde_json::from_slice(
        &files
            .iter()
            .find(|(p, _)| p == "manifest.json")
            .expect("manifest.json")
            .1,
    )
    .expect("json");
    let config = index[0]["Config"].as_str().expect("config").to_string();
    let mut wrong = files.clone();
    for (p, data) in &mut wrong {
        if *p == config {
            let text =
                String::from_utf8_lossy(data).replace("\"os\":\"linux\"", "\"os\":\"Linux\"");
            assert_ne!(text.as_bytes(), &data[..], "config has no os field");
            *data = text.into_bytes();
        }
    }
    write_tar(&path("wrong-digest.tar"), &wrong);
    let e = import_err(&d, &path("wrong-digest.tar"));
    assert!(e.contains("wrong-digest.tar") && e.contains(&config), "{e}");
    assert_nothing_imported(&d).await;

    // Not an image archive at all.
    write_tar(
        &path("not-an-image.tar"),
        &[("etc/hostname".into(), b"node\n".to_vec())],
    );
    let e = import_err(&d, &path("not-an-image.tar"));
    assert!(
        e.contains("not-an-image.tar") && e.contains("not an image archive"),
        "{e}"
    );
    // Nor a tar.
    std::fs::write(path("garbage.tar"), vec![7u8; 4096]).expect("write");
    let e = import_err(&d, &path("garbage.tar"));
    assert!(e.contains("garbage.tar"), "{e}");

    // An entry escaping the archive's root.
    let mut escaping = files.clone();
    escaping.insert(1, ("../../etc/evil".into(), b"x".to_vec()));
    write_tar(&path("escaping.tar"), &escaping);
    let e = import_err(&d, &path("escaping.tar"));
    assert!(
        e.contains("escaping.tar") && e.contains("../../etc/evil") && e.contains("escapes"),
        "{e}"
    );
    assert!(!Path::new("/etc/evil").exists());
    assert_nothing_imported(&d).await;

    // And the good one still imports.
    berthctl_ok(&d, &["image", "import", &good.display().to_string()]);
}

/// Waits up to 20 s for `image` to be (or not be) on the node.
async fn wait_for(d: &Daemon, image: &str, present: bool) -> bool {
    let c = d.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if status(&c, image).await.is_some() == present {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test]
async fn the_import_directory_imports_at_start_and_when_added_each_once() {
    let source = Daemon::start();
    let dir = TempDir::new("archive-dir");
    pulled_ids(&source, &["busybox:latest", "layers:latest"]).await;
    let export = |name: &str| -> PathBuf {
        let out = dir
            .path()
            .join(format!("{}.tar", name.replace([':', '/'], "_")));
        berthctl_ok(
            &source,
            &[
                "image",
                "export",
                &image(name),
                "-o",
                &out.display().to_string(),
            ],
        );
        out
    };
    let busybox = export("busybox:latest");
    let layers = export("layers:latest");
    drop(source);

    let mut d = Daemon::start();
    d.stop();
    let import = d.root().join("import");
    std::fs::create_dir_all(&import).expect("import dir");
    std::fs::copy(&busybox, import.join("busybox.tar")).expect("copy");
    std::fs::write(import.join("broken.tar"), b"not an archive").expect("write");
    d.spawn();
    assert!(
        wait_for(&d, &image("busybox:latest"), true).await,
        "{}",
        tail(&d.log(), 40)
    );

    // Added while running, under a dot name first, as a careful copy does.
    std::fs::copy(&layers, import.join(".layers.tar")).expect("copy");
    std::fs::rename(import.join(".layers.tar"), import.join("layers.tar")).expect("rename");
    assert!(
        wait_for(&d, &image("layers:latest"), true).await,
        "{}",
        tail(&d.log(), 40)
    );

    // Each once: a removed image does not come back after a restart, and the broken file is
    // reported once, not on every look.
    berthctl_ok(&d, &["rmi", &image("busybox:latest")]);
    d.stop();
    d.spawn();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(wait_for(&d, &image("busybox:latest"), false).await);
    let log = d.log();
    let failures = log
        .matches("importing from the import directory failed")
        .count();
    assert_eq!(failures, 1, "{}", tail(&log, 40));
    assert!(log.contains("broken.tar"), "the failure names the file");
}
