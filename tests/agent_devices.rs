//! Device plugins through the agent, with the Kubernetes tests' own sample device plugin (two
//! devices of `example.com/resource`, each a file it makes under /tmp and mounts into the
//! container that holds it): the node reports them, pods get distinct devices, a pod asking
//! for more than is free is refused, freed devices are given again, and the devices pods hold
//! outlive the plugin and a restart of berthd.
//!
//! The pod resources API lists which devices each pod holds, to the client Kubernetes ships for
//! monitoring agents.
//!
//! In a cluster, the Node the API server holds carries the devices, and pods bound to the node
//! get them or are refused.
//!
//! The sample plugin puts its socket in the agent's plugin registry and is found there, as the
//! kubelet finds it (upstream's own device plugin test runs it so). It looks for the kubelet's
//! `DEPRECATION` file at the kubelet's own path, and calls Register on the kubelet's own socket
//! when the file is not there, so the agent serves the kubelet's device plugin directory here:
//! these tests run in the stock kubelet's test group.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod kubelet_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use agent_support::*;
use common::{exec_ok, image};

/// The kubelet's device plugin directory, where the sample plugin looks for `DEPRECATION`.
const PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The sample plugin serving in agent `a`'s plugin registry, killed and its socket removed
/// when dropped.
struct SamplePlugin {
    child: Child,
    dir: PathBuf,
}

impl SamplePlugin {
    fn start(a: &Agent) -> Self {
        let bin = kubelet_support::kube_bin("BERTH_TEST_SAMPLE_DEVICE_PLUGIN");
        let dir = a._conf.path().join("plugins_registry");
        std::fs::create_dir_all(&dir).expect("plugin registry");
        let log = a._conf.path().join("sample-device-plugin.log");
        let child = common::spawn_logged(Command::new(bin).env("PLUGIN_SOCK_DIR", &dir), &log);
        Self { child, dir }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for s in plugin_sockets(&self.dir) {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Drop for SamplePlugin {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The sample plugin's sockets (`dp.<time>`) in `dir`.
fn plugin_sockets(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dp."))
        })
        .collect()
}

/// Waits until this agent serves the registration socket (another process serving it would
/// get the plugin) and has left the kubelet's `DEPRECATION` file, which tells the sample
/// plugin to wait to be found in the plugin registry.
fn wait_registration(a: &Agent) {
    a.wait("the registration socket", Duration::from_secs(20), |a| {
        let log = a.daemon.log();
        log.contains("serving device plugin registration")
            && log.contains("watching the plugin registry")
    });
    assert!(Path::new(PLUGIN_DIR).join("DEPRECATION").exists());
}

fn manifest(name: &str, devices: u32) -> String {
    pod_manifest(name, devices, "")
}

/// A host-network pod whose container holds `devices` of the sample plugin's; `spec` adds
/// lines to its spec.
fn pod_manifest(name: &str, devices: u32, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{spec}  containers:\n  - name: main\n    image: {img}\n    command: [\"sleep\", \"1000\"]\n    resources:\n      limits:\n        example.com/resource: \"{devices}\"\n",
        img = image("busybox")
    )
}

/// The node's capacity and allocatable of the sample plugin's resource.
fn node_devices(a: &Agent) -> (String, String) {
    let node = a.get("/node").1;
    let of = |field: &str| {
        node["status"][field]["example.com/resource"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    (of("capacity"), of("allocatable"))
}

/// The sample devices mounted in the running main container of pod `uid`.
async fn devices_in(c: &berth::client::CriClient, uid: &str) -> Vec<String> {
    let id = running_container(c, uid, "main").await;
    let listed = exec_ok(c, &id, &["ls", "/tmp"]).await;
    listed
        .split_whitespace()
        .filter(|n| n.starts_with("Dev-"))
        .map(str::to_string)
        .collect()
}

/// The pod resources API's List on agent `a`'s socket, through Kubernetes' own client
/// (hack/podresources-list): each pod's container's devices of the sample resource, by pod
/// name and container name.
fn listed_devices(a: &Agent) -> Vec<(String, String, Vec<String>)> {
    let bin = kubelet_support::kube_bin("BERTH_TEST_PODRESOURCES_LIST");
    let socket = a._conf.path().join("pod-resources/kubelet.sock");
    let out = Command::new(bin)
        .arg(&socket)
        .output()
        .expect("podresources-list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut found = Vec::new();
    for pod in listed["pod_resources"].as_array().into_iter().flatten() {
        for c in pod["containers"].as_array().into_iter().flatten() {
            let ids = c["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["resource_name"] == "example.com/resource")
                .flat_map(|d| d["device_ids"].as_array().cloned().unwrap_or_default())
                .filter_map(|id| id.as_str().map(str::to_string))
                .collect();
            found.push((
                pod["name"].as_str().unwrap_or("").to_string(),
                c["name"].as_str().unwrap_or("").to_string(),
                ids,
            ));
        }
    }
    found.sort();
    found
}

fn uid(pod: &serde_json::Value) -> String {
    pod["metadata"]["uid"].as_str().expect("uid").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_device_plugin_serves_pods_through_the_agent() {
    // The agent makes the file, as a kubelet watching its plugin registry does.
    let _ = std::fs::remove_file(Path::new(PLUGIN_DIR).join("DEPRECATION"));
    let mut a = Agent::start_with_config(&[], &format!("device_plugin_dir = {PLUGIN_DIR:?}\n"));
    wait_registration(&a);
    let mut plugin = SamplePlugin::start(&a);
    a.wait(
        "the plugin's devices in the node status",
        Duration::from_secs(30),
        |a| node_devices(a) == ("2".into(), "2".into()),
    );

    // Two pods, one device each: distinct devices, as the plugin mounted them.
    a.write("one.yaml", &manifest("one", 1));
    a.write("two.yaml", &manifest("two", 1));
    let one = uid(&a.wait_pod("default", "one", "running", |p| running(p, "main")));
    let two = uid(&a.wait_pod("default", "two", "running", |p| running(p, "main")));
    let c = a.daemon.client().await;
    let (d1, d2) = (devices_in(&c, &one).await, devices_in(&c, &two).await);
    assert_eq!((d1.len(), d2.len()), (1, 1), "{d1:?} {d2:?}");
    assert_ne!(d1, d2, "two pods got the same device");
    // The pod resources API names the same devices.
    assert_eq!(
        listed_devices(&a),
        [
            ("one".to_string(), "main".to_string(), d1.clone()),
            ("two".to_string(), "main".to_string(), d2.clone()),
        ]
    );

    // None is left: a third pod is refused as the kubelet refuses it.
    a.write("three.yaml", &manifest("three", 1));
    let three = a.wait_pod("default", "three", "refused", |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(three["status"]["reason"], "UnexpectedAdmissionError");
    let message = three["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("example.com/resource") && message.contains("Requested: 1, Available: 0"),
        "{message}"
    );
    std::fs::remove_file(a.manifest("three.yaml")).expect("remove three");

    // Pod one gone, its device goes to the next pod.
    std::fs::remove_file(a.manifest("one.yaml")).expect("remove one");
    a.wait("pod one gone", Duration::from_secs(60), |a| {
        a.pod("default", "one").is_none()
    });
    a.write("four.yaml", &manifest("four", 1));
    let four = uid(&a.wait_pod("default", "four", "running", |p| running(p, "main")));
    assert_eq!(
        devices_in(&c, &four).await,
        d1,
        "pod one's device given again"
    );

    // berthd restarted: the plugin, which registers only once, is found again in the registry;
    // the pods keep their devices.
    let kept = a.daemon.root().join("agent/device-allocations.json");
    a.daemon.stop();
    a.respawn();
    let ckpt: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).expect("allocations kept")).expect("json");
    let held: Vec<&String> = ckpt["pods"].as_object().expect("pods").keys().collect();
    assert_eq!(held.len(), 2, "{ckpt}");
    assert!(held.contains(&&two) && held.contains(&&four), "{ckpt}");
    a.wait(
        "the plugin registered again after the restart",
        Duration::from_secs(30),
        |a| {
            let found = "registered a plugin found in the registry";
            a.daemon.log().matches(found).count() >= 2
                && node_devices(a) == ("2".into(), "2".into())
        },
    );

    // The plugin ends: its devices stay counted but none is allocatable; the pods run on, and
    // a container started again (with no plugin to ask) gets the same device from what was
    // kept.
    plugin.stop();
    a.wait(
        "the plugin's devices unhealthy",
        Duration::from_secs(30),
        |a| node_devices(a) == ("2".into(), "0".into()),
    );
    let c = a.daemon.client().await;
    let before = running_container(&c, &two, "main").await;
    c.runtime()
        .stop_container(k8s_cri::v1::StopContainerRequest {
            container_id: before.clone(),
            timeout: 0,
        })
        .await
        .expect("StopContainer");
    let restarted = a.wait_pod("default", "two", "restarted", |p| {
        restarts(p, "main") >= 1 && running(p, "main")
    });
    assert_eq!(uid(&restarted), two);
    assert_eq!(
        devices_in(&c, &two).await,
        d2,
        "the restarted container's device"
    );

    a.finish().await;
    // Their pods gone, the devices are free: nothing is kept.
    a.wait("allocations freed", Duration::from_secs(20), |_| {
        std::fs::read(&kept)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["pods"].as_object().is_some_and(|p| p.is_empty()))
    });
    for d in d1.iter().chain(&d2) {
        let _ = std::fs::remove_file(Path::new("/tmp").join(d));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_node_carries_the_devices_and_its_pods_get_them() {
    let n = cluster_node::AgentNode::start(&format!("device_plugin_dir = {PLUGIN_DIR:?}\n"));
    wait_registration(&n.agent);
    let mut plugin = SamplePlugin::start(&n.agent);
    let resource = "{.status.%s.example\\.com/resource}";
    n.cp.wait(
        "the devices in the API server's Node",
        Duration::from_secs(60),
        |_| {
            n.node_path(&resource.replace("%s", "capacity")) == "2"
                && n.node_path(&resource.replace("%s", "allocatable")) == "2"
        },
    );
    // Bound to the node as a scheduler binds them (this control plane runs none).
    let spec = format!(
        "  nodeName: {}\n  tolerations: [{{key: dedicated, operator: Exists}}]\n",
        n.node
    );
    let with_ns = |yaml: String| {
        yaml.replacen(
            "metadata:\n",
            &format!("metadata:\n  namespace: {}\n", n.ns),
            1,
        )
    };
    n.cp.apply(&with_ns(pod_manifest("both", 2, &spec)));
    n.wait_pod("Running", "both", "{.status.phase}", "Running");
    let uid = n.pod_path("both", "{.metadata.uid}");
    let c = n.agent.daemon.client().await;
    let mut held = devices_in(&c, &uid).await;
    held.sort();
    assert_eq!(held, ["Dev-1", "Dev-2"]);
    // Both are held: the next pod is refused, Failed in the API with the kubelet's reason.
    n.cp.apply(&with_ns(pod_manifest("more", 1, &spec)));
    n.wait_pod("Failed", "more", "{.status.phase}", "Failed");
    let reason = n.pod_path("more", "{.status.reason}");
    assert!(
        ["OutOfexample.com/resource", "UnexpectedAdmissionError"].contains(&reason.as_str()),
        "{reason}: {}",
        n.pod_path("more", "{.status.message}")
    );
    n.cp.kubectl_ok(&[
        "-n",
        &n.ns,
        "delete",
        "pod",
        "both",
        "more",
        "--grace-period=1",
        "--wait=true",
    ]);
    plugin.stop();
    n.cp.wait(
        "no device allocatable once the plugin is gone",
        Duration::from_secs(60),
        |_| n.node_path(&resource.replace("%s", "allocatable")) == "0",
    );
    for d in held {
        let _ = std::fs::remove_file(Path::new("/tmp").join(d));
    }
}
