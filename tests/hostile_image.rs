//! Hostile registries, images and archives against a real berthd: oversized manifests and
//! configs, tar extension records that would be read whole into memory, a layer that unpacks
//! past its limit, a registry that stops sending mid-layer, and credentials offered to a
//! mirror. Each is refused by name, leaves nothing, and berthd goes on serving. The memory
//! attacks run berthd in a 512 MiB memory cgroup, so a regression kills berthd, not the host.

mod common;
#[path = "common/fake_registry.rs"]
mod fake_registry;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fake_registry::{Body, FakeRegistry, Request, Response};
use k8s_cri::v1 as cri;
use sha2::{Digest, Sha256};
use tonic::Code;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// The size of the long-name records: 1.5 GiB.
const HUGE_RECORD: u64 = 3 << 29;

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// What the fake registry serves: manifests by path, blobs by digest.
#[derive(Default)]
struct Content {
    manifests: HashMap<String, (String, Vec<u8>)>,
    blobs: HashMap<String, Arc<dyn Fn() -> Body + Send + Sync>>,
}

impl Content {
    fn manifest(&mut self, repo: &str, reference: &str, media_type: &str, body: Vec<u8>) {
        self.manifests.insert(
            format!("/v2/{repo}/manifests/{reference}"),
            (media_type.into(), body),
        );
    }

    fn blob(&mut self, digest: &str, body: impl Fn() -> Body + Send + Sync + 'static) {
        self.blobs.insert(digest.to_string(), Arc::new(body));
    }

    fn serve(self) -> FakeRegistry {
        FakeRegistry::start(move |r: &Request| {
            if let Some((media_type, body)) = self.manifests.get(&r.path) {
                return Response::ok(media_type, body.clone());
            }
            if let Some((_, d)) = r.path.split_once("/blobs/")
                && let Some(make) = self.blobs.get(d)
            {
                return Response {
                    status: 200,
                    headers: vec![("Content-Type".into(), "application/octet-stream".into())],
                    body: make(),
                };
            }
            Response::not_found()
        })
    }
}

/// A config naming `diff_ids`, and its descriptor JSON.
fn config(diff_ids: &[String]) -> (Vec<u8>, String) {
    let body = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("config JSON");
    let d = digest(&body);
    (body, d)
}

fn manifest(config: serde_json::Value, layers: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config,
        "layers": layers,
    }))
    .expect("manifest JSON")
}

fn descriptor(media_type: &str, digest: &str, size: u64) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": digest, "size": size})
}

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

/// berthd with the fake registry reachable over plain HTTP.
fn daemon_for(reg: &FakeRegistry, extra: &[&str]) -> Daemon {
    let addr = reg.addr();
    let mut args = vec!["--insecure-registry", addr.as_str()];
    args.extend_from_slice(extra);
    Daemon::start_with(&args)
}

/// No image, no snapshot, no blob, nothing in ingest.
async fn assert_nothing_left(d: &Daemon, c: &berth::client::CriClient) {
    assert!(list(c).await.is_empty(), "images left: {:?}", list(c).await);
    assert!(
        d.snapshot_dirs().is_empty(),
        "snapshots left: {:?}",
        d.snapshot_dirs()
    );
    for dir in ["content/ingest", "content/blobs/sha256"] {
        let left: Vec<_> = std::fs::read_dir(d.root().join(dir))
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir} left: {left:?}");
    }
}

/// berthd still answers and still pulls.
async fn assert_serving(d: &Daemon, c: &berth::client::CriClient) {
    pull(c, &image("busybox"))
        .await
        .unwrap_or_else(|e| panic!("berthd no longer pulls: {e:?}\n{}", tail(&d.log(), 4000)));
}

/// A memory cgroup of 512 MiB under the test's own, holding berthd; removed when dropped.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    const LIMIT: u64 = 512 << 20;

    fn new(tag: &str) -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let v1 = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')))
        });
        let name = format!("berth-hostile-{tag}-{}", std::process::id());
        let (dir, files): (PathBuf, &[&str]) = match v1 {
            Some(base) => (
                base.join(name),
                &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
            ),
            None => {
                let path = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .expect("no memory cgroup: refusing to run a memory attack unbounded");
                (
                    PathBuf::from("/sys/fs/cgroup")
                        .join(path.trim_start_matches('/'))
                        .join(name),
                    &["memory.max", "memory.swap.max"],
                )
            }
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "creating memory cgroup {}: {e}: refusing to run a memory attack unbounded",
                dir.display()
            )
        });
        let limit = Self::LIMIT.to_string();
        std::fs::write(dir.join(files[0]), &limit)
            .unwrap_or_else(|e| panic!("limiting {}: {e}", dir.display()));
        // No swap to spill into (absent when the kernel does not account swap).
        let _ = std::fs::write(
            dir.join(files[1]),
            if files[1] == "memory.swap.max" {
                "0".to_string()
            } else {
                limit
            },
        );
        Self(dir)
    }

    /// Moves `pid` (all its threads) into the cgroup.
    fn hold(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving berthd into {}: {e}", self.0.display()));
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// berthd for `reg` inside `cgroup`.
fn bounded_daemon(cgroup: &MemoryCgroup, reg: Option<&FakeRegistry>) -> Daemon {
    let d = match reg {
        Some(reg) => daemon_for(reg, &[]),
        None => Daemon::start(),
    };
    cgroup.hold(d.child.as_ref().expect("berthd runs").id());
    d
}

/// A GNU long-name header declaring `size` bytes of name.
fn long_name_header(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_path("././@LongLink").expect("path");
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    h.as_bytes().to_vec()
}

#[tokio::test]
async fn a_config_or_manifest_of_absurd_size_is_refused_before_it_is_fetched() {
    let (config_body, config_digest) = config(&[]);
    let mut content = Content::default();
    // (1) A manifest whose config declares 2^62 bytes.
    content.manifest(
        "hostile/config",
        "1",
        OCI_MANIFEST,
        manifest(
            descriptor(OCI_CONFIG, &config_digest, 1 << 62),
            serde_json::json!([]),
        ),
    );
    let served = config_body.clone();
    content.blob(&config_digest, move || Body::Bytes(served.clone()));
    // (2) An index whose manifest declares 2^62 bytes.
    let child = "sha256:".to_string() + &"ab".repeat(32);
    let (arch, variant) = berth::image::manifest::host_platform();
    content.manifest(
        "hostile/index",
        "1",
        OCI_INDEX,
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [{
                "mediaType": OCI_MANIFEST, "digest": child, "size": 1u64 << 62,
                "platform": {"os": "linux", "architecture": arch, "variant": variant},
            }],
        }))
        .expect("index"),
    );
    // (3) A 5 MiB manifest (padded with whitespace, valid JSON).
    let mut big = manifest(
        descriptor(OCI_CONFIG, &config_digest, config_body.len() as u64),
        serde_json::json!([]),
    );
    big.extend(std::iter::repeat_n(b' ', 5 << 20));
    content.manifest("hostile/big-manifest", "1", OCI_MANIFEST, big);
    let reg = content.serve();
    let d = daemon_for(&reg, &[]);
    let c = d.client().await;

    for (repo, what) in [
        ("hostile/config", "4611686018427387904"),
        ("hostile/index", "4611686018427387904"),
        ("hostile/big-manifest", "bytes"),
    ] {
        let reference = format!("{}/{repo}:1", reg.addr());
        let e = pull_with(&c, &reference, None).await.expect_err("refused");
        assert_eq!(e.code(), Code::FailedPrecondition, "{reference}: {e:?}");
        assert!(
            e.message().contains(&reference) && e.message().contains(what),
            "{reference}: {}",
            e.message()
        );
        assert_nothing_left(&d, &c).await;
    }
    let fetched: Vec<String> = reg
        .requests()
        .into_iter()
        .filter(|r| r.path.contains(&config_digest) || r.path.contains(&child))
        .map(|r| r.path)
        .collect();
    assert!(fetched.is_empty(), "fetched despite its size: {fetched:?}");
    assert_serving(&d, &c).await;
}

#[tokio::test]
async fn a_layer_with_a_huge_long_name_record_fails_the_pull_and_berthd_stays_up() {
    let layer_size = 512 + HUGE_RECORD + 1024;
    // Whatever digest: the layer is refused long before its end.
    let layer_digest = "sha256:".to_string() + &"cd".repeat(32);
    let diff_id = "sha256:".to_string() + &"ef".repeat(32);
    let (config_body, config_digest) = config(std::slice::from_ref(&diff_id));
    let mut content = Content::default();
    content.manifest(
        "hostile/long-name",
        "1",
        OCI_MANIFEST,
        manifest(
            descriptor(OCI_CONFIG, &config_digest, config_body.len() as u64),
            serde_json::json!([descriptor(LAYER_TAR, &layer_digest, layer_size)]),
        ),
    );
    content.blob(&config_digest, move || Body::Bytes(config_body.clone()));
    content.blob(&layer_digest, || Body::Lazy {
        head: long_name_header(HUGE_RECORD),
        zeros: HUGE_RECORD + 1024,
    });
    let reg = content.serve();
    let cgroup = MemoryCgroup::new("pull");
    let d = bounded_daemon(&cgroup, Some(&reg));
    let c = d.client().await;

    let reference = format!("{}/hostile/long-name:1", reg.addr());
    let started = Instant::now();
    let e = pull_with(&c, &reference, None).await.expect_err("refused");
    assert_eq!(
        e.code(),
        Code::FailedPrecondition,
        "{e:?}\n{}",
        tail(&d.log(), 4000)
    );
    assert!(
        e.message().contains(&reference) && e.message().contains("GNU long name"),
        "{}",
        e.message()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused only after {:?}",
        started.elapsed()
    );
    assert_nothing_left(&d, &c).await;
    assert_serving(&d, &c).await;
}

#[tokio::test]
async fn an_archive_with_a_huge_long_name_record_is_refused_on_import() {
    let cgroup = MemoryCgroup::new("import");
    let d = bounded_daemon(&cgroup, None);
    let c = d.client().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("-r")
        .arg(format!("unix://{}", d.socket().display()))
        .args(["image", "import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berthctl");
    let mut stdin = child.stdin.take().expect("stdin");
    // The archive is generated as berthctl reads it: a header, then zeros until refused.
    let writer = std::thread::spawn(move || {
        if stdin.write_all(&long_name_header(HUGE_RECORD)).is_err() {
            return;
        }
        let zeros = vec![0u8; 256 * 1024];
        let mut left = HUGE_RECORD + 1024;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            if stdin.write_all(&zeros[..n]).is_err() {
                return;
            }
            left -= n as u64;
        }
    });
    let out = child.wait_with_output().expect("berthctl");
    let _ = writer.join();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "imported: {said}");
    assert!(
        said.contains("refusing") && said.contains("GNU long name"),
        "{said}\n{}",
        tail(&d.log(), 4000)
    );
    assert_nothing_left(&d, &c).await;
    assert_serving(&d, &c).await;
}

#[tokio::test]
async fn a_small_layer_that_unpacks_past_the_limit_is_refused_and_leaves_nothing() {
    // 64 MiB of zeros in one file: a few KiB of zstd.
    let mut builder = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(64 << 20);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_600_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut h, "zeros", std::io::repeat(0).take(64 << 20))
        .expect("tar");
    let tar = builder.into_inner().expect("tar");
    let diff_id = digest(&tar);
    let blob = zstd::encode_all(&tar[..], 19).expect("zstd");
    assert!(blob.len() < 64 * 1024, "{} bytes", blob.len());
    let layer_digest = digest(&blob);
    let (config_body, config_digest) = config(std::slice::from_ref(&diff_id));
    let mut content = Content::default();
    content.manifest(
        "hostile/bomb",
        "1",
        OCI_MANIFEST,
        manifest(
            descriptor(OCI_CONFIG, &config_digest, config_body.len() as u64),
            serde_json::json!([descriptor(LAYER_ZSTD, &layer_digest, blob.len() as u64)]),
        ),
    );
    content.blob(&config_digest, move || Body::Bytes(config_body.clone()));
    content.blob(&layer_digest, move || Body::Bytes(blob.clone()));
    let reg = content.serve();
    let reference = format!("{}/hostile/bomb:1", reg.addr());

    let dir = TempDir::new("layer-limit");
    let config_file = dir.path().join("config.toml");
    std::fs::write(
        &config_file,
        "[images]\nmax_unpacked_layer_bytes = 16777216\n",
    )
    .expect("config");
    let d = daemon_for(&reg, &["--config", &config_file.to_string_lossy()]);
    let c = d.client().await;
    let e = pull_with(&c, &reference, None).await.expect_err("refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    for part in [
        reference.as_str(),
        layer_digest.as_str(),
        "16777216",
        "max_unpacked_layer_bytes",
    ] {
        assert!(e.message().contains(part), "{part}: {}", e.message());
    }
    assert_nothing_left(&d, &c).await;
    assert!(status(&c, &reference).await.is_none());
    assert_serving(&d, &c).await;
    drop(d);

    // The same image is sound: without the limit it pulls.
    let d = daemon_for(&reg, &[]);
    let c = d.client().await;
    pull_with(&c, &reference, None)
        .await
        .expect("the image pulls without a limit");
}

/// A gzip layer holding one file `name` with `body`: (blob, its digest, its diff id).
fn small_layer(name: &str, body: &[u8]) -> (Vec<u8>, String, String) {
    let mut builder = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_600_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut h, name, body).expect("tar");
    let tar = builder.into_inner().expect("tar");
    let diff_id = digest(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    let blob = gz.finish().expect("gzip");
    let d = digest(&blob);
    (blob, d, diff_id)
}

#[tokio::test]
async fn a_registry_that_stops_sending_fails_the_pull_with_deadline_exceeded_naming_the_layer() {
    // Two layers: the first arrives whole, the second sends half its bytes and then nothing.
    let (sound, sound_digest, sound_diff) = small_layer("sound", &[7u8; 4096]);
    let random: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (stalled, stalled_digest, stalled_diff) = small_layer("stalls", &random);
    let (config_body, config_digest) = config(&[sound_diff, stalled_diff]);
    let mut content = Content::default();
    content.manifest(
        "slow/stalls",
        "1",
        OCI_MANIFEST,
        manifest(
            descriptor(OCI_CONFIG, &config_digest, config_body.len() as u64),
            serde_json::json!([
                descriptor(LAYER_GZIP, &sound_digest, sound.len() as u64),
                descriptor(LAYER_GZIP, &stalled_digest, stalled.len() as u64),
            ]),
        ),
    );
    content.blob(&config_digest, move || Body::Bytes(config_body.clone()));
    content.blob(&sound_digest, move || Body::Bytes(sound.clone()));
    content.blob(&stalled_digest, move || Body::Stall {
        head: stalled[..stalled.len() / 2].to_vec(),
        len: stalled.len() as u64,
    });
    let reg = content.serve();
    let reference = format!("{}/slow/stalls:1", reg.addr());

    let dir = TempDir::new("pull-stall");
    let config_file = dir.path().join("config.toml");
    std::fs::write(&config_file, "[images]\npull_progress_timeout_secs = 2.0\n").expect("config");
    let d = daemon_for(&reg, &["--config", &config_file.to_string_lossy()]);
    let c = d.client().await;
    let started = Instant::now();
    let e = pull_with(&c, &reference, None)
        .await
        .expect_err("a stalled pull fails");
    eprintln!("stalled pull failed after {:?}", started.elapsed());
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    for part in [
        reference.as_str(),
        stalled_digest.as_str(),
        "pull_progress_timeout_secs",
    ] {
        assert!(e.message().contains(part), "{part}: {}", e.message());
    }
    assert_nothing_left(&d, &c).await;
    assert!(status(&c, &reference).await.is_none());
    assert_serving(&d, &c).await;
}

#[tokio::test]
async fn a_requests_credentials_are_not_offered_to_a_mirror() {
    // A mirror of the test registry that asks for Basic credentials and has nothing.
    let mirror = FakeRegistry::start(|r: &Request| {
        if r.path == "/v2/" {
            return Response {
                status: 401,
                headers: vec![("WWW-Authenticate".into(), "Basic realm=\"mirror\"".into())],
                body: Body::Bytes(Vec::new()),
            };
        }
        Response::not_found()
    });
    let d = Daemon::start();
    let hosts = d.dir.path().join("certs.d").join(registry());
    std::fs::create_dir_all(&hosts).expect("hosts dir");
    std::fs::write(
        hosts.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n[host.\"http://{}\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            registry(),
            mirror.addr()
        ),
    )
    .expect("hosts.toml");
    let c = d.client().await;
    let auth = cri::AuthConfig {
        username: "pod-owner".into(),
        password: "not-for-the-mirror".into(),
        ..Default::default()
    };
    pull_with(&c, &image("busybox"), Some(auth))
        .await
        .expect("pulled from the registry after the mirror");
    let requests = mirror.requests();
    assert!(
        requests.iter().any(|r| r.path.contains("/manifests/")),
        "the mirror was never asked: {requests:?}"
    );
    let offered: Vec<&Request> = requests
        .iter()
        .filter(|r| r.header("authorization").is_some())
        .collect();
    assert!(
        offered.is_empty(),
        "credentials sent to the mirror: {offered:?}"
    );
}
