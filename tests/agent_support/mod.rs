//! The agent test harness: a berthd with its agent on, its endpoint, manifests and pod helpers.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{CgroupRoot, Daemon, TempDir, image, tail};
use k8s_cri::v1 as cri;
use serde_json::Value;

/// Puts `over` into `base`: tables merge, other values replace.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A berthd with its agent on: a manifest dir, a status port, short back-offs and periods.
pub struct Agent {
    pub daemon: Daemon,
    pub manifests: TempDir,
    pub logs: TempDir,
    /// Holds the config file (read again when the test restarts berthd).
    pub _conf: TempDir,
    /// The agent's cgroup root (its QoS cgroups outlive berthd, as a kubelet's do).
    pub _cgroups: CgroupRoot,
}

impl Agent {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With extra berthd flags (e.g. a CNI conf dir).
    pub fn start_with(extra: &[String]) -> Self {
        Self::start_with_config(extra, "")
    }

    /// With extra berthd flags and extra lines for the `[agent]` section of the config file.
    ///
    /// Unless `agent_toml` sets `[agent.eviction_hard]` itself, the disk thresholds are 256 MiB
    /// free: the kubelet's defaults (10 % / 15 %), or any percentage of a large, crowded build
    /// disk, would put the node under DiskPressure and refuse every pod.
    pub fn start_with_config(extra: &[String], agent_toml: &str) -> Self {
        let thresholds = if agent_toml.contains("eviction_hard") {
            ""
        } else {
            "[agent.eviction_hard]\n\"memory.available\" = \"100Mi\"\n\"nodefs.available\" = \"256Mi\"\n\"nodefs.inodesFree\" = \"1%\"\n\"imagefs.available\" = \"256Mi\"\n\"imagefs.inodesFree\" = \"1%\"\n"
        };
        let manifests = TempDir::new("manifests");
        let logs = TempDir::new("podlogs");
        let conf = TempDir::new("agentconf");
        let cgroup_root = conf
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("agent")
            .to_string();
        let config = conf.path().join("config.toml");
        let base = format!(
            "[agent]\npod_log_dir = {:?}\nbackoff_base_secs = 1.0\nbackoff_max_secs = 4.0\n\
             node_status_update_secs = 0.5\nnode_status_report_secs = 3.0\nmanifest_rescan_ms = 300\n\
             sync_period_ms = 300\nnode_lease_duration_secs = 2.0\nserver_address = \"127.0.0.1:0\"\nhealthz_address = \"\"\ncgroup_root = \"/{cgroup_root}/kubepods\"\ndevice_plugin_dir = {:?}\nplugin_registry_dir = {:?}\npod_resources_dir = {:?}\n{thresholds}",
            logs.path(),
            // Each agent its own: the kubelet's directories are the stock kubelet's in its tests.
            conf.path().join("device-plugins"),
            conf.path().join("plugins_registry"),
            conf.path().join("pod-resources"),
        );
        // The test's lines override the harness's (a TOML file may not name a key twice).
        let mut table: toml::Table = base.parse().expect("harness config");
        let overrides: toml::Table = format!("[agent]\n{agent_toml}")
            .parse()
            .expect("the test's [agent] lines");
        merge(&mut table, overrides);
        std::fs::write(&config, toml::to_string(&table).expect("config text")).expect("config");
        let args = [
            "--config".to_string(),
            config.display().to_string(),
            "--manifest-dir".to_string(),
            manifests.path().display().to_string(),
            "--agent-address".to_string(),
            // Port 0: berthd picks a free port and writes it to <state>/agent/endpoint (a port
            // chosen here could be taken by another test's server before berthd binds it).
            "127.0.0.1:0".to_string(),
        ];
        let args: Vec<&str> = args.iter().chain(extra).map(String::as_str).collect();
        let daemon = Daemon::start_with(&args);
        let a = Self {
            daemon,
            manifests,
            logs,
            _conf: conf,
            _cgroups: CgroupRoot::made_by_the_test(cgroup_root),
        };
        a.wait_endpoint();
        a
    }

    /// Waits until the agent endpoint answers.
    pub fn wait_endpoint(&self) {
        self.wait("the agent endpoint", Duration::from_secs(20), |a| {
            a.get("/healthz").0 == 200
        });
    }

    /// Starts berthd again (after `daemon.stop()` or `daemon.kill9()`) and waits for its agent.
    pub fn respawn(&mut self) {
        self.daemon.spawn();
        self.wait_endpoint();
    }

    /// The agent endpoint's port in the running berthd (0 until it listens).
    pub fn port(&self) -> u16 {
        std::fs::read_to_string(self.daemon.state().join("agent/endpoint"))
            .ok()
            .and_then(|a| a.trim().parse::<std::net::SocketAddr>().ok())
            .map_or(0, |a| a.port())
    }

    /// GET `path` on the agent endpoint: status code and JSON body (Null when not JSON).
    pub fn get(&self, path: &str) -> (u16, Value) {
        self.request("GET", path)
    }

    /// `method path` on the agent endpoint: status code and JSON body (Null when not JSON).
    pub fn request(&self, method: &str, path: &str) -> (u16, Value) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port())) else {
            return (0, Value::Null);
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        if s.write_all(req.as_bytes()).is_err() {
            return (0, Value::Null);
        }
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (code, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        let (code, v) = self.get(&format!("/pods/{ns}/{name}"));
        (code == 200).then_some(v)
    }

    pub fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out waiting for {what}\n/pods: {}\nberthd log (info and above, tail):\n{}",
            self.get("/pods").1,
            tail(&important_lines(&self.daemon.log()), 60)
        );
    }

    /// Waits for a pod matching `f`; returns it.
    pub fn wait_pod(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        mut f: impl FnMut(&Value) -> bool,
    ) -> Value {
        let mut found = Value::Null;
        self.wait(what, Duration::from_secs(60), |a| match a.pod(ns, name) {
            Some(p) if f(&p) => {
                found = p;
                true
            }
            _ => false,
        });
        found
    }

    /// The agent's cgroup root (unique per test).
    pub fn cgroup_root(&self) -> String {
        let name = self
            ._conf
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        format!("/{name}/kubepods")
    }

    pub fn manifest(&self, file: &str) -> PathBuf {
        self.manifests.path().join(file)
    }

    pub fn write(&self, file: &str, text: &str) {
        // Write then rename, as editors and config managers do, so a scan never sees half a file.
        let tmp = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.manifest(file)).expect("rename manifest");
    }

    /// Removes every manifest and waits until the agent removed every pod and sandbox.
    pub async fn finish(&self) {
        for e in std::fs::read_dir(self.manifests.path())
            .expect("dir")
            .flatten()
        {
            let _ = std::fs::remove_file(e.path());
        }
        self.wait("all pods gone", Duration::from_secs(90), |a| {
            a.get("/pods").1["items"]
                .as_array()
                .is_some_and(|v| v.is_empty())
        });
        let c = self.daemon.client().await;
        for _ in 0..300 {
            if sandboxes(&c).await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("sandboxes left: {:?}", sandboxes(&c).await);
    }
}

/// The log without its DEBUG and TRACE lines (the CRI traffic would hide what went wrong).
pub fn important_lines(log: &str) -> String {
    log.lines()
        .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
        .collect::<Vec<_>>()
        .join("\n")
}

pub use crate::common::{list_containers as containers, list_pod_sandboxes as sandboxes};

/// A host-network pod manifest with one busybox container running `script`.
pub fn pod_yaml(name: &str, script: &str, extra_spec: &str, extra_container: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{extra_spec}  containers:\n  - name: main\n    image: {img}\n    command: [\"sh\", \"-c\", {script:?}]\n{extra_container}",
        img = image("busybox")
    )
}

pub fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|v| v.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

pub fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|v| v.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

pub fn running(pod: &Value, name: &str) -> bool {
    pod["status"]["phase"] == "Running" && !container(pod, name)["state"]["running"].is_null()
}

pub fn restarts(pod: &Value, name: &str) -> i64 {
    container(pod, name)["restartCount"].as_i64().unwrap_or(0)
}

pub fn waiting_reason(pod: &Value, name: &str) -> String {
    container(pod, name)["state"]["waiting"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

pub fn waiting_message(pod: &Value, name: &str) -> String {
    container(pod, name)["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The id of the running instance of container `name` of pod `uid`.
pub async fn running_container(c: &berth::client::CriClient, uid: &str, name: &str) -> String {
    containers(c)
        .await
        .into_iter()
        .find(|ct| {
            ct.state == cri::ContainerState::ContainerRunning as i32
                && ct.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
                && ct.metadata.as_ref().is_some_and(|m| m.name == name)
        })
        .map(|ct| ct.id)
        .unwrap_or_else(|| panic!("a running {name} in pod {uid}"))
}

pub fn log_dir(a: &Agent, pod: &Value) -> PathBuf {
    a.logs.path().join(format!(
        "{}_{}_{}",
        pod["metadata"]["namespace"].as_str().unwrap_or(""),
        pod["metadata"]["name"].as_str().unwrap_or(""),
        pod["metadata"]["uid"].as_str().unwrap_or("")
    ))
}

/// For node shutdown tests: a regular pod whose container takes `regular_stop` (a shell
/// command, e.g. `sleep 1`) to exit after SIGTERM, and a critical pod (system-node-critical)
/// whose container ignores SIGTERM; both with a 30 s grace period; waits until both run.
pub fn start_regular_and_critical_pods(a: &Agent, regular_stop: &str) {
    let with_grace = |yaml: String| {
        yaml.replace(
            "terminationGracePeriodSeconds: 1\n",
            "terminationGracePeriodSeconds: 30\n",
        )
    };
    a.write(
        "regular.yaml",
        &with_grace(pod_yaml(
            "regular",
            &format!("trap '{regular_stop}; exit 0' TERM; while true; do sleep 0.2; done"),
            "",
            "",
        )),
    );
    a.write(
        "critical.yaml",
        &with_grace(pod_yaml(
            "critical",
            "trap '' TERM; while true; do sleep 0.2; done",
            "  priorityClassName: system-node-critical\n",
            "",
        )),
    );
    a.wait_pod("default", "regular", "regular running", |p| {
        running(p, "main")
    });
    a.wait_pod("default", "critical", "critical running", |p| {
        running(p, "main")
    });
}
