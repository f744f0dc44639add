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
/// `:authority`), and a host-network static pod's container runs: the kubelet's hugepage
/// limits of 0 did not stop it, and its termination message is not doubled.
#[tokio::test]
async fn host_network_static_pod_runs() {
    let node = Node::start(false);
    let c = node.daemon.client().await;
    node.write_pod(
        "host",
        &format!(
            "  hostNetwork: true\n  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, 'echo started; sleep 1000']\n",
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
    let status = c
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: s.id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .expect("status");
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
    node.finish(&c).await;
}
