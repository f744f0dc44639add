//! A stock kubelet (1.20, built by `hack/kubernetes.sh`, or any other given by
//! `hack/kubelet-check.sh`) on a test berthd: its config and flags by its version, root dir,
//! ports and cgroup root unique to the test, static pods from a manifest dir, and a guard that
//! stops it and removes every cgroup and pod log dir it made, even when the test fails.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth::client::CriClient;
use k8s_cri::v1 as cri;

use crate::common::{CgroupRoot, Daemon, TempDir, free_port, spawn_logged, tail, terminate};

pub mod control_plane;

/// A path from the environment `hack/kubernetes.sh` prints; the kubelet tests never skip.
pub fn kube_bin(var: &str) -> PathBuf {
    let path = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the suite through `make test` (or eval \"$(bash hack/kubernetes.sh)\")")
    });
    let path = PathBuf::from(path);
    assert!(path.exists(), "{var}={} does not exist", path.display());
    path
}

/// Runs `cmd` to completion within `timeout` (killed after it); returns (success, stdout, stderr).
/// Both pipes are read while it runs, so a talkative command never blocks on a full pipe.
pub fn run_for(cmd: &mut Command, timeout: Duration) -> (bool, String, String) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    // Its own process group: a timeout ends its children too (which hold the pipes).
    let mut child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.is_some_and(|s| s.success()),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// How a kubelet is started.
#[derive(Clone, Debug, Default)]
pub struct KubeletOptions {
    /// Register to this API server (a kubeconfig); standalone without.
    pub kubeconfig: Option<PathBuf>,
    /// Node name (defaults to one unique to the test).
    pub node_name: Option<String>,
    /// CA that signs the API server's client certificate (x509 authentication of its calls).
    pub client_ca: Option<PathBuf>,
    /// The address it serves on and reports as the node's InternalIP (the kubelet refuses a
    /// loopback node IP): a test network's host side. Default: 127.0.0.1, no node IP.
    pub address: Option<String>,
    /// The port it serves on (default: a free one). 10250, the kubelet's own, only on an
    /// address of the test's (some e2e specs reach the node through the API server's proxy at
    /// that port whatever the node reports).
    pub port: Option<u16>,
    /// Extra KubeletConfiguration lines.
    pub extra_config: String,
}

/// A running stock kubelet.
pub struct Kubelet {
    pub dir: TempDir,
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub port: u16,
    pub healthz_port: u16,
    pub node_name: String,
    pub opts: KubeletOptions,
    pub cgroups: CgroupRoot,
    /// What the kubelet's fixed log roots held before it started (kept on drop).
    log_entries_before: Vec<PathBuf>,
}

/// The minor version of the kubelet `BERTH_TEST_KUBELET` names (`Kubernetes v1.32.4`: 32),
/// which decides the flags and config fields it is given.
pub fn kubelet_minor() -> u32 {
    static MINOR: OnceLock<u32> = OnceLock::new();
    *MINOR.get_or_init(|| {
        let out = Command::new(kube_bin("BERTH_TEST_KUBELET"))
            .arg("--version")
            .output()
            .expect("kubelet --version");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .find_map(|w| w.strip_prefix("v1."))
            .and_then(|rest| rest.split('.').next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no v1.N version in `kubelet --version`: {text:?}"))
    })
}

/// The kubelet's fixed log roots: pod log dirs and the container log links.
const KUBELET_LOG_ROOTS: [&str; 2] = ["/var/log/pods", "/var/log/containers"];

fn log_entries() -> Vec<PathBuf> {
    KUBELET_LOG_ROOTS
        .iter()
        .flat_map(|r| std::fs::read_dir(r).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect()
}

impl Kubelet {
    /// Starts a kubelet on `daemon`'s socket and waits for its healthz.
    pub fn start(daemon: &Daemon, opts: KubeletOptions) -> Self {
        Self::start_on(daemon.socket(), opts)
    }

    /// Starts a kubelet on the CRI socket `socket` (Berth's or another runtime's).
    pub fn start_on(socket: PathBuf, opts: KubeletOptions) -> Self {
        let dir = TempDir::new("kubelet");
        let tag = dir.unique_name();
        std::fs::create_dir_all(dir.path().join("manifests")).expect("manifest dir");
        let node_name = opts.node_name.clone().unwrap_or(tag.clone());
        let mut k = Kubelet {
            socket,
            port: opts.port.unwrap_or_else(free_port),
            healthz_port: free_port(),
            node_name,
            cgroups: CgroupRoot::new(format!("berth-{tag}")),
            opts,
            dir,
            child: None,
            log_entries_before: log_entries(),
        };
        k.write_config();
        k.spawn();
        k
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("kubelet.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn write_config(&self) {
        let auth = match &self.opts.client_ca {
            Some(ca) => format!(
                "authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: false}}\n  x509: {{clientCAFile: {}}}\nauthorization: {{mode: AlwaysAllow}}\n",
                ca.display()
            ),
            None => "authentication:\n  anonymous: {enabled: true}\n  webhook: {enabled: false}\nauthorization: {mode: AlwaysAllow}\n".to_string(),
        };
        // From 1.27 the runtime's endpoints are config fields (the flags are deprecated and
        // `--container-runtime` is gone); from 1.31 a kubelet on a cgroup v1 host must be told
        // that this is wanted.
        let minor = kubelet_minor();
        let endpoint = format!("unix://{}", self.socket.display());
        let mut by_version = String::new();
        if minor >= 27 {
            by_version.push_str(&format!(
                "containerRuntimeEndpoint: {endpoint}\nimageServiceEndpoint: {endpoint}\n"
            ));
        }
        if minor >= 31 {
            by_version.push_str("failCgroupV1: false\n");
        }
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             runtimeRequestTimeout: 2m\n\
             {by_version}\
             staticPodPath: {manifests}\n\
             fileCheckFrequency: 1s\n\
             syncFrequency: 3s\n\
             cgroupDriver: cgroupfs\n\
             cgroupRoot: /{cgroup}\n\
             failSwapOn: false\n\
             address: {address}\n\
             port: {port}\n\
             readOnlyPort: 0\n\
             healthzBindAddress: 127.0.0.1\n\
             healthzPort: {healthz}\n\
             makeIPTablesUtilChains: false\n\
             serializeImagePulls: false\n\
             nodeStatusUpdateFrequency: 2s\n\
             evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 256Mi\n  nodefs.inodesFree: 1%\n  imagefs.available: 256Mi\n\
             {auth}{extra}\n",
            manifests = self.manifests().display(),
            address = self.opts.address.as_deref().unwrap_or("127.0.0.1"),
            cgroup = self.cgroups.name,
            port = self.port,
            healthz = self.healthz_port,
            extra = self.opts.extra_config,
        );
        std::fs::write(self.dir.path().join("config.yaml"), config).expect("kubelet config");
    }

    /// The kubelet command line.
    fn command(&self) -> Command {
        let mut c = Command::new(kube_bin("BERTH_TEST_KUBELET"));
        let endpoint = format!("unix://{}", self.socket.display());
        c.arg(format!(
            "--config={}",
            self.dir.path().join("config.yaml").display()
        ))
        .arg(format!(
            "--root-dir={}",
            self.dir.path().join("root").display()
        ))
        .arg(format!(
            "--cert-dir={}",
            self.dir.path().join("pki").display()
        ))
        .arg(format!("--hostname-override={}", self.node_name))
        .arg("--v=2");
        if kubelet_minor() < 27 {
            c.arg("--container-runtime=remote")
                .arg(format!("--container-runtime-endpoint={endpoint}"))
                .arg(format!("--image-service-endpoint={endpoint}"));
        }
        if let Some(kc) = &self.opts.kubeconfig {
            c.arg(format!("--kubeconfig={}", kc.display()));
        }
        if let Some(ip) = &self.opts.address {
            c.arg(format!("--node-ip={ip}"));
        }
        c
    }

    /// Starts (again) and waits until it is healthy, in its sync loop and past the start of
    /// its runtime-dependent parts (cAdvisor, container manager: its plugin manager starts
    /// after them). The kubelet 1.20 dies at start when /proc/self/mountinfo or /proc/mounts
    /// changes under each of its three reads (other tests mount and unmount meanwhile): then it
    /// is started again, up to six times, a little later each time.
    pub fn spawn(&mut self) {
        const MOUNTINFO_RACE: &str = "could not get consistent content of /proc/";
        const ATTEMPTS: u32 = 6;
        for attempt in 1..=ATTEMPTS {
            let from = self.log().len();
            self.child = Some(spawn_logged(&mut self.command(), &self.log_path()));
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut exited = None;
            while Instant::now() < deadline {
                let log = self.log();
                let new = log.get(from..).unwrap_or_default();
                if new.contains("Starting kubelet main sync loop")
                    && new.contains("Starting Kubelet Plugin Manager")
                    && self.healthz()
                {
                    return;
                }
                if let Some(c) = self.child.as_mut()
                    && let Ok(Some(status)) = c.try_wait()
                {
                    exited = Some((status, new.contains(MOUNTINFO_RACE)));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            match exited {
                Some((_, true)) if attempt < ATTEMPTS => {
                    eprintln!("kubelet: mountinfo changed under its start; starting it again");
                    std::thread::sleep(Duration::from_millis(500 * u64::from(attempt)));
                }
                Some((status, _)) => {
                    panic!(
                        "kubelet exited at start ({status}):\n{}",
                        tail(&self.log(), 60)
                    )
                }
                None => panic!("kubelet not healthy in 60 s:\n{}", tail(&self.log(), 60)),
            }
        }
    }

    fn healthz(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.healthz_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        buf.starts_with("HTTP/1.1 200")
    }

    /// SIGTERM, as a service manager stops it.
    pub fn stop(&mut self) {
        if let Some(c) = self.child.take() {
            terminate(c);
        }
    }

    /// Writes a static pod manifest (write then rename, so the kubelet never reads half).
    pub fn write_manifest(&self, file: &str, yaml: &str) {
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests().join(file)).expect("rename manifest");
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests().join(file)).expect("remove manifest");
    }

    /// The kubelet's cgroup root, as its pods' cgroup parents start.
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.cgroups.name)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        // The kubelet's log roots are fixed: remove what appeared there while it ran (one
        // kubelet runs at a time, and nothing else of the suite writes there).
        for path in log_entries() {
            if !self.log_entries_before.contains(&path) {
                let _ = std::fs::remove_dir_all(&path);
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// A static pod manifest for pod `name`; `spec` is the YAML under `spec:` (indented 2).
pub fn static_pod(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}"
    )
}

/// Berth's containers of the pod named `pod` (the kubelet's CRI labels), newest first.
pub async fn pod_containers(c: &CriClient, pod: &str) -> Vec<cri::Container> {
    let mut v: Vec<cri::Container> = c
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("io.kubernetes.pod.name".to_string(), pod.to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    v.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    v
}

/// Berth's sandboxes of the pod named `pod`.
pub async fn pod_sandboxes(c: &CriClient, pod: &str) -> Vec<cri::PodSandbox> {
    c.runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [("io.kubernetes.pod.name".to_string(), pod.to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
}

/// The running container named `name` of pod `pod`, if there is one.
pub async fn running(c: &CriClient, pod: &str, name: &str) -> Option<cri::Container> {
    pod_containers(c, pod).await.into_iter().find(|x| {
        x.state == cri::ContainerState::ContainerRunning as i32
            && x.metadata.as_ref().is_some_and(|m| m.name == name)
    })
}

/// Polls `f` until it holds, up to `timeout`; panics naming `what` with the kubelet's log tail.
pub async fn wait_for<F, Fut>(k: &Kubelet, what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what}: not within {timeout:?}; kubelet log:\n{}",
        important(&k.log())
    );
}

/// The kubelet log's warnings and errors (klog W/E/F lines) and its pod lifecycle lines
/// (sync loop, probes, runtime manager), last 80.
pub fn important(log: &str) -> String {
    const NOISE: [&str; 2] = ["perf_event", "NoNetworkConfig"];
    const LIFECYCLE: [&str; 4] = ["SyncLoop", "prober.go", "kuberuntime_", "pod_workers.go"];
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with(['W', 'E', 'F']) || LIFECYCLE.iter().any(|k| l.contains(k)))
        .filter(|l| !NOISE.iter().any(|k| l.contains(k)))
        .collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// The restart count the kubelet recorded on a container (its CRI annotation).
pub fn restart_count(c: &cri::Container) -> u32 {
    c.annotations
        .get("io.kubernetes.container.restartCount")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
