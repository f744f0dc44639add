//! Test harness: a real berthd in its own temp root, state dir and socket, and the local registries.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth::client::CriClient;
use k8s_cri::v1 as cri;

/// The plain-HTTP test registry (`make test` starts it and pushes the test images).
pub fn registry() -> String {
    std::env::var("BERTH_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5050".into())
}

/// The htpasswd-protected test registry.
pub fn auth_registry() -> String {
    std::env::var("BERTH_TEST_AUTH_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5051".into())
}

/// Credentials of the protected registry.
pub fn auth_creds() -> (String, String) {
    let c = std::env::var("BERTH_TEST_AUTH_CREDS").unwrap_or_else(|_| "berth:berth-secret".into());
    let (u, p) = c.split_once(':').unwrap_or(("berth", "berth-secret"));
    (u.to_string(), p.to_string())
}

/// Storage directory of the plain registry (for tests that copy it).
pub fn registry_storage() -> PathBuf {
    PathBuf::from(
        std::env::var("BERTH_TEST_REGISTRY_DIR").unwrap_or_else(|_| "/tmp/berth-reg-plain".into()),
    )
}

/// Repository root (for hack/ scripts).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `registry/name` on the plain test registry.
pub fn image(name: &str) -> String {
    format!("{}/{name}", registry())
}

/// A unique temp directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let mut buf = [0u8; 4];
        getrandom::fill(&mut buf).expect("random");
        let p = std::env::temp_dir().join(format!("berth-it-{tag}-{}", hex::encode(buf)));
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The directory's unique name without the `berth-it-` prefix (`<tag>-<random>`).
    pub fn unique_name(&self) -> String {
        self.0
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .trim_start_matches("berth-it-")
            .to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        unmount_below(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Unmounts every mount point under `dir` (deepest first).
pub fn unmount_below(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.to_string_lossy().to_string();
    let mut points: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(&p).status();
    }
}

/// A running berthd.
pub struct Daemon {
    pub dir: TempDir,
    pub child: Option<Child>,
    pub extra_args: Vec<String>,
}

impl Daemon {
    /// Starts berthd with the test registries configured as plain HTTP.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let dir = TempDir::new("daemon");
        let mut d = Self {
            dir,
            child: None,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
        };
        d.spawn();
        d
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("state/berth.sock")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("berthd.log")
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The berthd command line for this daemon's dirs.
    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berthd"));
        c.arg("--root")
            .arg(self.root())
            .arg("--state-dir")
            .arg(self.state())
            .arg("--socket")
            .arg(self.socket())
            .arg("--log-level")
            .arg("debug")
            .arg("--insecure-registry")
            .arg(registry())
            .arg("--insecure-registry")
            .arg(auth_registry());
        if !self.extra_args.iter().any(|a| a == "--registry-config-dir") {
            c.arg("--registry-config-dir")
                .arg(self.dir.path().join("certs.d"));
        }
        // No pod network unless the test sets one up (never the host's /etc/cni/net.d).
        if !self.extra_args.iter().any(|a| a == "--cni-conf-dir") {
            c.arg("--cni-conf-dir").arg(self.dir.path().join("no-cni"));
        }
        // The embedded agent only where a test asks for it (its port and manifest dir are global).
        let wants_agent = self
            .extra_args
            .iter()
            .any(|a| a == "--manifest-dir" || a == "--agent-address");
        if !wants_agent && !self.extra_args.iter().any(|a| a == "--no-agent") {
            c.arg("--no-agent");
        }
        c.args(&self.extra_args);
        c
    }

    /// Starts (again) and waits for the socket to answer.
    pub fn spawn(&mut self) {
        self.child = Some(spawn_logged(&mut self.command(), &self.log_path()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("berthd exited at start ({status}):\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("berthd did not open its socket in 20 s:\n{}", self.log());
    }

    /// Sends SIGTERM and waits.
    pub fn stop(&mut self) {
        if let Some(c) = self.child.take() {
            terminate(c);
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn client(&self) -> CriClient {
        CriClient::connect(&self.socket())
            .await
            .expect("connect to berthd")
    }

    /// Directories of snapshots on disk.
    pub fn snapshot_dirs(&self) -> Vec<String> {
        settled_entries(&self.root().join("snapshotter/snapshots"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        kill_leftovers(self.dir.path());
    }
}

/// SIGTERM, as a service manager stops a daemon; SIGKILL if it is still there after 15 s.
pub fn terminate(mut c: Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(c.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// PodSandboxStatus of `id` (not verbose); panics on error.
pub async fn sandbox_status(c: &CriClient, id: &str) -> cri::PodSandboxStatus {
    c.runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .expect("status")
}

/// Spawns `cmd` with stdout and stderr appended to the file `log`.
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let err = file.try_clone().expect("log clone");
    cmd.stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()))
}

/// Kills whatever a daemon rooted in `dir` left running (a test that failed half-way):
/// every process in its containers' cgroups, its shims, and its pods' init processes; then
/// removes the containers' cgroups. Mounts go with the TempDir.
pub fn kill_leftovers(dir: &Path) {
    let kill = |pid: &str| {
        let _ = Command::new("kill").arg("-KILL").arg(pid).status();
    };
    let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let mut container_cgroups = Vec::new();
    let bundles = std::fs::read_dir(dir.join("root/containers"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    for bundle in bundles {
        let Some(path) = std::fs::read(bundle.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["linux"]["cgroupsPath"].as_str().map(str::to_string))
        else {
            continue;
        };
        let rel = path.trim_start_matches('/').to_string();
        for h in &hierarchies {
            // cgroup v2 (pure) keeps cgroup.procs at the top; v1 has one dir per controller.
            let cg = h.join(&rel);
            if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
                procs.lines().for_each(kill);
                container_cgroups.push(cg);
            }
        }
    }
    let needle = dir.to_string_lossy().to_string();
    let pinned_pid_namespaces: Vec<u64> = std::fs::read_dir(dir.join("state/sandboxes"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::metadata(e.path().join("pidns")).ok())
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .collect()
        })
        .unwrap_or_default();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        let pod_init = std::fs::metadata(entry.path().join("ns/pid"))
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .is_ok_and(|ino| pinned_pid_namespaces.contains(&ino))
            && cmdline.starts_with("berth-pod-init");
        if (cmdline.contains("berth-shim") && cmdline.contains(&needle)) || pod_init {
            kill(&pid);
        }
    }
    for cg in container_cgroups {
        for _ in 0..50 {
            if std::fs::remove_dir(&cg).is_ok() || !cg.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn spec(image: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

pub async fn pull(c: &CriClient, image: &str) -> Result<String, tonic::Status> {
    c.images()
        .pull_image(cri::PullImageRequest {
            image: spec(image),
            auth: None,
            sandbox_config: None,
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

pub async fn status(c: &CriClient, image: &str) -> Option<cri::Image> {
    c.images()
        .image_status(cri::ImageStatusRequest {
            image: spec(image),
            verbose: false,
        })
        .await
        .expect("image status")
        .into_inner()
        .image
}

pub async fn list(c: &CriClient) -> Vec<cri::Image> {
    c.images()
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .expect("list images")
        .into_inner()
        .images
}

/// Runs a hack/ script, panicking with its output on failure.
pub fn hack(script: &str, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(repo_root().join("hack").join(script))
        .args(args)
        .output()
        .expect("run hack script");
    assert!(
        out.status.success(),
        "hack/{script} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The names in `dir` (none when it is missing) once nothing moved aside for deletion
/// (`rm-*`: a removed container's bundle or snapshot, deleted after the call returned) is
/// left, or as they are after 10 s.
pub fn settled_entries(dir: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if !names.iter().any(|n| n.starts_with("rm-")) || Instant::now() > deadline {
            names.sort();
            return names;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `path` is a mount point.
pub fn mounted(path: &Path) -> bool {
    let p = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// Runs `nsenter ARGS`, panicking on failure; returns trimmed stdout.
pub fn nsenter(args: &[&str]) -> String {
    let out = Command::new("nsenter")
        .args(args)
        .output()
        .expect("nsenter");
    assert!(
        out.status.success(),
        "nsenter {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A pod config with its log directory (UTS/IPC/network pod-private, PID per `pid`).
pub fn pod_config(name: &str, log_dir: &Path, pid: cri::NamespaceMode) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: pid as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container running `sh -c script`, logging to `<name>.log`, PID namespace per `pid`.
pub fn sh_container(
    name: &str,
    image: &str,
    script: &str,
    pid: cri::NamespaceMode,
) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: pid as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every container ListContainers shows (no filter); panics on error.
pub async fn list_containers(c: &CriClient) -> Vec<cri::Container> {
    c.runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
}

/// Every pod sandbox ListPodSandbox shows (no filter); panics on error.
pub async fn list_pod_sandboxes(c: &CriClient) -> Vec<cri::PodSandbox> {
    c.runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
}

/// RunPodSandbox; panics on error.
pub async fn run_pod(c: &CriClient, config: &cri::PodSandboxConfig) -> String {
    c.runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id
}

/// CreateContainer; panics on error.
pub async fn create_container(
    c: &CriClient,
    pod: &str,
    pod_config: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> String {
    c.runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(pod_config.clone()),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id
}

/// CreateContainer + StartContainer; panics on error.
pub async fn run_container(
    c: &CriClient,
    pod: &str,
    pod_config: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> String {
    let id = create_container(c, pod, pod_config, config).await;
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("StartContainer");
    id
}

/// ExecSync `cmd` in container `id`.
pub async fn exec(
    c: &CriClient,
    id: &str,
    cmd: &[&str],
    timeout: i64,
) -> Result<cri::ExecSyncResponse, tonic::Status> {
    c.runtime()
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        })
        .await
        .map(|r| r.into_inner())
}

/// ExecSync that must succeed with exit 0; returns stdout.
pub async fn exec_ok(c: &CriClient, id: &str, cmd: &[&str]) -> String {
    let r = exec(c, id, cmd, 10).await.expect("ExecSync");
    assert_eq!(
        r.exit_code,
        0,
        "{cmd:?}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// ContainerStatus of `id`.
pub async fn container_status(
    c: &CriClient,
    id: &str,
) -> Result<cri::ContainerStatus, tonic::Status> {
    c.runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .map(|r| r.into_inner().status.unwrap_or_default())
}

/// The JSON of a verbose ContainerStatus' `info` key (pid, sandbox, spec, snapshot, bundle).
pub async fn container_info(c: &CriClient, id: &str) -> serde_json::Value {
    let verbose = c
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner();
    serde_json::from_str(verbose.info.get("info").expect("info key")).expect("info JSON")
}

/// Waits (up to 10 s) until container `id` exited; returns its status.
pub async fn wait_exited(c: &CriClient, id: &str) -> cri::ContainerStatus {
    for _ in 0..500 {
        let s = container_status(c, id).await.expect("ContainerStatus");
        if s.state == cri::ContainerState::ContainerExited as i32 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("container {id} did not exit");
}

/// Host pid of the shim of container `id`, if one runs.
pub fn find_shim(id: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("berth-shim") && cmd.contains(id) {
            return Some(pid);
        }
    }
    None
}

/// Host pid of the shim of container `id`.
pub fn shim_pid(id: &str) -> i32 {
    find_shim(id).unwrap_or_else(|| panic!("no shim for {id}"))
}

/// StopPodSandbox + RemovePodSandbox (which also stop and remove its containers).
pub async fn remove_pod(c: &CriClient, id: &str) {
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .expect("StopPodSandbox");
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .expect("RemovePodSandbox");
}

/// Answer of `GET /path` on `addr` (HTTP/1.0), retried for up to 10 s until there is one.
pub async fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut answer = String::new();
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(
            &addr.parse().expect("address"),
            Duration::from_secs(1),
        ) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes());
            let _ = s.read_to_string(&mut answer);
            if !answer.is_empty() {
                return answer;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answer
}

/// A cgroup path a test's daemon or kubelet makes its cgroups under, in every hierarchy;
/// removed deepest first on drop (after whatever ran in it was killed), even when the test
/// fails.
pub struct CgroupRoot {
    pub name: String,
}

impl CgroupRoot {
    /// Makes `name` (a path relative to each hierarchy's root) in every hierarchy.
    pub fn new(name: String) -> Self {
        for h in hierarchies() {
            let _ = std::fs::create_dir_all(h.join(&name));
        }
        CgroupRoot { name }
    }

    /// Only removes `name` on drop: the test's daemon makes it.
    pub fn made_by_the_test(name: String) -> Self {
        CgroupRoot { name }
    }
}

/// Every mounted cgroup hierarchy (v1 controllers and the v2 one).
pub fn hierarchies() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        if matches!(post.split(' ').next(), Some("cgroup" | "cgroup2"))
            && let Some(p) = pre.split(' ').nth(4)
        {
            v.push(PathBuf::from(p));
        }
    }
    v
}

fn dirs_deepest_first(top: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(d);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        for h in hierarchies() {
            let top = h.join(&self.name);
            for d in dirs_deepest_first(&top) {
                if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in procs.lines() {
                        let _ = Command::new("kill").arg("-KILL").arg(pid).status();
                    }
                }
                for _ in 0..50 {
                    if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// The cgroup file `file` of `controller` for container `id` (its path from the bundle).
pub fn cgroup_file(d: &Daemon, id: &str, controller: &str, file: &str) -> PathBuf {
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.root().join("containers").join(id).join("config.json")).expect("spec"),
    )
    .expect("json");
    let path = spec
        .pointer("/linux/cgroupsPath")
        .and_then(|v| v.as_str())
        .expect("cgroupsPath")
        .to_string();
    let layout = berth::runtime::cgroups::Layout::detect().expect("layout");
    berth::metrics::cgroup_stats::controller_dir(&layout, controller, &path)
        .expect("controller")
        .join(file)
}
