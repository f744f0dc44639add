//! The stock kubelet 1.20 (CRI v1alpha2, socket path as `:authority`, hugepage limits of 0 on
//! every container) running static pods on a real berthd: host and pod networks, probes that
//! restart containers, init containers, hostPort, pods removed and re-added, the kubelet and
//! berthd each restarted under running pods. What the kubelet made is checked through Berth's
//! own CRI listing, as `crictl` shows it. Tests in this binary run one at a time (the kubelet
//! owns fixed host paths such as /var/log/pods and its device-plugin socket).

mod cni_support;
mod common;
mod kubelet_support;

use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use kubelet_support::*;

/// A berthd and a standalone kubelet on it.
struct Node {
    kubelet: Kubelet,
    daemon: Daemon,
    net: Option<cni_support::TestNet>,
}

impl Node {
    fn start(with_net: bool) -> Self {
        let net = with_net.then(|| {
            let net = cni_support::TestNet::new("kubelet");
            net.write("10-test.conflist", &net.standard());
            net.bridge_up();
            net
        });
        let args: Vec<String> = net.as_ref().map(|n| n.daemon_args()).unwrap_or_default();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = Daemon::start_with(&args);
        let kubelet = Kubelet::start(&daemon, KubeletOptions::default());
        Node {
            kubelet,
            daemon,
            net,
        }
    }

    /// The name the kubelet gives static pod `name`: `<name>-<node name>` (unique to the test).
    fn pod(&self, name: &str) -> String {
        format!("{name}-{}", self.kubelet.node_name)
    }

    fn write_pod(&self, name: &str, spec: &str) {
        self.kubelet
            .write_manifest(&format!("{name}.yaml"), &static_pod(name, spec));
    }

    /// Waits until each of `containers` of static pod `name` runs.
    async fn wait_running(&self, c: &berth::client::CriClient, name: &str, containers: &[&str]) {
        let pod = self.pod(name);
        wait_for(
            &self.kubelet,
            &format!("pod {pod}: {containers:?} running"),
            Duration::from_secs(90),
            || async {
                let mut all = true;
                for n in containers {
                    all &= running(c, &pod, n).await.is_some();
                }
                all
            },
        )
        .await;
    }

    /// Removes every manifest and waits until Berth has no sandbox left.
    async fn finish(&self, c: &berth::client::CriClient) {
        for e in std::fs::read_dir(self.kubelet.manifests())
            .expect("manifests")
            .flatten()
        {
            let _ = std::fs::remove_file(e.path());
        }
        wait_for(
            &self.kubelet,
            "every pod gone",
            Duration::from_secs(90),
            || async {
                c.runtime()
                    .list_pod_sandbox(cri::ListPodSandboxRequest::default())
                    .await
                    .is_ok_and(|r| {
                        r.into_inner()
                            .items
                            .iter()
                            .all(|s| s.state == cri::PodSandboxState::SandboxNotready as i32)
                    })
            },
        )
        .await;
    }
}

fn busybox() -> String {
    image("busybox:latest")
}

/// The kubelet starts on Berth (every call over v1alpha2, with its socket path as
/// `:authority`), and a host-network static pod's container runs in the kubelet's cgroup root
/// with the Guaranteed pod's cpu and memory limits: the kubelet's hugepage limits of 0 did not
/// stop it.
#[tokio::test]
async fn host_network_static_pod_runs() {
    let node = Node::start(false);
    let c = node.daemon.client().await;
    node.write_pod(
        "host",
        &format!(
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, 'echo started; sleep 1000']\n    resources:\n      limits: {{cpu: 200m, memory: 64Mi}}\n",
            img = busybox()
        ),
    );
    node.wait_running(&c, "host", &["main"]).await;
    let pod = node.pod("host");
    let sandboxes = pod_sandboxes(&c, &pod).await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let s = &sandboxes[0];
    assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
    // The kubelet put the pod in its own cgroup root.
    let status = sandbox_status(&c, &s.id).await;
    assert_eq!(
        status
            .linux
            .and_then(|l| l.namespaces)
            .and_then(|n| n.options)
            .map(|o| o.network),
        Some(cri::NamespaceMode::Node as i32)
    );
    let main = running(&c, &pod, "main").await.expect("main");
    let out = exec_ok(&c, &main.id, &["cat", "/proc/self/cgroup"]).await;
    assert!(
        out.contains(&node.kubelet.cgroup_root()),
        "container cgroup under the kubelet's root: {out}"
    );
    // The kubelet's cpu quota/period and memory limit reached the container's cgroup (a
    // Guaranteed pod: limits are requests).
    let cgroup_of = |controller: &str| -> String {
        out.lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
                names
                    .split(',')
                    .any(|n| n == controller)
                    .then(|| path.to_string())
            })
            .unwrap_or_default()
    };
    let read = |controller: &str, dir: &str, file: &str| {
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/{dir}{}/{file}",
            cgroup_of(controller)
        ))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
    };
    if std::path::Path::new("/sys/fs/cgroup/memory").exists() {
        assert_eq!(
            read("memory", "memory", "memory.limit_in_bytes"),
            "67108864"
        );
        assert_eq!(read("cpu", "cpu", "cpu.cfs_quota_us"), "20000");
        assert_eq!(read("cpu", "cpu", "cpu.cfs_period_us"), "100000");
    } else {
        assert_eq!(read("", "", "memory.max"), "67108864");
        assert_eq!(read("", "", "cpu.max"), "20000 100000");
    }
    node.finish(&c).await;
}

/// A pod on the CNI network: an init container writes a file into an emptyDir, and the main
/// container serves it on a hostPort; a second pod's exec and httpGet liveness probes
/// start failing and the kubelet restarts those containers (and only those).
#[tokio::test]
async fn pod_network_init_container_emptydir_host_port_and_liveness_restarts() {
    let node = Node::start(true);
    let net = node.net.as_ref().expect("net");
    let c = node.daemon.client().await;
    let img = busybox();
    let host_port = free_port();
    node.write_pod(
        "web",
        &format!(
            "  terminationGracePeriodSeconds: 2\n  volumes:\n  - name: site\n    emptyDir: {{}}\n  initContainers:\n  - name: init\n    image: {img}\n    command: [sh, -c, 'echo written-by-init > /srv/site/index.html']\n    volumeMounts:\n    - {{name: site, mountPath: /srv/site}}\n  containers:\n  - name: main\n    image: {img}\n    command: [httpd, -f, -p, '80', -h, /srv/site]\n    ports:\n    - {{containerPort: 80, hostPort: {host_port}}}\n    volumeMounts:\n    - {{name: site, mountPath: /srv/site}}\n"
        ),
    );
    // exec: healthy until /tmp/healthy goes (after 2 s); httpGet: /healthz until it goes.
    let probe = "periodSeconds: 1, failureThreshold: 1, initialDelaySeconds: 1";
    node.write_pod(
        "probed",
        &format!(
            "  terminationGracePeriodSeconds: 2\n  containers:\n  - name: exec-live\n    image: {img}\n    command: [sh, -c, 'touch /tmp/healthy; sleep 2; rm /tmp/healthy; sleep 1000']\n    livenessProbe: {{exec: {{command: [test, -f, /tmp/healthy]}}, {probe}}}\n  - name: http-live\n    image: {img}\n    command: [sh, -c, 'mkdir /www; echo ok > /www/healthz; httpd -p 8080 -h /www; sleep 2; rm /www/healthz; sleep 1000']\n    livenessProbe: {{httpGet: {{path: /healthz, port: 8080}}, {probe}}}\n  - name: steady\n    image: {img}\n    command: [sleep, '1000']\n"
        ),
    );
    node.wait_running(&c, "web", &["main"]).await;
    let web = node.pod("web");
    let sandbox = pod_sandboxes(&c, &web).await.remove(0);
    let ip = sandbox_status(&c, &sandbox.id)
        .await
        .network
        .map(|n| n.ip)
        .unwrap_or_default();
    assert!(
        ip.starts_with(&net.prefix),
        "pod IP {ip} in {}",
        net.subnet()
    );
    // The init container ran to completion before main started.
    let init = pod_containers(&c, &web)
        .await
        .into_iter()
        .find(|x| x.metadata.as_ref().is_some_and(|m| m.name == "init"))
        .expect("init container");
    assert_eq!(init.state, cri::ContainerState::ContainerExited as i32);
    let answer = http_get(&format!("{}:{host_port}", net.gateway()), "/index.html").await;
    assert!(
        answer.starts_with("HTTP/1.") && answer.contains("written-by-init"),
        "hostPort {host_port}: {answer:?}"
    );
    let answer = http_get(&format!("{ip}:80"), "/index.html").await;
    assert!(answer.contains("written-by-init"), "pod IP: {answer:?}");

    let probed = node.pod("probed");
    for name in ["exec-live", "http-live"] {
        wait_for(
            &node.kubelet,
            &format!("{name} restarted by its liveness probe"),
            Duration::from_secs(60),
            || async {
                running(&c, &probed, name)
                    .await
                    .is_some_and(|x| restart_count(&x) >= 1)
            },
        )
        .await;
    }
    let steady = running(&c, &probed, "steady").await.expect("steady runs");
    assert_eq!(
        restart_count(&steady),
        0,
        "a container without a probe kept running"
    );
    node.finish(&c).await;
}

/// Pods keep running, unrestarted, while the kubelet restarts and while berthd restarts (the
/// kubelet reconnects and starts new pods); a pod whose manifest goes is removed, and comes
/// back in a new sandbox when the manifest returns.
#[tokio::test]
async fn restarts_of_kubelet_and_berthd_and_a_pod_removed_and_readded() {
    let mut node = Node::start(false);
    let c = node.daemon.client().await;
    let spec = format!(
        "  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {}\n    command: [sleep, '1000']\n",
        busybox()
    );
    node.write_pod("keep", &spec);
    node.wait_running(&c, "keep", &["main"]).await;
    let keep = node.pod("keep");
    let first = running(&c, &keep, "main").await.expect("main");
    let sandbox = pod_sandboxes(&c, &keep).await.remove(0).id;

    // Kubelet restart: the same container and sandbox, nothing restarted.
    node.kubelet.stop();
    node.kubelet.spawn();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = running(&c, &keep, "main")
        .await
        .expect("main after the kubelet restart");
    assert_eq!(
        (after.id.as_str(), restart_count(&after)),
        (first.id.as_str(), 0)
    );
    let sandboxes = pod_sandboxes(&c, &keep).await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0].id, sandbox);

    // berthd restart under the kubelet: it reconnects, keeps the pod and starts a new one.
    node.daemon.stop();
    node.daemon.spawn();
    let c = node.daemon.client().await;
    node.write_pod("later", &spec);
    node.wait_running(&c, "later", &["main"]).await;
    let after = running(&c, &keep, "main")
        .await
        .expect("main after the berthd restart");
    assert_eq!(
        (after.id.as_str(), restart_count(&after)),
        (first.id.as_str(), 0)
    );
    let died: Vec<String> = node
        .kubelet
        .log()
        .lines()
        .filter(|l| l.contains("ContainerDied") && l.contains(&keep))
        .map(str::to_string)
        .collect();
    assert!(
        died.is_empty(),
        "nothing of {keep} died across the restarts: {died:?}"
    );

    // Removed: its sandbox goes. Re-added: a new sandbox runs it again.
    node.kubelet.remove_manifest("keep.yaml");
    wait_for(
        &node.kubelet,
        "pod keep removed",
        Duration::from_secs(60),
        || async {
            pod_sandboxes(&c, &keep)
                .await
                .iter()
                .all(|s| s.state != cri::PodSandboxState::SandboxReady as i32)
        },
    )
    .await;
    assert!(running(&c, &keep, "main").await.is_none());
    node.write_pod("keep", &spec);
    node.wait_running(&c, "keep", &["main"]).await;
    let ready: Vec<_> = pod_sandboxes(&c, &keep)
        .await
        .into_iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .collect();
    assert_eq!(ready.len(), 1);
    assert_ne!(ready[0].id, sandbox, "a new sandbox");
    node.finish(&c).await;
}
