//! Bad input to the ImageService: each gets the right status code, a message naming the object,
//! and leaves nothing behind.

mod common;

use common::*;
use k8s_cri::v1 as cri;
use tonic::Code;

async fn pull_with(
    c: &berth::client::CriClient,
    image: &str,
    auth: Option<cri::AuthConfig>,
) -> Result<String, tonic::Status> {
    c.images()
        .pull_image(cri::PullImageRequest {
            image: spec(image),
            auth,
            sandbox_config: None,
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

/// Nothing recorded, no snapshot, no temp file.
fn assert_nothing_left(d: &Daemon) {
    assert!(
        d.snapshot_dirs().is_empty(),
        "snapshots left: {:?}",
        d.snapshot_dirs()
    );
    let ingest = d.root().join("content/ingest");
    let left: Vec<_> = std::fs::read_dir(&ingest)
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "ingest left: {left:?}");
    let blobs: Vec<_> = std::fs::read_dir(d.root().join("content/blobs/sha256"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(blobs.is_empty(), "blobs of no image left: {blobs:?}");
}

#[tokio::test]
async fn malformed_references_are_invalid_argument() {
    let d = Daemon::start();
    let c = d.client().await;
    for bad in ["UPPER/Case", "busybox@sha256:1234", "a b", "busybox:", ""] {
        let e = pull_with(&c, bad, None).await.expect_err(bad);
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        if !bad.is_empty() {
            assert!(
                e.message().contains(bad),
                "message names the reference: {}",
                e.message()
            );
        }
        let e = c
            .images()
            .image_status(cri::ImageStatusRequest {
                image: spec(bad),
                verbose: false,
            })
            .await
            .expect_err(bad);
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    assert_nothing_left(&d);
}

#[tokio::test]
async fn unknown_image_is_not_found() {
    let d = Daemon::start();
    let c = d.client().await;
    for missing in [image("no-such-image"), image("busybox:no-such-tag")] {
        let e = pull_with(&c, &missing, None).await.expect_err("missing");
        assert_eq!(e.code(), Code::NotFound, "{missing}: {e:?}");
        assert!(
            e.message().contains(&missing) || e.message().contains("not found"),
            "{}",
            e.message()
        );
    }
    assert!(status(&c, &image("no-such-image")).await.is_none());
    assert_nothing_left(&d);
}

#[tokio::test]
async fn unreachable_registry_is_unavailable() {
    let d = Daemon::start_with(&["--insecure-registry", "127.0.0.1:1"]);
    let c = d.client().await;
    let e = pull_with(&c, "127.0.0.1:1/busybox", None)
        .await
        .expect_err("unreachable");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("127.0.0.1:1"), "{}", e.message());
    assert_nothing_left(&d);
}

#[tokio::test]
async fn credentials_are_checked() {
    let d = Daemon::start();
    let c = d.client().await;
    let reference = format!("{}/busybox", auth_registry());
    let e = pull_with(&c, &reference, None)
        .await
        .expect_err("anonymous");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(
        e.message().contains("authentication failed"),
        "{}",
        e.message()
    );
    let wrong = cri::AuthConfig {
        username: "berth".into(),
        password: "wrong".into(),
        ..Default::default()
    };
    let e = pull_with(&c, &reference, Some(wrong))
        .await
        .expect_err("wrong password");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(
        e.message().contains("authentication failed"),
        "{}",
        e.message()
    );
    assert_nothing_left(&d);

    let (user, pass) = auth_creds();
    let right = cri::AuthConfig {
        username: user.clone(),
        password: pass.clone(),
        ..Default::default()
    };
    pull_with(&c, &reference, Some(right))
        .await
        .expect("right password");
    // The base64 `auth` form works as well.
    c.images()
        .remove_image(cri::RemoveImageRequest {
            image: spec(&reference),
        })
        .await
        .expect("remove");
    let b64 = base64(&format!("{user}:{pass}"));
    let auth = cri::AuthConfig {
        auth: b64,
        ..Default::default()
    };
    pull_with(&c, &reference, Some(auth))
        .await
        .expect("auth string");
}

fn base64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &x)| acc | (u32::from(x) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn hostile_layers_are_refused_and_leave_nothing() {
    let d = Daemon::start();
    let c = d.client().await;
    let escapes = [
        "/tmp/berth-escape-dotdot",
        "/tmp/berth-escape-symlink",
        "/tmp/berth-escape-abs",
    ];
    for name in [
        "hostile-dotdot",
        "hostile-symlink",
        "hostile-hardlink",
        "hostile-abs-path",
    ] {
        let reference = image(name);
        let e = pull_with(&c, &reference, None).await.expect_err(name);
        assert_eq!(e.code(), Code::FailedPrecondition, "{name}: {e:?}");
        assert!(
            e.message().contains("refusing image"),
            "{name}: {}",
            e.message()
        );
        assert!(status(&c, &reference).await.is_none());
        assert_nothing_left(&d);
    }
    for f in escapes {
        assert!(
            !std::path::Path::new(f).exists(),
            "{f} was written outside the layer"
        );
    }
    assert!(list(&c).await.is_empty());
}

/// A copy of the plain registry on its own port, so tests can damage its blobs.
struct RegistryCopy {
    dir: TempDir,
    port: u16,
}

impl RegistryCopy {
    fn new(port: u16) -> Self {
        let dir = TempDir::new("registry");
        let src = registry_storage().join("data");
        let st = std::process::Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(dir.path().join("data"))
            .status()
            .expect("cp");
        assert!(st.success(), "copying registry storage {}", src.display());
        hack(
            "registry.sh",
            &[
                "start",
                "copy",
                &port.to_string(),
                &dir.path().to_string_lossy(),
            ],
        );
        Self { dir, port }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The data file of blob `digest`.
    fn blob(&self, digest: &str) -> std::path::PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The layer digests of `name`'s manifest (an OCI or Docker image manifest).
    fn layers(&self, name: &str) -> Vec<String> {
        let url = format!("http://{}/v2/{name}/manifests/latest", self.addr());
        let out = std::process::Command::new("curl")
            .args(["-sf", "-H", "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"])
            .arg(&url)
            .output()
            .expect("curl");
        let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("manifest JSON");
        m["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// GET requests for blobs seen in the registry log.
    fn blob_gets(&self) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("GET /v2/") && l.contains("/blobs/sha256:"))
            .count()
    }
}

impl Drop for RegistryCopy {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(repo_root().join("hack/registry.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

#[tokio::test]
async fn corrupt_and_truncated_blobs_fail_the_pull_and_leave_nothing() {
    let reg = RegistryCopy::new(5071);
    let d = Daemon::start_with(&["--insecure-registry", &reg.addr()]);
    let c = d.client().await;
    let layers = reg.layers("layers");
    // Flip bytes in one layer, keeping its size.
    let victim = reg.blob(&layers[1]);
    let mut bytes = std::fs::read(&victim).expect("blob");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, &bytes).expect("corrupt blob");
    let e = pull_with(&c, &format!("{}/layers", reg.addr()), None)
        .await
        .expect_err("corrupt");
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(
        e.message().contains(&layers[1]),
        "names the blob: {}",
        e.message()
    );
    assert!(list(&c).await.is_empty());
    assert_nothing_left(&d);

    // Truncate another layer.
    let victim = reg.blob(&reg.layers("large")[3]);
    let len = std::fs::metadata(&victim).expect("blob").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .expect("open blob");
    f.set_len(len / 2).expect("truncate");
    let e = pull_with(&c, &format!("{}/large", reg.addr()), None)
        .await
        .expect_err("truncated");
    assert!(
        matches!(e.code(), Code::DataLoss | Code::Unavailable),
        "{e:?}"
    );
    assert!(list(&c).await.is_empty());
    assert_nothing_left(&d);
}

#[tokio::test]
async fn concurrent_pulls_share_one_download_and_repull_fetches_only_what_changed() {
    let reg = RegistryCopy::new(5072);
    let d = Daemon::start_with(&["--insecure-registry", &reg.addr()]);
    let c = d.client().await;
    let reference = format!("{}/large", reg.addr());
    let before = reg.blob_gets();
    let pulls: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            let r = reference.clone();
            tokio::spawn(async move { pull(&c, &r).await })
        })
        .collect();
    let mut ids = Vec::new();
    for p in pulls {
        ids.push(p.await.expect("join").expect("pull"));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
    let layers = reg.layers("large").len();
    let fetched = reg.blob_gets() - before;
    // Every layer plus the config, once.
    assert_eq!(fetched, layers + 1, "one download shared by four pulls");
    // A second pull re-resolves the tag but downloads no blob.
    let before = reg.blob_gets();
    pull(&c, &reference).await.expect("re-pull");
    assert_eq!(reg.blob_gets(), before, "nothing re-downloaded");
}

#[tokio::test]
async fn killing_berthd_mid_pull_leaves_no_half_image() {
    let reg = RegistryCopy::new(5073);
    let mut d = Daemon::start_with(&[
        "--insecure-registry",
        &reg.addr(),
        "--max-concurrent-downloads",
        "1",
    ]);
    let reference = format!("{}/large", reg.addr());
    {
        let c = d.client().await;
        let r = reference.clone();
        let pull_task = tokio::spawn(async move { pull(&c, &r).await });
        // Wait until at least one layer snapshot exists, then crash.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while d.snapshot_dirs().len() < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        d.kill9();
        assert!(
            pull_task.await.expect("join").is_err(),
            "the pull died with berthd"
        );
    }
    d.spawn();
    let c = d.client().await;
    assert!(list(&c).await.is_empty(), "no half image");
    assert_nothing_left(&d);
    pull(&c, &reference).await.expect("next pull succeeds");
    assert_eq!(list(&c).await.len(), 1);
}

#[tokio::test]
async fn disk_full_mid_pull_fails_cleanly() {
    // A 64 MiB tmpfs as root: the 200 MiB image cannot fit.
    let dir = TempDir::new("diskfull");
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).expect("mkdir");
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&root)
        .status()
        .expect("mount");
    assert!(st.success(), "mount tmpfs");
    let mut cmd_args = vec!["--root".to_string(), root.to_string_lossy().to_string()];
    cmd_args.extend([
        "--state-dir".to_string(),
        dir.path().join("state").to_string_lossy().to_string(),
    ]);
    let socket = dir.path().join("state/berth.sock");
    let log = std::fs::File::create(dir.path().join("log")).expect("log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_berthd"))
        .args(&cmd_args)
        .arg("--socket")
        .arg(&socket)
        .arg("--insecure-registry")
        .arg(registry())
        .arg("--registry-config-dir")
        .arg(dir.path().join("certs.d"))
        .stderr(log)
        .spawn()
        .expect("spawn");
    let _child = KillOnDrop(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let c = berth::client::CriClient::connect(&socket)
        .await
        .expect("connect");
    let e = pull(&c, &image("large")).await.expect_err("disk full");
    assert!(matches!(e.code(), Code::Internal | Code::DataLoss), "{e:?}");
    assert!(list(&c).await.is_empty());
    let snaps: Vec<_> = std::fs::read_dir(root.join("snapshotter/snapshots"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(snaps.is_empty(), "no snapshot left: {snaps:?}");
    // Space is back: a small image still pulls.
    pull(&c, &image("busybox"))
        .await
        .expect("small pull after the failure");
    // A disk full to the last block fails even the metadata writes; once space is back,
    // berthd works again without a restart.
    let filler = root.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&block[..512]).is_ok() {}
    }
    let e = pull(&c, &image("layers"))
        .await
        .expect_err("pull on a full disk");
    assert!(matches!(e.code(), Code::Internal | Code::DataLoss), "{e:?}");
    let rm = c
        .images()
        .remove_image(cri::RemoveImageRequest {
            image: spec(&image("busybox")),
        })
        .await;
    std::fs::remove_file(&filler).expect("free space");
    if rm.is_err() {
        c.images()
            .remove_image(cri::RemoveImageRequest {
                image: spec(&image("busybox")),
            })
            .await
            .expect("remove once space is back");
    }
    pull(&c, &image("layers"))
        .await
        .expect("pull once space is back");
    assert_eq!(list(&c).await.len(), 1, "the new image alone");
}

/// Kills and reaps a daemon even when the test fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_expired_deadline_is_deadline_exceeded() {
    // tonic's own client enforces `grpc-timeout` itself (answering Cancelled), so this test
    // talks HTTP/2 through hyper directly: whatever comes back is the server's answer.
    let d = Daemon::start();
    let stream = tokio::net::UnixStream::connect(d.socket())
        .await
        .expect("connect");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("http2 handshake");
    tokio::spawn(conn);
    let svc = tower::service_fn(move |mut req: http::Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move {
            // tonic sends an origin-form URI; HTTP/2 needs an authority.
            let uri = format!("http://berth{}", req.uri().path());
            *req.uri_mut() = uri.parse().expect("uri");
            sender.send_request(req).await
        }
    });
    let mut client = k8s_cri::v1::image_service_client::ImageServiceClient::new(svc);
    for _ in 0..20 {
        let mut req = tonic::Request::new(cri::PullImageRequest {
            image: spec(&image("large")),
            auth: None,
            sandbox_config: None,
        });
        req.metadata_mut()
            .insert("grpc-timeout", "1m".parse().expect("header"));
        let e = client.pull_image(req).await.expect_err("1 ms is too short");
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
        assert!(e.message().contains("deadline"), "{}", e.message());
    }
}

#[tokio::test]
async fn node_credentials_are_used_when_the_request_has_none_and_never_logged() {
    let (user, pass) = auth_creds();
    let reference = format!("{}/busybox", auth_registry());
    let dir = TempDir::new("nodeauth");
    // From the config file's [registry.auth."host"] table.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[registry.auth.\"{}\"]\nusername = \"{user}\"\npassword = \"{pass}\"\n",
            auth_registry()
        ),
    )
    .expect("config");
    let d = Daemon::start_with(&["--config", &config.to_string_lossy()]);
    let c = d.client().await;
    pull_with(&c, &reference, None)
        .await
        .expect("pulled with the node's credentials");
    drop(c);
    drop(d);

    // From a docker-style config.json named by registry.auth_file.
    let json = dir.path().join("config.json");
    let encoded = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("{user}:{pass}"),
    );
    std::fs::write(
        &json,
        format!(
            "{{\"auths\": {{\"http://{}\": {{\"auth\": \"{encoded}\"}}}}}}",
            auth_registry()
        ),
    )
    .expect("config.json");
    std::fs::write(
        &config,
        format!("[registry]\nauth_file = \"{}\"\n", json.display()),
    )
    .expect("config");
    let d = Daemon::start_with(&["--config", &config.to_string_lossy()]);
    let c = d.client().await;
    pull_with(&c, &reference, None)
        .await
        .expect("pulled with config.json's credentials");
    // A broken file is named in the error; nothing is pulled.
    std::fs::write(&json, "{ not json").expect("break it");
    let e = pull_with(&c, &format!("{}/busybox:other", auth_registry()), None)
        .await
        .expect_err("unreadable config.json");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("config.json"), "{e:?}");
    let log = d.log();
    assert!(
        !log.contains(&pass) && !log.contains(&encoded),
        "a secret in the log"
    );
}
