//! Hostile pods against the agent: subPaths that try to leave their volume (a symlink planted by
//! an init container, `..`, an absolute path), runAsNonRoot on a root image or with runAsUser 0,
//! and the read-only status port off by default; the planted symlink also from a pod of a real
//! API server, with its event; sysctls outside the kubelet's allowlist refused at admission.
//! Whatever an escape would reach is a directory the test made.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod kubelet_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_support::*;
use common::{TempDir, image};
use k8s_cri::v1 as cri;
use serde_json::Value;

/// The names in `dir` and what each file holds.
fn snapshot(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A directory standing for the host's files: one marker file.
fn host_dir() -> TempDir {
    let host = TempDir::new("host-target");
    std::fs::write(host.path().join("marker"), "host data\n").expect("marker");
    host
}

/// Waits until container `name` of pod `pod` runs or waits for a reason other than
/// ContainerCreating (and no pull); returns the pod.
fn settled(a: &Agent, pod: &str, name: &str) -> Value {
    a.wait_pod("default", pod, "the container running or refused", |p| {
        running(p, name)
            || !matches!(
                waiting_reason(p, name).as_str(),
                "" | "ContainerCreating" | "PodInitializing"
            )
    })
}

/// The containers CRI has for pod `uid` named `name`.
async fn instances(a: &Agent, uid: &str, name: &str) -> Vec<cri::Container> {
    let c = a.daemon.client().await;
    containers(&c)
        .await
        .into_iter()
        .filter(|ct| {
            ct.labels.get("io.kubernetes.pod.uid").map(String::as_str) == Some(uid)
                && ct.metadata.as_ref().is_some_and(|m| m.name == name)
        })
        .collect()
}

/// Asserts `pod`'s container `name` is refused with CreateContainerConfigError and `message`,
/// and stays so (its retries too) with no container created.
async fn assert_refused(a: &Agent, pod: &str, name: &str, message: &str) {
    let p = settled(a, pod, name);
    assert_eq!(
        waiting_reason(&p, name),
        "CreateContainerConfigError",
        "{pod}: {p}"
    );
    assert_eq!(waiting_message(&p, name), message, "{pod}");
    // A few retries later (the back-off base is 1 s) it is still refused.
    std::thread::sleep(Duration::from_secs(3));
    let p = a.pod("default", pod).expect("pod");
    assert_eq!(waiting_reason(&p, name), "CreateContainerConfigError");
    assert_eq!(waiting_message(&p, name), message, "{pod}");
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    assert!(
        instances(a, uid, name).await.is_empty(),
        "{pod}: a {name} container was created"
    );
}

/// A pod with an emptyDir `vol`, init containers `init` (YAML list items) and one container
/// `main` running `script` with `mounts` (YAML list items under volumeMounts).
fn pod_with_volume(name: &str, init: &str, script: &str, mounts: &str) -> String {
    let spec = format!(
        "  volumes:\n  - name: vol\n    emptyDir: {{}}\n{}",
        if init.is_empty() {
            String::new()
        } else {
            format!("  initContainers:\n{init}")
        }
    );
    pod_yaml(name, script, &spec, &format!("    volumeMounts:\n{mounts}"))
}

/// Mount points at or under `dir` in this test's mount namespace.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(&dir))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_symlink_planted_by_an_init_container_is_refused() {
    let a = Agent::start();
    let host = host_dir();
    let before = snapshot(host.path());
    let init = format!(
        "  - name: plant\n    image: {}\n    command: [\"ln\", \"-s\", {:?}, \"/vol/escape\"]\n    volumeMounts:\n    - name: vol\n      mountPath: /vol\n",
        image("busybox"),
        host.path().display().to_string()
    );
    a.write(
        "escape.yaml",
        &pod_with_volume(
            "escape",
            &init,
            "echo pwned > /esc/pwned; ls /esc; sleep 3600",
            "    - name: vol\n      mountPath: /esc\n      subPath: escape\n",
        ),
    );
    assert_refused(
        &a,
        "escape",
        "main",
        "failed to prepare subPath for volumeMount \"vol\" of container \"main\"",
    )
    .await;
    // The init container did plant its symlink; nothing reached the directory it names.
    let p = a.pod("default", "escape").expect("pod");
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let link = a
        .daemon
        .root()
        .join("agent/pods")
        .join(uid)
        .join("volumes/empty-dir/vol/escape");
    assert!(
        std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
        "{}",
        link.display()
    );
    assert_eq!(snapshot(host.path()), before);
    let pod_dir = a.daemon.root().join("agent/pods").join(uid);
    a.finish().await;
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
    assert_eq!(snapshot(host.path()), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subpaths_with_backsteps_or_absolute_are_refused() {
    let a = Agent::start();
    a.write(
        "up.yaml",
        &pod_with_volume(
            "up",
            "",
            "echo pwned > /esc/pwned; sleep 3600",
            "    - name: vol\n      mountPath: /esc\n      subPath: ../../..\n",
        ),
    );
    a.write(
        "abs.yaml",
        &pod_with_volume(
            "abs",
            "",
            "sleep 3600",
            "    - name: vol\n      mountPath: /esc\n      subPath: /etc\n",
        ),
    );
    assert_refused(
        &a,
        "up",
        "main",
        "unable to provision SubPath `../../..`: must not contain '..'",
    )
    .await;
    assert_refused(
        &a,
        "abs",
        "main",
        "error SubPath `/etc` must not be an absolute path",
    )
    .await;
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_subpath_is_created_and_bound_again_at_each_restart() {
    let a = Agent::start();
    // The first run exits (a restart); the second stays.
    let script = "echo run >> /ab/runs; [ $(wc -l < /ab/runs) -ge 2 ] || exit 1; sleep 3600";
    // Besides, one file of a downwardAPI volume through its subPath (a file bind).
    let yaml = pod_with_volume(
        "nested",
        "",
        script,
        "    - name: vol\n      mountPath: /vol\n    - name: vol\n      mountPath: /ab\n      subPath: a/b\n    - name: info\n      mountPath: /podname\n      subPath: name\n",
    )
    .replace(
        "  volumes:\n",
        "  volumes:\n  - name: info\n    downwardAPI:\n      items:\n      - path: name\n        fieldRef: {fieldPath: metadata.name}\n",
    );
    a.write("nested.yaml", &yaml);
    let p = a.wait_pod("default", "nested", "nested running after a restart", |p| {
        running(p, "main") && restarts(p, "main") >= 1
    });
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let pod_dir = a.daemon.root().join("agent/pods").join(&uid);
    let runs = pod_dir.join("volumes/empty-dir/vol/a/b/runs");
    assert_eq!(
        std::fs::read_to_string(&runs).expect("runs"),
        "run\nrun\n",
        "both runs wrote through the subPath"
    );
    // The runtime was given the agent's bind of the subPath (index 1 of the volumeMounts), not a
    // path inside the volume.
    let c = a.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    let status = common::container_status(&c, &id).await.expect("status");
    let target = pod_dir.join("volume-subpaths/vol/main/1");
    let ab = status
        .mounts
        .iter()
        .find(|m| m.container_path == "/ab")
        .expect("the /ab mount");
    assert_eq!(Path::new(&ab.host_path), target, "{:?}", status.mounts);
    // One bind there, not one per instance.
    let binds = mounts_under(&target);
    assert_eq!(binds.len(), 1, "{binds:?}");
    assert_eq!(
        common::exec_ok(&c, &id, &["cat", "/vol/a/b/runs"]).await,
        "run\nrun\n"
    );
    assert_eq!(
        common::exec_ok(&c, &id, &["cat", "/podname"]).await,
        "nested"
    );
    let name = status
        .mounts
        .iter()
        .find(|m| m.container_path == "/podname")
        .expect("the /podname mount");
    assert_eq!(
        Path::new(&name.host_path),
        pod_dir.join("volume-subpaths/info/main/2")
    );
    assert!(Path::new(&name.host_path).is_file());
    a.finish().await;
    // The pod's directory went, its binds unmounted first.
    assert!(
        mounts_under(&pod_dir).is_empty(),
        "{:?}",
        mounts_under(&pod_dir)
    );
    assert!(!pod_dir.exists(), "{} left", pod_dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_non_root_refuses_root_and_runs_a_non_root_user() {
    let a = Agent::start();
    a.write(
        "root-image.yaml",
        &pod_yaml(
            "root-image",
            "sleep 3600",
            "",
            "    securityContext:\n      runAsNonRoot: true\n",
        ),
    );
    a.write(
        "uid-zero.yaml",
        &pod_yaml(
            "uid-zero",
            "sleep 3600",
            "  securityContext:\n    runAsNonRoot: true\n",
            "    securityContext:\n      runAsUser: 0\n",
        ),
    );
    a.write(
        "uid-1000.yaml",
        &pod_yaml(
            "uid-1000",
            "sleep 3600",
            "  securityContext:\n    runAsNonRoot: true\n",
            "    securityContext:\n      runAsUser: 1000\n",
        ),
    );
    let pod_ref = |name: &str| {
        let p = a.pod("default", name).expect("pod");
        format!(
            "{name}_default({})",
            p["metadata"]["uid"].as_str().unwrap_or_default()
        )
    };
    let _ = settled(&a, "root-image", "main");
    assert_refused(
        &a,
        "root-image",
        "main",
        &format!(
            "container has runAsNonRoot and image will run as root (pod: {:?}, container: main)",
            pod_ref("root-image")
        ),
    )
    .await;
    let _ = settled(&a, "uid-zero", "main");
    assert_refused(
        &a,
        "uid-zero",
        "main",
        &format!(
            "container's runAsUser breaks non-root policy (pod: {:?}, container: main)",
            pod_ref("uid-zero")
        ),
    )
    .await;
    let p = settled(&a, "uid-1000", "main");
    assert!(running(&p, "main"), "{p}");
    let c = a.daemon.client().await;
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let id = running_container(&c, uid, "main").await;
    assert_eq!(common::exec_ok(&c, &id, &["id", "-u"]).await.trim(), "1000");
    a.finish().await;
}

/// GET `path` over the unix socket `socket`: the status code.
fn get_unix(socket: &Path, path: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_read_only_port_is_off_unless_configured() {
    let manifests = TempDir::new("manifests");
    let conf = TempDir::new("agentconf");
    let cgroup_root = conf
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("agent")
        .to_string();
    let config = conf.path().join("config.toml");
    // Only what keeps the test off shared host paths; the endpoint's address is left default.
    std::fs::write(
        &config,
        format!(
            "[agent]\nserver_address = \"\"\nhealthz_address = \"\"\ncgroup_root = \"/{cgroup_root}/kubepods\"\npod_log_dir = {:?}\ndevice_plugin_dir = {:?}\nplugin_registry_dir = {:?}\npod_resources_dir = {:?}\n",
            conf.path().join("logs"),
            conf.path().join("device-plugins"),
            conf.path().join("plugins_registry"),
            conf.path().join("pod-resources")
        ),
    )
    .expect("config");
    let _cgroups = common::CgroupRoot::made_by_the_test(cgroup_root);
    let d = common::Daemon::start_with(&[
        "--config",
        &config.display().to_string(),
        "--manifest-dir",
        &manifests.path().display().to_string(),
    ]);
    let socket = d.state().join("agent/agent.sock");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while get_unix(&socket, "/healthz") != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's control socket never answered:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The routes are on the control socket; no TCP endpoint was opened.
    assert_eq!(get_unix(&socket, "/pods"), 200);
    assert!(
        !d.state().join("agent/endpoint").exists(),
        "the agent wrote a TCP endpoint address:\n{}",
        d.log()
    );
    assert!(
        d.log()
            .lines()
            .any(|l| l.contains("node agent started") && l.contains("address=off")),
        "{}",
        d.log()
    );
}

#[tokio::test]
async fn a_subpath_symlink_from_an_api_pod_is_refused_with_its_event() {
    let n = cluster_node::AgentNode::start("");
    let host = host_dir();
    let before = snapshot(host.path());
    let img = image("busybox:latest");
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: escape\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  volumes:\n  - name: vol\n    emptyDir: {{}}\n  initContainers:\n  - name: plant\n    image: {img}\n    command: [ln, -s, {host:?}, /vol/escape]\n    volumeMounts:\n    - {{name: vol, mountPath: /vol}}\n  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, \"echo pwned > /esc/pwned; ls /esc; sleep 3600\"]\n    volumeMounts:\n    - {{name: vol, mountPath: /esc, subPath: escape}}\n",
        ns = n.ns,
        node = n.node,
        host = host.path().display().to_string(),
    ));
    let message = "failed to prepare subPath for volumeMount \"vol\" of container \"main\"";
    n.cp.wait(
        &format!(
            "the refusal in the API\n{}",
            common::tail(&n.agent.daemon.log(), 30)
        ),
        Duration::from_secs(90),
        |_| {
            let state = n.pod_path("escape", "{.status.containerStatuses[0].state}");
            state.contains("CreateContainerConfigError") || state.contains("running")
        },
    );
    assert_eq!(
        n.pod_path(
            "escape",
            "{.status.containerStatuses[0].state.waiting.reason}"
        ),
        "CreateContainerConfigError"
    );
    assert_eq!(
        n.pod_path(
            "escape",
            "{.status.containerStatuses[0].state.waiting.message}"
        ),
        message
    );
    let events = || {
        n.cp.kubectl(&[
            "-n",
            &n.ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=escape",
            "-o",
            "jsonpath={range .items[*]}{.type}|{.reason}|{.message}{\"\\n\"}{end}",
        ])
        .1
    };
    let want = format!("Warning|Failed|Error: {message}");
    n.cp.wait("the Failed event", Duration::from_secs(30), |_| {
        events().lines().any(|l| l == want)
    });
    assert_eq!(snapshot(host.path()), before);
    // A key of a configMap volume through its subPath: the key is a symlink through `..data`,
    // inside the volume, so it is followed.
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: {ns}\ndata:\n  app.conf: from-the-config-map\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: keyed\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  volumes:\n  - name: cfg\n    configMap: {{name: cfg}}\n  containers:\n  - name: main\n    image: {img}\n    command: [sleep, \"3600\"]\n    volumeMounts:\n    - {{name: cfg, mountPath: /etc/app.conf, subPath: app.conf}}\n",
        ns = n.ns,
        node = n.node,
    ));
    n.wait_pod("Running", "keyed", "{.status.phase}", "Running");
    let uid = n.pod_path("keyed", "{.metadata.uid}");
    let c = n.agent.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    assert_eq!(
        common::exec_ok(&c, &id, &["cat", "/etc/app.conf"]).await,
        "from-the-config-map"
    );
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", "keyed", "--wait=false"]);
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", "escape", "--wait=false"]);
    n.agent.finish().await;
    assert_eq!(snapshot(host.path()), before);
}

/// A pod on the test's network (or the host's) setting sysctl `name` to `value`.
fn sysctl_pod(pod: &str, name: &str, value: &str, host_network: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\nspec:\n  hostNetwork: {host_network}\n  terminationGracePeriodSeconds: 1\n  securityContext:\n    sysctls:\n    - name: {name}\n      value: {value:?}\n  containers:\n  - name: main\n    image: {img}\n    command: [\"sleep\", \"3600\"]\n",
        img = image("busybox")
    )
}

/// Waits until `pod` is refused at admission; asserts the kubelet's reason and `message`, and
/// that it has no sandbox and no container a few sync periods later.
async fn assert_sysctl_forbidden(a: &Agent, pod: &str, message: &str) {
    let p = a.wait_pod("default", pod, "the pod refused at admission", |p| {
        p["status"]["phase"] == "Failed" || running(p, "main")
    });
    assert_eq!(p["status"]["phase"], "Failed", "{pod}: {p}");
    assert_eq!(p["status"]["reason"], "SysctlForbidden", "{pod}: {p}");
    assert_eq!(p["status"]["message"], message, "{pod}");
    std::thread::sleep(Duration::from_secs(2));
    let p = a.pod("default", pod).expect("pod");
    assert_eq!(p["status"]["phase"], "Failed", "{pod}: {p}");
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let c = a.daemon.client().await;
    let own: Vec<_> = sandboxes(&c)
        .await
        .into_iter()
        .filter(|sb| sb.metadata.as_ref().is_some_and(|m| m.uid == uid))
        .collect();
    assert!(own.is_empty(), "{pod} got a sandbox: {own:?}");
    assert!(
        instances(a, uid, "main").await.is_empty(),
        "{pod} got a container"
    );
}

/// What `cat path` prints in the running container `main` of `pod`.
async fn read_in_pod(a: &Agent, pod: &str, path: &str) -> String {
    let p = a.wait_pod("default", pod, "the pod running", |p| running(p, "main"));
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let c = a.daemon.client().await;
    let id = running_container(&c, uid, "main").await;
    common::exec_ok(&c, &id, &["cat", path])
        .await
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_sysctls_are_refused_unless_allowed() {
    let net = cni_support::TestNet::new("hasy");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let a = Agent::start_with(&net.daemon_args());
    // An unsafe IPC sysctl, a safe net one on the pod's network, and the same safe one on the
    // host's network.
    a.write(
        "msg.yaml",
        &sysctl_pod("msg", "kernel.msgmax", "12345", false),
    );
    a.write(
        "port.yaml",
        &sysctl_pod("port", "net.ipv4.ip_unprivileged_port_start", "80", false),
    );
    a.write(
        "host-port.yaml",
        &sysctl_pod(
            "host-port",
            "net/ipv4/ip_unprivileged_port_start",
            "80",
            true,
        ),
    );
    assert_sysctl_forbidden(
        &a,
        "msg",
        "forbidden sysctl: \"kernel.msgmax\" not allowlisted",
    )
    .await;
    assert_sysctl_forbidden(
        &a,
        "host-port",
        "forbidden sysctl: \"net.ipv4.ip_unprivileged_port_start\" not allowed with host net enabled",
    )
    .await;
    assert_eq!(
        read_in_pod(&a, "port", "/proc/sys/net/ipv4/ip_unprivileged_port_start").await,
        "80"
    );
    // The host's own value is untouched.
    assert_ne!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
            .expect("host sysctl")
            .trim(),
        "80"
    );
    a.finish().await;
    drop(a);

    // Allowed by the node, the unsafe sysctl reaches the pod's IPC namespace.
    let a = Agent::start_with_config(
        &net.daemon_args(),
        "allowed_unsafe_sysctls = [\"kernel.msg*\"]\n",
    );
    a.write(
        "msg.yaml",
        &sysctl_pod("msg", "kernel.msgmax", "12345", false),
    );
    assert_eq!(
        read_in_pod(&a, "msg", "/proc/sys/kernel/msgmax").await,
        "12345"
    );
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/msgmax")
            .expect("host sysctl")
            .trim(),
        "12345"
    );
    a.finish().await;
}
