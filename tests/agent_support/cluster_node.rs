//! A Berth agent joined to a real control plane as a node, for the tests that need one: the
//! control plane, the pod network and berthd, and helpers to act as users of the cluster.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::agent_support::{self, Agent};
use crate::cni_support;
use crate::common::*;
use crate::kubelet_support::control_plane::{ControlPlane, PlaneOptions};
use k8s_cri::v1 as cri;

/// A node of one Berth agent and its control plane.
pub struct AgentNode {
    pub agent: Agent,
    /// The pod network (the node is Ready only with one).
    pub net: cni_support::TestNet,
    pub cp: ControlPlane,
    pub node: String,
    /// The test's namespace (named after the node).
    pub ns: String,
}

impl AgentNode {
    /// The control plane, then berthd with its agent joining it; `agent_toml` adds `[agent]`
    /// settings.
    pub fn start(agent_toml: &str) -> Self {
        Self::start_with(agent_toml, &PlaneOptions::default(), |cp, _| {
            (cp.node_kubeconfig(), Vec::new())
        })
    }

    /// As [`AgentNode::start`] on a control plane made with `plane`, with `setup` run once the
    /// control plane is up: it returns the kubeconfig the agent joins with and extra berthd
    /// flags.
    pub fn start_with(
        agent_toml: &str,
        plane: &PlaneOptions,
        setup: impl FnOnce(&ControlPlane, &str) -> (std::path::PathBuf, Vec<String>),
    ) -> Self {
        Self::launch(agent_toml, plane, false, setup)
    }

    /// As [`AgentNode::start`], with no taint (any pod may be scheduled on the node: the
    /// upstream e2e suite's pods tolerate none), the node's address on its pod network's host
    /// side with the node server there on the kubelet's port 10250 (some upstream specs reach
    /// the node through the API server's proxy at that port whatever the node reports), and
    /// the node server taking the API server's client certificate (the cluster CA as
    /// `--client-ca-file`, as a kubelet's clientCAFile), so that logs, exec and port-forward
    /// reach it through the API server.
    pub fn start_schedulable(agent_toml: &str) -> Self {
        Self::launch(agent_toml, &PlaneOptions::default(), true, |cp, _| {
            (
                cp.node_kubeconfig(),
                vec!["--client-ca-file".into(), cp.ca().display().to_string()],
            )
        })
    }

    fn launch(
        agent_toml: &str,
        plane: &PlaneOptions,
        schedulable: bool,
        setup: impl FnOnce(&ControlPlane, &str) -> (std::path::PathBuf, Vec<String>),
    ) -> Self {
        let tag = TempDir::new("nodename").unique_name();
        let node = format!("agent-{tag}");
        let net = cni_support::TestNet::new("agentnode");
        net.write("10-test.conflist", &net.standard());
        net.bridge_up();
        let cp = ControlPlane::start_with(&node, plane);
        let (kubeconfig, extra) = setup(&cp, &node);
        let (node_ip, agent_toml) = if schedulable {
            let ip = net.gateway();
            let toml = format!("{agent_toml}server_address = \"{ip}:10250\"\n");
            (ip, toml)
        } else {
            ("127.0.0.1".to_string(), agent_toml.to_string())
        };
        let mut args: Vec<String> = [
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--node-name",
            &node,
            "--node-labels",
            "tier=test,berth.dev/role=agent",
            "--node-ip",
            &node_ip,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !schedulable {
            args.extend([
                "--register-with-taints".into(),
                "dedicated=berth:NoSchedule".into(),
            ]);
        }
        args.extend(net.daemon_args());
        args.extend(extra);
        let agent = Agent::start_with_config(&args, &agent_toml);
        let ready = |cp: &ControlPlane| {
            cp.jsonpath(
                &["node", &node],
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            ) == "True"
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !ready(&cp) {
            assert!(
                Instant::now() < deadline,
                "node {node} not Ready in 90 s:\n{}\nnode: {}",
                tail(&agent.daemon.log(), 60),
                cp.kubectl(&["get", "node", &node, "-o", "yaml"]).1
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        cp.create_namespace(&node);
        Self {
            agent,
            net,
            cp,
            ns: node.clone(),
            node,
        }
    }

    pub fn user(&self) -> String {
        format!("system:node:{}", self.node)
    }

    pub fn node_path(&self, path: &str) -> String {
        self.cp.jsonpath(&["node", &self.node], path)
    }

    pub fn pod_path(&self, pod: &str, path: &str) -> String {
        self.cp.jsonpath(&["-n", &self.ns, "pod", pod], path)
    }

    pub fn wait_pod(&self, what: &str, pod: &str, path: &str, want: &str) {
        self.cp.wait(
            &format!("pod {pod}: {what}\n{}", tail(&self.agent.daemon.log(), 30)),
            Duration::from_secs(90),
            |_| self.pod_path(pod, path) == want,
        );
    }

    /// A host-network busybox pod bound to this node (there is no scheduler).
    pub fn create_pod(&self, name: &str, grace: u32, script: &str) {
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: {grace}\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, {script:?}]\n    readinessProbe:\n      exec: {{command: [\"true\"]}}\n      periodSeconds: 1\n",
            ns = self.ns,
            node = self.node,
            image = image("busybox:latest"),
        ));
    }

    /// Sleeping pods (grace 1 s) named `names`, once all run; their containers' ids.
    pub fn running_sleepers(&self, names: &[&str]) -> Vec<String> {
        for name in names {
            self.create_pod(name, 1, "while true; do sleep 1; done");
        }
        names
            .iter()
            .map(|name| {
                self.wait_pod("Running", name, "{.status.phase}", "Running");
                self.pod_path(name, "{.status.containerStatuses[0].containerID}")
            })
            .collect()
    }

    /// The agent's sandboxes (all states) for pods named `name`.
    pub async fn sandboxes(&self, name: &str) -> Vec<cri::PodSandbox> {
        agent_support::sandboxes(&self.agent.daemon.client().await)
            .await
            .into_iter()
            .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == name))
            .collect()
    }
}

/// A kubeconfig for the API server of `cp` authenticating with `user` (YAML of a kubeconfig
/// user), written into the control plane's directory as `file`.
pub fn user_kubeconfig(cp: &ControlPlane, file: &str, user: &str) -> std::path::PathBuf {
    let path = cp.dir.path().join(file);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}', certificate-authority: {ca}}}\nusers:\n- name: u\n  user: {user}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            port = cp.api_port,
            ca = cp.ca().display(),
        ),
    )
    .expect("kubeconfig");
    path
}

/// A bearer token of a service account in kube-system bound to `cluster_role`.
pub fn service_account_token(cp: &ControlPlane, name: &str, cluster_role: &str) -> String {
    cp.kubectl_ok(&["-n", "kube-system", "create", "serviceaccount", name]);
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        name,
        &format!("--clusterrole={cluster_role}"),
        &format!("--serviceaccount=kube-system:{name}"),
    ]);
    let mut secret = String::new();
    cp.wait(
        "the service account's token",
        Duration::from_secs(60),
        |cp| {
            secret = cp.jsonpath(
                &["-n", "kube-system", "serviceaccount", name],
                "{.secrets[0].name}",
            );
            !secret.is_empty()
        },
    );
    let b64 = cp.jsonpath(&["-n", "kube-system", "secret", &secret], "{.data.token}");
    let out = std::process::Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(b64.as_bytes())?;
            c.wait_with_output()
        })
        .expect("base64");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
