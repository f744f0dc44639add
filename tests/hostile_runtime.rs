//! Hostile requests and images against the runtime's spec side, played through CRI against a
//! real berthd: the reserved id 4294967295 (an image `User` pulled or imported, a passwd entry,
//! a request's ids), `linux.resources.unified` keys that climb out of the container's cgroup,
//! an image whose /etc/passwd is a FIFO, a device or oversized, a CRI log path that is a
//! symlink to a file the test owns, and the cgroup namespace containers get. Each attack aims
//! at marker files in a temp directory, never at a host file that matters.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use berth::client::CriClient;
use common::*;
use k8s_cri::v1 as cri;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tonic::Code;

/// A repository of its own on the test registry holding one crafted image (busybox with a
/// changed config `User` and an optional extra layer), removed from the registry on drop.
struct Crafted {
    repo: String,
}

/// One entry of a crafted layer.
enum Entry<'a> {
    File(&'a str, Vec<u8>),
    Fifo(&'a str),
    Symlink(&'a str, &'a str),
    CharDevice(&'a str, u32, u32),
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q"])
        .args(args)
        .output()
        .expect("skopeo (Debian's skopeo package)");
    assert!(
        out.status.success(),
        "skopeo copy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An uncompressed layer tar of `entries` (root-owned, fixed times).
fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_704_067_200);
        h.set_mode(0o644);
        h.set_size(0);
        let (path, data): (&str, &[u8]) = match e {
            Entry::File(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                (p, data)
            }
            Entry::Fifo(p) => {
                h.set_entry_type(tar::EntryType::Fifo);
                (p, &[])
            }
            Entry::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_link_name(target).expect("link name");
                h.set_mode(0o777);
                (p, &[])
            }
            Entry::CharDevice(p, major, minor) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_device_major(*major).expect("major");
                h.set_device_minor(*minor).expect("minor");
                (p, &[])
            }
        };
        h.set_path(path).expect("path");
        h.set_cksum();
        b.append(&h, data).expect("tar entry");
    }
    b.into_inner().expect("tar")
}

impl Crafted {
    /// Pushes the test busybox with config `User` set to `user` and, when `entries` is not
    /// empty, one more layer holding them.
    fn push(tag: &str, user: &str, entries: &[Entry<'_>]) -> Self {
        let mut buf = [0u8; 4];
        getrandom::fill(&mut buf).expect("random");
        let me = Self {
            repo: format!("hostile-runtime-{tag}-{}", hex::encode(buf)),
        };
        let dir = TempDir::new("crafted");
        let layout = dir.path().join("layout");
        let base = format!("oci:{}:base", layout.display());
        skopeo(&[
            "--src-tls-verify=false",
            &format!("docker://{}", image("busybox")),
            &base,
        ]);
        let blob = |digest: &str| -> PathBuf {
            layout
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"))
        };
        let write_blob = |bytes: &[u8]| -> String {
            let digest = sha256(bytes);
            std::fs::write(blob(&digest), bytes).expect("blob");
            digest
        };
        let read_json = |digest: &str| -> Value {
            serde_json::from_slice(&std::fs::read(blob(digest)).expect("blob")).expect("JSON")
        };
        let index = read_json_file(&layout.join("index.json"));
        let top = index["manifests"][0]["digest"]
            .as_str()
            .expect("manifest digest")
            .to_string();
        let mut manifest = read_json(&top);
        let mut config = read_json(manifest["config"]["digest"].as_str().expect("config"));
        config["config"]["User"] = json!(user);
        if !entries.is_empty() {
            let tar = layer(entries);
            let digest = write_blob(&tar);
            manifest["layers"]
                .as_array_mut()
                .expect("layers")
                .push(json!({
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest,
                    "size": tar.len(),
                }));
            config["rootfs"]["diff_ids"]
                .as_array_mut()
                .expect("diff_ids")
                .push(json!(digest));
            if let Some(h) = config["history"].as_array_mut() {
                h.push(json!({"created": "2024-01-01T00:00:00Z", "created_by": "hostile"}));
            }
        }
        let config_bytes = serde_json::to_vec(&config).expect("config JSON");
        manifest["config"]["digest"] = json!(write_blob(&config_bytes));
        manifest["config"]["size"] = json!(config_bytes.len());
        let manifest_bytes = serde_json::to_vec(&manifest).expect("manifest JSON");
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": manifest["mediaType"],
                "digest": write_blob(&manifest_bytes),
                "size": manifest_bytes.len(),
                "annotations": {"org.opencontainers.image.ref.name": "crafted"},
            }],
        });
        std::fs::write(
            layout.join("index.json"),
            serde_json::to_vec(&index).expect("index JSON"),
        )
        .expect("index.json");
        skopeo(&[
            "--dest-tls-verify=false",
            &format!("oci:{}:crafted", layout.display()),
            &format!("docker://{}", me.reference()),
        ]);
        me
    }

    fn reference(&self) -> String {
        image(&format!("{}:latest", self.repo))
    }
}

impl Drop for Crafted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(registry_storage().join(format!(
            "data/docker/registry/v2/repositories/{}",
            self.repo
        )));
    }
}

fn read_json_file(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).expect("read")).expect("JSON")
}

/// A daemon and one pod of the busybox test image.
struct Env {
    d: Daemon,
    c: CriClient,
    logs: PathBuf,
    pod: String,
    pod_config: cri::PodSandboxConfig,
}

impl Env {
    async fn new(name: &str) -> Self {
        let d = Daemon::start();
        let c = d.client().await;
        pull(&c, &image("busybox")).await.expect("pull busybox");
        let logs = d.dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let mut pod_config = pod_config(name, &logs, cri::NamespaceMode::Container);
        if let Some(l) = pod_config.linux.as_mut() {
            l.cgroup_parent = format!("/berth-it-{name}-{}", std::process::id());
        }
        let pod = run_pod(&c, &pod_config).await;
        Self {
            d,
            c,
            logs,
            pod,
            pod_config,
        }
    }

    /// CreateContainer as it answers.
    async fn create(&self, config: cri::ContainerConfig) -> Result<String, tonic::Status> {
        self.c
            .runtime()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: self.pod.clone(),
                config: Some(config),
                sandbox_config: Some(self.pod_config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    async fn start(&self, id: &str) {
        self.c
            .runtime()
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .expect("StartContainer");
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    async fn end(self) {
        remove_pod(&self.c, &self.pod).await;
        drop(self.d);
    }
}

/// A `sh -c script` container of `image`.
fn container(name: &str, image: &str, script: &str) -> cri::ContainerConfig {
    sh_container(name, image, script, cri::NamespaceMode::Container)
}

fn security(c: &mut cri::ContainerConfig) -> &mut cri::LinuxContainerSecurityContext {
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

/// The error of a call that had to fail with `code`, its message holding every one of `needles`.
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, needles: &[&str]) {
    let e = r.expect_err("the call must be refused");
    assert_eq!(e.code(), code, "{}", e.message());
    for n in needles {
        assert!(e.message().contains(n), "{:?} lacks {n:?}", e.message());
    }
}

/// (a) CVE-2024-40635's class: uid or gid 4294967295 is `setuid(-1)`, "keep the current id",
/// so the container would run as uid 0 while the image reports 4294967295 to the kubelet's
/// runAsNonRoot check. The images are refused at pull, a passwd entry with that uid and the
/// request's ids at create; nothing runs.
#[tokio::test]
async fn the_reserved_id_never_runs_as_root() {
    let env = Env::new("reserved-id").await;
    for (tag, user) in [("uid", "4294967295"), ("gid", "0:4294967295")] {
        let img = Crafted::push(tag, user, &[]);
        let r = img.reference();
        refused(
            pull(&env.c, &r).await,
            Code::InvalidArgument,
            &[&img.repo, "4294967295", "not a valid id"],
        );
        assert!(status(&env.c, &r).await.is_none(), "{r} was recorded");
        // The same image from an archive, through the import that reads the same config.
        let dir = TempDir::new("reserved-archive");
        let archive = dir.path().join("image.tar");
        skopeo(&[
            "--src-tls-verify=false",
            &format!("docker://{r}"),
            &format!("oci-archive:{}:{r}", archive.display()),
        ]);
        let out = Command::new(env!("CARGO_BIN_EXE_berthctl"))
            .arg("-r")
            .arg(format!("unix://{}", env.d.socket().display()))
            .args(["image", "import"])
            .arg(&archive)
            .output()
            .expect("run berthctl");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "import of {user:?} succeeded");
        assert!(
            stderr.contains("4294967295") && stderr.contains("not a valid id"),
            "{stderr}"
        );
        assert!(status(&env.c, &r).await.is_none(), "{r} was imported");
    }

    // A named user whose passwd entry carries the reserved uid: the image reports a name
    // (nothing for runAsNonRoot to read), and the old runtime ran it as root.
    let passwd = b"root:x:0:0:root:/root:/bin/sh\nevil:x:4294967295:4294967295::/:/bin/sh\n";
    let img = Crafted::push(
        "passwd",
        "evil",
        &[Entry::File("etc/passwd", passwd.to_vec())],
    );
    pull(&env.c, &img.reference()).await.expect("pull");
    let config = container("evil-passwd", &img.reference(), "id > /dev/stderr");
    refused(
        env.create(config).await,
        Code::InvalidArgument,
        &["evil-passwd", "/etc/passwd", "4294967295"],
    );
    assert_eq!(env.log("evil-passwd"), "", "the container ran");

    // The request's own ids.
    type Set = fn(&mut cri::LinuxContainerSecurityContext);
    let cases: [(&str, &str, Set); 3] = [
        ("run-as-user", "run_as_user", |sc| {
            sc.run_as_user = Some(cri::Int64Value { value: 4294967295 })
        }),
        ("run-as-group", "run_as_group", |sc| {
            sc.run_as_user = Some(cri::Int64Value { value: 1000 });
            sc.run_as_group = Some(cri::Int64Value { value: 4294967295 });
        }),
        ("supplemental", "supplemental_groups", |sc| {
            sc.run_as_user = Some(cri::Int64Value { value: 1000 });
            sc.supplemental_groups = vec![4294967295];
        }),
    ];
    for (name, field, set) in cases {
        let mut config = container(name, &image("busybox"), "id > /dev/stderr");
        set(security(&mut config));
        refused(
            env.create(config).await,
            Code::InvalidArgument,
            &[name, field, "4294967295"],
        );
        assert_eq!(env.log(name), "", "{name} ran");
    }
    assert!(list_containers(&env.c).await.is_empty());
    env.end().await;
}

/// A directory holding one marker file with known content; the attack aims at the marker.
fn marker() -> (TempDir, PathBuf, String) {
    let dir = TempDir::new("runtime-marker");
    let path = dir.path().join("marker");
    let content = format!("untouched {}", dir.unique_name());
    std::fs::write(&path, &content).expect("marker");
    (dir, path, content)
}

/// (b) A unified key is joined to the container's cgroup directory and written: one that climbs
/// out would write any host file on cgroup v2. The key aims at the test's marker through as
/// many `..` as any cgroup depth needs; create and update both refuse it by the same check.
#[tokio::test]
async fn unified_keys_never_leave_the_cgroup() {
    let env = Env::new("unified").await;
    let (_dir, marker, content) = marker();
    let relative = marker.strip_prefix("/").expect("absolute temp dir");
    let key = format!("{}{}", "../".repeat(24), relative.display());
    let with_key = |name: &str, key: &str| {
        let mut config = container(name, &image("busybox"), "sleep 60");
        config
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
            .unified = [(key.to_string(), "pwned".to_string())].into();
        config
    };
    refused(
        env.create(with_key("climber", &key)).await,
        Code::InvalidArgument,
        &["climber", "unified", &key],
    );
    refused(
        env.create(with_key("procs", "cgroup.procs")).await,
        Code::InvalidArgument,
        &["cgroup.procs"],
    );
    assert!(list_containers(&env.c).await.is_empty());

    // The same key in an update of a running container.
    let id = env
        .create(container("plain", &image("busybox"), "sleep 60"))
        .await
        .expect("CreateContainer");
    env.start(&id).await;
    let update = env
        .c
        .runtime()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(cri::LinuxContainerResources {
                unified: [(key.clone(), "pwned".to_string())].into(),
                ..Default::default()
            }),
            windows: None,
            annotations: Default::default(),
        })
        .await;
    refused(update, Code::InvalidArgument, &["unified", &key]);
    assert_eq!(std::fs::read_to_string(&marker).expect("marker"), content);
    env.end().await;
}

/// (c) The user lookup reads the image's /etc/passwd as root on the host. A FIFO there (or a
/// link to one) would block that read, a device would feed it without end, and a huge file
/// would be read whole; each is refused with the file and image named, and in bounded time.
#[tokio::test]
async fn special_or_huge_passwd_files_are_refused_in_bounded_time() {
    let env = Env::new("passwd").await;
    let mut huge = vec![b'#'; 5 << 20];
    huge.extend_from_slice(b"\napp:x:1000:1000::/:/bin/sh\n");
    let cases: Vec<(&str, Vec<Entry<'_>>, &str)> = vec![
        ("fifo", vec![Entry::Fifo("etc/passwd")], "FIFO"),
        (
            "fifo-link",
            vec![
                Entry::Fifo("etc/pipe"),
                Entry::Symlink("etc/passwd", "/etc/pipe"),
            ],
            "FIFO",
        ),
        (
            "device-link",
            vec![
                Entry::CharDevice("etc/zero", 1, 5),
                Entry::Symlink("etc/passwd", "../etc/zero"),
            ],
            "character device",
        ),
        (
            "huge",
            vec![Entry::File("etc/passwd", huge)],
            "over the 4194304 bytes",
        ),
    ];
    for (tag, entries, why) in cases {
        let img = Crafted::push(tag, "app", &entries);
        pull(&env.c, &img.reference()).await.expect("pull");
        let name = format!("passwd-{tag}");
        let config = container(&name, &img.reference(), "id > /dev/stderr");
        let r = tokio::time::timeout(Duration::from_secs(30), env.create(config))
            .await
            .unwrap_or_else(|_| panic!("{tag}: CreateContainer hung on the image's /etc/passwd"));
        refused(
            r,
            Code::InvalidArgument,
            &[&name, "/etc/passwd", &img.repo, why],
        );
    }
    assert!(list_containers(&env.c).await.is_empty());
    env.end().await;
}

/// (d) The CRI log path lies in the pod's log directory, which a pod with a hostPath on it can
/// fill with symlinks: a log whose last component is a symlink to the test's marker is refused
/// at create, and a log swapped for such a symlink is not reopened; the marker stays as it was.
#[tokio::test]
async fn a_symlinked_log_path_is_never_written_through() {
    let env = Env::new("log-link").await;
    let (_dir, marker, content) = marker();
    std::os::unix::fs::symlink(&marker, env.logs.join("linked.log")).expect("symlink");
    let config = container("linked", &image("busybox"), "echo pwned; sleep 60");
    refused(
        env.create(config).await,
        Code::Internal,
        &["linked.log", "symbolic link"],
    );
    assert_eq!(std::fs::read_to_string(&marker).expect("marker"), content);

    // A log path that leaves the pod's log directory: absolute, or climbing out of it.
    for bad in [
        marker.display().to_string(),
        format!("../../../../../../../..{}", marker.display()),
    ] {
        let mut config = container("escaping", &image("busybox"), "echo pwned; sleep 60");
        config.log_path = bad.clone();
        refused(
            env.create(config).await,
            Code::InvalidArgument,
            &["log_path", &bad],
        );
        assert_eq!(
            std::fs::read_to_string(&marker).expect("marker"),
            content,
            "{bad}"
        );
    }

    // A running container's log replaced by a link before a rotation's reopen.
    let script = "while true; do echo pwned; sleep 0.1; done";
    let id = env
        .create(container("rotated", &image("busybox"), script))
        .await
        .expect("CreateContainer");
    env.start(&id).await;
    let log = env.logs.join("rotated.log");
    std::fs::remove_file(&log).expect("remove log");
    std::os::unix::fs::symlink(&marker, &log).expect("symlink");
    let reopen = env
        .c
        .runtime()
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await;
    let e = reopen.expect_err("the reopen must be refused");
    assert!(e.message().contains("symbolic link"), "{}", e.message());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(std::fs::read_to_string(&marker).expect("marker"), content);
    env.end().await;
}

/// On a pure cgroup v2 host a container gets its own cgroup namespace: its /proc/self/cgroup
/// reads `0::/` and /sys/fs/cgroup is its own cgroup. On cgroup v1 and hybrid hosts, and for
/// privileged containers, it keeps the host's, as containerd does.
#[tokio::test]
async fn the_cgroup_namespace_is_private_on_pure_v2_only() {
    let env = Env::new("cgroupns").await;
    let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let host_ns = std::fs::read_link("/proc/self/ns/cgroup").expect("host cgroup ns");
    let host_ns = host_ns.to_string_lossy().into_owned();
    let script =
        "readlink /proc/self/ns/cgroup; cat /proc/self/cgroup; ls /sys/fs/cgroup; sleep 60";
    let id = env
        .create(container("plain", &image("busybox"), script))
        .await
        .expect("CreateContainer");
    env.start(&id).await;
    let mut privileged = container("privileged", &image("busybox"), script);
    security(&mut privileged).privileged = true;
    let pid = env.create(privileged).await.expect("CreateContainer");
    env.start(&pid).await;
    let mut logs = (String::new(), String::new());
    for _ in 0..100 {
        logs = (env.log("plain"), env.log("privileged"));
        if logs.0.contains("cgroup:[") && logs.1.contains("cgroup:[") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logs.1.contains(&host_ns), "privileged: {}", logs.1);
    if pure_v2 {
        assert!(!logs.0.contains(&host_ns), "{}", logs.0);
        assert!(logs.0.contains(" 0::/\n"), "{}", logs.0);
        assert!(logs.0.contains("cgroup.procs"), "{}", logs.0);
    } else {
        assert!(logs.0.contains(&host_ns), "{}", logs.0);
    }
    env.end().await;
}
