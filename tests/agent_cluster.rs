//! Berth's agent as a node of a real cluster, with no kubelet: etcd, kube-apiserver and
//! kube-controller-manager 1.20.2 on loopback (Node and RBAC authorization, NodeRestriction),
//! the agent joining with a node certificate. Registration with labels and taints, Lease
//! renewals, node status sent on change only (counted in the API server's audit log), a pod
//! created with kubectl running and Ready in the API, deletion with grace, the node going
//! Unknown through the real controller manager while berthd is stopped and Ready again with no
//! container restarted; and kubeconfigs berthd refuses at start.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod kubelet_support;

use std::time::{Duration, Instant};

use agent_support::Agent;
use cluster_node::{AgentNode, service_account_token, user_kubeconfig};
use common::*;
use k8s_cri::v1 as cri;
use kubelet_support::control_plane::ControlPlane;

#[tokio::test]
async fn registers_with_labels_and_taints_renews_its_lease_and_sends_status_on_change() {
    let n = AgentNode::start("node_status_report_secs = 120.0\n");
    // Registered as the kubelet registers: its labels, ours, the taint, the full status.
    let labels = n.node_path("{.metadata.labels}");
    for want in [
        format!("\"kubernetes.io/hostname\":\"{}\"", n.node),
        "\"kubernetes.io/os\":\"linux\"".to_string(),
        "\"kubernetes.io/arch\":\"amd64\"".to_string(),
        "\"beta.kubernetes.io/os\":\"linux\"".to_string(),
        "\"tier\":\"test\"".to_string(),
        "\"berth.dev/role\":\"agent\"".to_string(),
    ] {
        assert!(labels.contains(&want), "{want} not in {labels}");
    }
    assert_eq!(
        n.node_path("{.spec.taints[?(@.key==\"dedicated\")].effect}"),
        "NoSchedule"
    );
    assert_eq!(
        n.node_path("{.spec.taints[?(@.key==\"dedicated\")].value}"),
        "berth"
    );
    let version = n.node_path("{.status.nodeInfo.kubeletVersion}");
    assert!(version.starts_with("v1.33.0+berth."), "{version}");
    assert!(
        n.node_path("{.status.nodeInfo.containerRuntimeVersion}")
            .starts_with("berth://")
    );
    assert_eq!(
        n.node_path("{.status.addresses[?(@.type==\"InternalIP\")].address}"),
        "127.0.0.1"
    );
    assert!(!n.node_path("{.status.capacity.cpu}").is_empty());
    assert!(!n.node_path("{.status.allocatable.memory}").is_empty());

    // The Lease: held by the node, owned by the Node, renewed every quarter of 2 s.
    let lease = |path: &str| {
        n.cp.jsonpath(&["-n", "kube-node-lease", "lease", &n.node], path)
    };
    n.cp.wait("the node lease", Duration::from_secs(30), |_| {
        !lease("{.spec.renewTime}").is_empty()
    });
    assert_eq!(lease("{.spec.holderIdentity}"), n.node);
    assert_eq!(lease("{.spec.leaseDurationSeconds}"), "2");
    assert_eq!(lease("{.metadata.ownerReferences[0].kind}"), "Node");
    assert_eq!(
        lease("{.metadata.ownerReferences[0].uid}"),
        n.node_path("{.metadata.uid}")
    );
    let first = lease("{.spec.renewTime}");
    n.cp.wait("a lease renewal", Duration::from_secs(10), |_| {
        lease("{.spec.renewTime}") != first
    });

    // Idle: the status is computed every 0.5 s but nothing meaningful changes, so nothing is
    // sent (the report period is 120 s), while the lease keeps being renewed.
    std::thread::sleep(Duration::from_secs(3));
    let patches = n.cp.audited(&n.user(), "patch", "nodes/status").len();
    let renewals = n.cp.audited(&n.user(), "update", "leases").len();
    std::thread::sleep(Duration::from_secs(6));
    let idle_patches = n.cp.audited(&n.user(), "patch", "nodes/status").len() - patches;
    let idle_renewals = n.cp.audited(&n.user(), "update", "leases").len() - renewals;
    assert_eq!(idle_patches, 0, "node status sent with nothing changed");
    assert!(idle_renewals >= 6, "{idle_renewals} lease renewals in 6 s");
    let (_, counters) = n.agent.get("/node/reports");
    assert!(
        counters["computed"].as_u64().unwrap_or(0) >= 10,
        "{counters}"
    );

    // A meaningful change (a new image on the node) is sent at once.
    let c = n.agent.daemon.client().await;
    c.images()
        .pull_image(cri::PullImageRequest {
            image: spec(&image("layers:latest")),
            ..Default::default()
        })
        .await
        .expect("pull");
    n.cp.wait(
        "the new image in the node status",
        Duration::from_secs(20),
        |_| n.node_path("{.status.images[*].names}").contains("layers"),
    );
    assert!(n.cp.audited(&n.user(), "patch", "nodes/status").len() > patches);
}

#[tokio::test]
async fn a_pod_from_kubectl_runs_is_ready_in_the_api_and_is_deleted_with_its_grace() {
    let n = AgentNode::start("");
    let created = Instant::now();
    // Ignores SIGTERM: only the grace period ends it.
    n.create_pod("web", 30, "trap '' TERM; while true; do sleep 1; done");
    n.wait_pod("Running", "web", "{.status.phase}", "Running");
    eprintln!("create to Running: {:?}", created.elapsed());
    n.wait_pod(
        "Ready",
        "web",
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        "True",
    );
    assert_eq!(n.pod_path("web", "{.status.hostIP}"), "127.0.0.1");
    assert_eq!(n.pod_path("web", "{.status.podIP}"), "127.0.0.1");
    assert_eq!(n.pod_path("web", "{.status.qosClass}"), "BestEffort");
    assert_eq!(
        n.pod_path("web", "{.status.containerStatuses[0].ready}"),
        "true"
    );
    let id = n.pod_path("web", "{.status.containerStatuses[0].containerID}");
    assert!(id.starts_with("berth://"), "{id}");
    assert!(!n.pod_path("web", "{.status.startTime}").is_empty());
    // The scheduler's condition survives the agent's patches.
    assert_eq!(
        n.pod_path(
            "web",
            "{.status.conditions[?(@.type==\"PodScheduled\")].status}"
        ),
        "True"
    );
    assert_eq!(n.sandboxes("web").await.len(), 1);
    // Status patches come from the node itself, never a GET of pods/status.
    assert!(!n.cp.audited(&n.user(), "patch", "pods/status").is_empty());
    assert!(n.cp.audited(&n.user(), "get", "pods/status").is_empty());

    // Deleted with a 3 s grace: stopped within it (not the pod's 30 s), then gone from the
    // API server, its sandbox removed.
    let deleted = Instant::now();
    n.cp.kubectl_ok(&[
        "-n",
        &n.ns,
        "delete",
        "pod",
        "web",
        "--grace-period=3",
        "--wait=false",
    ]);
    n.cp.wait("the pod gone from the API", Duration::from_secs(30), |cp| {
        !cp.kubectl(&["-n", &n.ns, "get", "pod", "web"]).0
    });
    let took = deleted.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "deleted in {took:?}: the grace period was not given"
    );
    assert!(
        took < Duration::from_secs(20),
        "deleted in {took:?}: the pod's own 30 s were given, not the deletion's 3 s"
    );
    assert!(n.sandboxes("web").await.is_empty());
    assert!(
        !n.cp.audited(&n.user(), "delete", "pods").is_empty(),
        "the node finished the deletion"
    );
}

#[tokio::test]
async fn the_node_goes_unknown_while_berthd_is_down_and_comes_back_with_nothing_restarted() {
    let mut n = AgentNode::start("");
    n.create_pod("steady", 2, "while true; do sleep 1; done");
    n.wait_pod("Running", "steady", "{.status.phase}", "Running");
    let id = n.pod_path("steady", "{.status.containerStatuses[0].containerID}");
    n.agent.daemon.stop();
    // The controller manager (grace 20 s) sees the lease run out.
    n.cp.wait("the node Unknown", Duration::from_secs(90), |_| {
        n.node_path("{.status.conditions[?(@.type==\"Ready\")].status}") == "Unknown"
    });
    n.agent.respawn();
    n.cp.wait_node_ready(&n.node);
    n.wait_pod(
        "Ready again",
        "steady",
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        "True",
    );
    assert_eq!(
        n.pod_path("steady", "{.status.containerStatuses[0].containerID}"),
        id
    );
    assert_eq!(
        n.pod_path("steady", "{.status.containerStatuses[0].restartCount}"),
        "0"
    );
    assert_eq!(n.sandboxes("steady").await.len(), 1);
}

/// berthd with `--kubeconfig file`: it must refuse to start; returns its stderr.
fn refused(file: &std::path::Path) -> String {
    let dir = TempDir::new("badkubeconfig");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_berthd"))
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--kubeconfig")
        .arg(file)
        .arg("--manifest-dir")
        .arg(dir.path().join("manifests"))
        .output()
        .expect("run berthd");
    assert!(
        !out.status.success(),
        "berthd started with {}",
        file.display()
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unusable_kubeconfigs_are_refused_at_start_naming_the_file() {
    let dir = TempDir::new("kubeconfigs");
    // berthd given `file` (holding `text`, or absent) refuses to start, its error naming the
    // file and every one of `wants`.
    let check = |file: &str, text: Option<String>, wants: &[&str]| {
        let path = dir.path().join(file);
        if let Some(t) = text {
            std::fs::write(&path, t).expect("write kubeconfig");
        }
        let err = refused(&path);
        for want in std::iter::once(&file).chain(wants) {
            assert!(err.contains(want), "{file}: {want:?} not in {err}");
        }
    };
    check("missing.kubeconfig", None, &[]);
    check("garbage.kubeconfig", Some("{{ not yaml".into()), &[]);
    let cluster = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
    check(
        "nocreds.kubeconfig",
        Some(format!("{cluster}users:\n- name: u\n  user: {{}}\n")),
        &["no usable credentials"],
    );
    check(
        "nocert.kubeconfig",
        Some(format!(
            "{cluster}users:\n- name: u\n  user: {{client-certificate: /nonexistent/node.crt, client-key: /nonexistent/node.key}}\n"
        )),
        &["/nonexistent/node.crt"],
    );
}

/// ExecSync of `cmd` in the container whose API containerID is `id`: stdout.
async fn exec(n: &AgentNode, id: &str, cmd: &[&str]) -> String {
    let c = n.agent.daemon.client().await;
    let r = c
        .runtime()
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.trim_start_matches("berth://").to_string(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    String::from_utf8_lossy(&r.stdout).into_owned()
}

#[tokio::test]
async fn config_maps_secrets_and_tokens_reach_volumes_and_env_and_follow_updates() {
    let n = AgentNode::start("volume_refresh_secs = 1.0\n");
    let ns = n.ns.as_str();
    n.cp.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "configmap",
        "cfg",
        "--from-literal=greeting=hello",
        "--from-literal=color=blue",
    ]);
    n.cp.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        "sec",
        "--from-literal=password=s3cret",
    ]);
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: objects\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, 'while true; do sleep 1; done']\n    env:\n    - {{name: GREETING, valueFrom: {{configMapKeyRef: {{name: cfg, key: greeting}}}}}}\n    - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: sec, key: password}}}}}}\n    - {{name: ABSENT, valueFrom: {{configMapKeyRef: {{name: nope, key: k, optional: true}}}}}}\n    envFrom:\n    - {{prefix: CFG_, configMapRef: {{name: cfg}}}}\n    volumeMounts:\n    - {{name: cfgvol, mountPath: /etc/cfg}}\n    - {{name: secvol, mountPath: /etc/sec}}\n    - {{name: tokvol, mountPath: /var/run/secrets/tokens}}\n  volumes:\n  - name: cfgvol\n    configMap: {{name: cfg, items: [{{key: greeting, path: hello.txt}}]}}\n  - name: secvol\n    secret: {{secretName: sec, defaultMode: 0400}}\n  - name: tokvol\n    projected:\n      sources:\n      - serviceAccountToken: {{path: token, audience: 'https://kubernetes.default.svc', expirationSeconds: 600}}\n      - configMap: {{name: cfg, items: [{{key: color, path: color}}]}}\n      - configMap: {{name: kube-root-ca.crt, items: [{{key: ca.crt, path: ca.crt}}]}}\n",
        node = n.node,
        image = image("busybox:latest"),
    ));
    n.wait_pod("Running", "objects", "{.status.phase}", "Running");
    let id = n.pod_path("objects", "{.status.containerStatuses[0].containerID}");
    let env = exec(&n, &id, &["env"]).await;
    for want in [
        "GREETING=hello",
        "PASSWORD=s3cret",
        "CFG_greeting=hello",
        "CFG_color=blue",
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in\n{env}");
    }
    assert!(!env.contains("ABSENT="), "{env}");
    assert_eq!(exec(&n, &id, &["cat", "/etc/cfg/hello.txt"]).await, "hello");
    assert_eq!(exec(&n, &id, &["cat", "/etc/sec/password"]).await, "s3cret");
    assert_eq!(
        exec(&n, &id, &["stat", "-L", "-c", "%a", "/etc/sec/password"])
            .await
            .trim(),
        "400"
    );
    assert_eq!(
        exec(&n, &id, &["cat", "/var/run/secrets/tokens/color"]).await,
        "blue"
    );
    // The cluster's CA from the kube-root-ca.crt configMap the controller manager publishes.
    let ca = std::fs::read_to_string(n.cp.ca()).expect("ca");
    assert_eq!(
        exec(&n, &id, &["cat", "/var/run/secrets/tokens/ca.crt"]).await,
        ca
    );
    // The secret lives on a tmpfs, never on the node's disk.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        mountinfo
            .lines()
            .any(|l| l.contains("kubernetes.io~secret/secvol") && l.contains("tmpfs")),
        "the secret volume is not a tmpfs"
    );
    // The projected token authenticates against the API server.
    let token = exec(&n, &id, &["cat", "/var/run/secrets/tokens/token"]).await;
    let (ok, out, err) = kubelet_support::run_for(
        std::process::Command::new(kubelet_support::kube_bin("BERTH_TEST_KUBECTL")).args([
            "--kubeconfig=/dev/null",
            &format!("--server=https://127.0.0.1:{}", n.cp.api_port),
            &format!("--certificate-authority={}", n.cp.ca().display()),
            &format!("--token={token}"),
            "auth",
            "can-i",
            "get",
            "pods",
        ]),
        Duration::from_secs(30),
    );
    assert!(
        !err.contains("Unauthorized") && (ok || out.trim() == "no"),
        "the token did not authenticate: {out}{err}"
    );
    // An update reaches the files in place; the container is not restarted.
    n.cp.kubectl_ok(&[
        "-n",
        ns,
        "patch",
        "configmap",
        "cfg",
        "-p",
        r#"{"data":{"greeting":"bonjour"}}"#,
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while exec(&n, &id, &["cat", "/etc/cfg/hello.txt"]).await != "bonjour" {
        assert!(
            Instant::now() < deadline,
            "the configMap update never reached the volume"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        n.pod_path("objects", "{.status.containerStatuses[0].restartCount}"),
        "0"
    );
    // The objects are watched, not read again at each refresh (every second here).
    let reads = |cp: &ControlPlane| {
        ["configmaps", "secrets"]
            .iter()
            .map(|r| cp.audited(&n.user(), "get", r).len())
            .sum::<usize>()
    };
    let before = reads(&n.cp);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(reads(&n.cp), before, "objects read again while watched");
    assert!(!n.cp.audited(&n.user(), "list", "configmaps").is_empty());

    // A missing configMap in env: the container waits with CreateContainerConfigError.
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: missing\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    command: [sleep, '1000']\n    env:\n    - {{name: X, valueFrom: {{configMapKeyRef: {{name: nope, key: k}}}}}}\n",
        node = n.node,
        image = image("busybox:latest"),
    ));
    n.wait_pod(
        "CreateContainerConfigError",
        "missing",
        "{.status.containerStatuses[0].state.waiting.reason}",
        "CreateContainerConfigError",
    );
    let message = n.pod_path(
        "missing",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(message.contains("\"nope\" not found"), "{message}");
}

#[tokio::test]
async fn static_pods_get_mirror_pods_made_again_when_deleted_and_gone_with_the_manifest() {
    let n = AgentNode::start("");
    let yaml = agent_support::pod_yaml("static", "while true; do sleep 1; done", "", "").replace(
        "metadata:\n",
        &format!("metadata:\n  namespace: {}\n", n.ns),
    );
    n.agent.write("static.yaml", &yaml);
    let name = format!("static-{}", n.node);
    n.wait_pod("mirror Running", &name, "{.status.phase}", "Running");
    assert!(
        !n.pod_path(
            &name,
            "{.metadata.annotations.kubernetes\\.io/config\\.mirror}"
        )
        .is_empty()
    );
    assert_eq!(
        n.pod_path(
            &name,
            "{.metadata.annotations.kubernetes\\.io/config\\.source}"
        ),
        "file"
    );
    assert_eq!(
        n.pod_path(&name, "{.metadata.ownerReferences[0].kind}"),
        "Node"
    );
    assert_eq!(n.pod_path(&name, "{.spec.nodeName}"), n.node);
    n.wait_pod(
        "mirror Ready",
        &name,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        "True",
    );
    let id = n.pod_path(&name, "{.status.containerStatuses[0].containerID}");
    // Deleting the mirror pod does not stop the static pod; the mirror comes back.
    let first_uid = n.pod_path(&name, "{.metadata.uid}");
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", &name, "--wait=false"]);
    n.cp.wait("the mirror pod made again", Duration::from_secs(30), |_| {
        let uid = n.pod_path(&name, "{.metadata.uid}");
        !uid.is_empty() && uid != first_uid
    });
    n.wait_pod("mirror Running again", &name, "{.status.phase}", "Running");
    assert_eq!(
        n.pod_path(&name, "{.status.containerStatuses[0].containerID}"),
        id
    );
    // The manifest goes: so do the pod and its mirror.
    std::fs::remove_file(n.agent.manifest("static.yaml")).expect("remove manifest");
    n.cp.wait("the mirror pod gone", Duration::from_secs(30), |cp| {
        !cp.kubectl(&["-n", &n.ns, "get", "pod", &name]).0
    });
    n.agent.finish().await;
}

#[tokio::test]
async fn admission_refuses_what_does_not_fit_with_the_kubelets_reasons() {
    let n = AgentNode::start("");
    let pod = |name: &str, extra_spec: &str, extra_container: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{extra_spec}  containers:\n  - name: main\n    image: {image}\n    command: [sleep, '1000']\n{extra_container}",
            ns = n.ns,
            node = n.node,
            image = image("busybox:latest"),
        )
    };
    n.cp.apply(&pod(
        "web",
        "",
        "    ports: [{containerPort: 18181, hostPort: 18181}]\n",
    ));
    n.wait_pod("Running", "web", "{.status.phase}", "Running");
    n.cp.apply(&pod(
        "clash",
        "",
        "    ports: [{containerPort: 18181, hostPort: 18181}]\n",
    ));
    n.cp.apply(&pod("elsewhere", "  nodeSelector: {zone: nowhere}\n", ""));
    n.cp.apply(&pod(
        "greedy",
        "",
        "    resources: {requests: {cpu: '1000'}}\n",
    ));
    for (name, reason) in [
        ("clash", "NodePorts"),
        ("elsewhere", "NodeAffinity"),
        ("greedy", "OutOfcpu"),
    ] {
        n.wait_pod(
            &format!("Failed {reason}"),
            name,
            "{.status.phase}",
            "Failed",
        );
        assert_eq!(n.pod_path(name, "{.status.reason}"), reason);
        assert!(!n.pod_path(name, "{.status.message}").is_empty());
        assert!(n.sandboxes(name).await.is_empty(), "{name} got a sandbox");
    }
    assert!(
        n.pod_path("greedy", "{.status.message}")
            .contains("Node didn't have enough resource: cpu"),
    );
    // The admitted pod is untouched; a refused pod deleted is gone at once.
    assert_eq!(n.pod_path("web", "{.status.phase}"), "Running");
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", "greedy", "--wait=false"]);
    n.cp.wait("the refused pod gone", Duration::from_secs(30), |cp| {
        !cp.kubectl(&["-n", &n.ns, "get", "pod", "greedy"]).0
    });
}

#[tokio::test]
async fn events_tell_the_pods_story_and_repeats_become_counts() {
    let n = AgentNode::start("");
    let events = |object: &str, ns: &str| {
        n.cp.kubectl(&[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={object}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}:{.count}:{.source.component}{\"\\n\"}{end}",
        ])
        .1
    };
    n.create_pod("story", 1, "while true; do sleep 1; done");
    n.wait_pod("Running", "story", "{.status.phase}", "Running");
    n.cp.wait("the pod's events", Duration::from_secs(30), |_| {
        let e = events("story", &n.ns);
        ["Pulled:", "Created:", "Started:"]
            .iter()
            .all(|r| e.contains(r))
    });
    assert!(events("story", &n.ns).contains(":kubelet"));
    // `busybox:latest` is pulled (policy Always); the Pulled event tells the time and size.
    let pulled =
        n.cp.kubectl(&[
            "-n",
            &n.ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=story,reason=Pulled",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .1;
    let size: u64 = pulled
        .split("Image size: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no image size in the Pulled event: {pulled}"));
    assert!(
        size > 0 && pulled.contains("Successfully pulled image"),
        "{pulled}"
    );
    n.cp.wait("the node's events", Duration::from_secs(30), |_| {
        let e = events(&n.node, "default");
        e.contains("Starting:") && e.contains("NodeReady:")
    });
    // A crash loop: one BackOff event whose count grows, not an event per sync.
    n.create_pod("crash", 1, "exit 1");
    n.cp.wait("a repeated BackOff", Duration::from_secs(60), |_| {
        events("crash", &n.ns).lines().any(|l| {
            l.starts_with("BackOff:")
                && l.split(':')
                    .nth(1)
                    .and_then(|c| c.parse::<u32>().ok())
                    .is_some_and(|c| c >= 2)
        })
    });
    let backoffs = events("crash", &n.ns)
        .lines()
        .filter(|l| l.starts_with("BackOff:"))
        .count();
    assert_eq!(backoffs, 1, "{}", events("crash", &n.ns));
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", "story", "--wait=false"]);
    n.cp.wait("Killing", Duration::from_secs(30), |_| {
        events("story", &n.ns).contains("Killing:")
    });
}

#[tokio::test]
async fn pods_keep_running_while_the_api_server_is_away_and_their_status_catches_up() {
    let mut n = AgentNode::start("");
    let [steady, flaky] =
        <[String; 2]>::try_from(n.running_sleepers(&["steady", "flaky"])).expect("two pods");
    n.cp.stop_component("kube-apiserver");
    // While it is away, a container dies and is restarted: the status waits to be sent.
    let c = n.agent.daemon.client().await;
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: flaky.trim_start_matches("berth://").to_string(),
            timeout: 0,
        })
        .await
        .expect("StopContainer");
    tokio::time::sleep(Duration::from_secs(5)).await;
    n.cp.start_component("kube-apiserver");
    n.wait_pod(
        "the restart reported",
        "flaky",
        "{.status.containerStatuses[0].restartCount}",
        "1",
    );
    assert_eq!(
        n.pod_path("steady", "{.status.containerStatuses[0].containerID}"),
        steady
    );
    assert_eq!(
        n.pod_path("steady", "{.status.containerStatuses[0].restartCount}"),
        "0"
    );
    // The watch resumed: a pod made now runs.
    n.create_pod("after", 1, "while true; do sleep 1; done");
    n.wait_pod("Running", "after", "{.status.phase}", "Running");
    let ready = n.node_path("{.status.conditions[?(@.type==\"Ready\")].status}");
    assert_eq!(ready, "True");
}

/// The sorted keys of a JSON object at `path` (empty when absent).
fn keys(v: &serde_json::Value, path: &[&str]) -> Vec<String> {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    let mut k: Vec<String> = at
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

/// The `type` of each element of the array at `path`.
fn types(v: &serde_json::Value, path: &[&str]) -> Vec<String> {
    let mut at = v;
    for p in path {
        at = &at[*p];
    }
    let mut t: Vec<String> = at
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    t.sort();
    t
}

fn missing<'a>(reference: &'a [String], ours: &[String]) -> Vec<&'a String> {
    reference.iter().filter(|k| !ours.contains(k)).collect()
}

#[tokio::test]
async fn kubelet_reference_the_api_server_sees_the_agent_as_it_sees_the_stock_kubelet() {
    let n = AgentNode::start("");
    // The stock kubelet 1.20 on a second berthd, registered to the same API server.
    let knode = format!("kubelet-{}", n.node.trim_start_matches("agent-"));
    let kubeconfig = n.cp.add_node(&knode);
    let net = cni_support::TestNet::new("refnode");
    net.write("10-test.conflist", &net.standard());
    net.bridge_up();
    let args = net.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start_with(&args);
    let mut opts = n.cp.kubelet_options(&knode, &net);
    opts.kubeconfig = Some(kubeconfig);
    let _kubelet = kubelet_support::Kubelet::start(&daemon, opts);
    n.cp.wait_node_ready(&knode);
    let json = |what: &[&str]| -> serde_json::Value {
        let mut args = vec!["get"];
        args.extend(what);
        args.extend(["-o", "json"]);
        serde_json::from_str(&n.cp.kubectl_ok(&args)).expect("json")
    };
    let reference = json(&["node", &knode]);
    let ours = json(&["node", &n.node]);
    for path in [
        &["status"][..],
        &["status", "nodeInfo"],
        &["status", "capacity"],
        &["status", "allocatable"],
        &["status", "daemonEndpoints"],
        &["metadata", "annotations"],
    ] {
        let (r, o) = (keys(&reference, path), keys(&ours, path));
        assert!(
            missing(&r, &o).is_empty(),
            "node {path:?}: the agent lacks {:?} (kubelet {r:?}, agent {o:?})",
            missing(&r, &o)
        );
    }
    for path in [&["status", "conditions"][..], &["status", "addresses"]] {
        let (r, o) = (types(&reference, path), types(&ours, path));
        assert_eq!(r, o, "node {path:?}");
    }
    let label_keys = |v: &serde_json::Value| {
        keys(v, &["metadata", "labels"])
            .into_iter()
            .filter(|k| k.contains("kubernetes.io/"))
            .collect::<Vec<_>>()
    };
    assert_eq!(label_keys(&reference), label_keys(&ours), "node labels");
    for field in [
        "architecture",
        "bootID",
        "machineID",
        "systemUUID",
        "kernelVersion",
        "osImage",
        "operatingSystem",
    ] {
        assert_eq!(
            reference["status"]["nodeInfo"][field], ours["status"]["nodeInfo"][field],
            "nodeInfo.{field}"
        );
    }
    for cond in ours["status"]["conditions"].as_array().expect("conditions") {
        let kind = cond["type"].as_str().unwrap_or_default();
        let r = reference["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == kind))
            .expect("reference condition");
        assert_eq!(
            (&r["status"], &r["reason"]),
            (&cond["status"], &cond["reason"]),
            "condition {kind}"
        );
    }

    // The same pod on each node.
    let pod_on = |name: &str, node: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, 'while true; do sleep 1; done']\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}\n    readinessProbe: {{exec: {{command: ['true']}}, periodSeconds: 1}}\n",
            ns = n.ns,
            image = image("busybox:latest"),
        )
    };
    n.cp.apply(&pod_on("ref", &knode));
    n.cp.apply(&pod_on("ours", &n.node));
    for pod in ["ref", "ours"] {
        n.wait_pod(
            "Ready",
            pod,
            "{.status.conditions[?(@.type==\"Ready\")].status}",
            "True",
        );
    }
    let r = json(&["-n", &n.ns, "pod", "ref"]);
    let o = json(&["-n", &n.ns, "pod", "ours"]);
    for path in [
        &["status"][..],
        &["status", "containerStatuses", "0"],
        &["status", "containerStatuses", "0", "state", "running"],
    ] {
        let at = |v: &serde_json::Value| {
            let mut x = v.clone();
            for p in path {
                x = match p.parse::<usize>() {
                    Ok(i) => x[i].clone(),
                    Err(_) => x[*p].clone(),
                };
            }
            x
        };
        let (rk, ok) = (keys(&at(&r), &[]), keys(&at(&o), &[]));
        assert!(
            missing(&rk, &ok).is_empty(),
            "pod {path:?}: the agent lacks {:?}",
            missing(&rk, &ok)
        );
    }
    let (rt, ot) = (
        types(&r, &["status", "conditions"]),
        types(&o, &["status", "conditions"]),
    );
    assert!(
        missing(&rt, &ot).is_empty(),
        "pod conditions: kubelet {rt:?}, agent {ot:?}"
    );
    assert_eq!(r["status"]["qosClass"], o["status"]["qosClass"]);
    assert_eq!(r["status"]["phase"], o["status"]["phase"]);
    // Their events: every reason the kubelet gave, the agent gave.
    let reasons = |pod: &str| {
        let out = n.cp.kubectl_ok(&[
            "-n",
            &n.ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.source.component}|{.reason}|{.message}{\"\\n\"}{end}",
        ]);
        // The kubelet's own (not the controllers' events on the same pod),
        // less the kubelet 1.20's own start-up races: a volume set up before
        // its pod is registered with the ConfigMap/Secret manager fails once
        // with "object ... not registered", or before that manager's watch has
        // synced with "failed to sync configmap cache: timed out ...", and is
        // retried.
        let mut v: Vec<String> = out
            .lines()
            .filter_map(|l| l.strip_prefix("kubelet|"))
            .filter(|l| {
                !(l.starts_with("FailedMount|")
                    && (l.ends_with("not registered") || l.contains("failed to sync")))
            })
            .filter_map(|l| l.split('|').next())
            .map(str::to_string)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let (re, oe) = (reasons("ref"), reasons("ours"));
    assert!(
        missing(&re, &oe).is_empty(),
        "pod events: kubelet {re:?}, agent {oe:?}; the kubelet's: {}",
        n.cp.kubectl_ok(&[
            "-n",
            &n.ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=ref",
            "-o",
            "jsonpath={range .items[*]}{.source.component}|{.reason}|{.message}{\"\\n\"}{end}",
        ])
    );
    // Both pods go; the stock kubelet 1.20 syncs a deletion on its own slower loop, so
    // its pod gets a longer wait than the agent's.
    n.cp.kubectl_ok(&["-n", &n.ns, "delete", "pod", "ref", "ours", "--wait=false"]);
    for (pod, secs) in [("ours", 60), ("ref", 180)] {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let (ok, out, _) = n.cp.kubectl(&[
                "-n",
                &n.ns,
                "get",
                "pod",
                pod,
                "--ignore-not-found",
                "-o",
                "name",
            ]);
            if ok && out.trim().is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "pod {pod} still there after {secs} s"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

#[tokio::test]
async fn an_admins_node_is_adopted_with_a_token_file_and_refused_credentials_are_named() {
    let mut admin_uid = String::new();
    let n = AgentNode::start_with("", &Default::default(), |cp, node| {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels: {{admin-made: \"yes\"}}\n"
        ));
        admin_uid = cp.jsonpath(&["node", node], "{.metadata.uid}");
        let token = service_account_token(cp, "berth-node", "cluster-admin");
        let file = cp.dir.path().join("node.token");
        std::fs::write(&file, token).expect("token file");
        let kubeconfig = user_kubeconfig(
            cp,
            "token.kubeconfig",
            &format!("{{tokenFile: {}}}", file.display()),
        );
        (kubeconfig, vec!["--register-node=false".to_string()])
    });
    assert!(!admin_uid.is_empty());
    assert_eq!(
        n.node_path("{.metadata.uid}"),
        admin_uid,
        "the Node was made again"
    );
    assert_eq!(n.node_path("{.metadata.labels.admin-made}"), "yes");
    assert_eq!(
        n.node_path("{.metadata.labels.kubernetes\\.io/hostname}"),
        n.node
    );
    assert!(
        n.agent.daemon.log().contains("adopted=true"),
        "{}",
        tail(&n.agent.daemon.log(), 20)
    );

    // A second berthd whose token the API server refuses: it runs, says who was refused for
    // what, and its file pods run.
    let bad = user_kubeconfig(&n.cp, "bad.kubeconfig", "{token: not-a-token}");
    let net = cni_support::TestNet::new("badcreds");
    net.write("10-test.conflist", &net.standard());
    net.bridge_up();
    let mut args: Vec<String> = [
        "--kubeconfig",
        &bad.display().to_string(),
        "--node-name",
        "refused-node",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(net.daemon_args());
    let other = Agent::start_with_config(&args, "");
    other.write(
        "local.yaml",
        &agent_support::pod_yaml("local", "while true; do sleep 1; done", "", ""),
    );
    other.wait("the file pod running", Duration::from_secs(60), |a| {
        // In a cluster a static pod's name carries the node's.
        a.pod("default", "local-refused-node")
            .is_some_and(|p| agent_support::running(&p, "main"))
    });
    other.wait("the refusal logged", Duration::from_secs(30), |a| {
        let log = a.daemon.log();
        log.contains("401 Unauthorized") && log.contains("identity=user \"u\" (bearer token)")
    });
    other.finish().await;
}

#[tokio::test]
async fn evicted_pods_stay_failed_in_the_api_and_missing_volume_objects_hold_the_pod() {
    let n = AgentNode::start("eviction_monitoring_period_secs = 0.5\n");
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: fills\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    command: [sh, -c, 'dd if=/dev/zero of=/scratch/blob bs=1M count=3 && sleep 3600']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n  volumes:\n  - name: scratch\n    emptyDir: {{sizeLimit: 1Mi}}\n",
        ns = n.ns,
        node = n.node,
        image = image("busybox:latest"),
    ));
    n.wait_pod("Evicted", "fills", "{.status.reason}", "Evicted");
    assert_eq!(n.pod_path("fills", "{.status.phase}"), "Failed");
    assert_eq!(
        n.pod_path(
            "fills",
            "{.status.conditions[?(@.type==\"DisruptionTarget\")].status}"
        ),
        "True"
    );
    // Not deleted by the node: it stays for its owner to see.
    std::thread::sleep(Duration::from_secs(2));
    assert!(n.cp.kubectl(&["-n", &n.ns, "get", "pod", "fills"]).0);

    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nosecret\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    command: [sleep, '3600']\n    volumeMounts: [{{name: s, mountPath: /s}}]\n  volumes:\n  - name: s\n    secret: {{secretName: nope}}\n",
        ns = n.ns,
        node = n.node,
        image = image("busybox:latest"),
    ));
    n.wait_pod(
        "ContainerCreating",
        "nosecret",
        "{.status.containerStatuses[0].state.waiting.reason}",
        "ContainerCreating",
    );
    n.cp.wait("the missing secret named", Duration::from_secs(30), |_| {
        n.pod_path(
            "nosecret",
            "{.status.containerStatuses[0].state.waiting.message}",
        )
        .contains("secret \"nope\" not found")
    });
    // A volume kind the node cannot make: the pod waits, the message names the volume.
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nfs\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    command: [sleep, '3600']\n    volumeMounts: [{{name: share, mountPath: /share}}]\n  volumes:\n  - name: share\n    nfs: {{server: 127.0.0.1, path: /exports}}\n",
        ns = n.ns,
        node = n.node,
        image = image("busybox:latest"),
    ));
    n.cp.wait("the unknown volume named", Duration::from_secs(30), |_| {
        n.pod_path(
            "nfs",
            "{.status.containerStatuses[0].state.waiting.message}",
        )
        .contains("\"share\"")
    });
    assert_eq!(
        n.pod_path("nfs", "{.status.containerStatuses[0].state.waiting.reason}"),
        "ContainerCreating"
    );
    assert_eq!(n.pod_path("fills", "{.status.phase}"), "Failed");
}

#[tokio::test]
async fn a_node_shutdown_turns_the_node_not_ready_before_its_pods_end() {
    let n = AgentNode::start("shutdown_grace_period_secs = 6.0\n");
    // Takes 3 s to stop: the node must be NotReady in the API while it still runs.
    n.create_pod(
        "slow",
        5,
        "trap 'sleep 3; exit 0' TERM; while true; do sleep 1; done",
    );
    n.wait_pod("Running", "slow", "{.status.phase}", "Running");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_berthctl"))
        .arg("--agent-socket")
        .arg(n.agent.daemon.state().join("agent/agent.sock"))
        .args(["node", "shutdown"])
        .output()
        .expect("berthctl");
    assert!(out.status.success(), "{out:?}");
    n.cp.wait("the node NotReady", Duration::from_secs(10), |_| {
        n.node_path("{.status.conditions[?(@.type==\"Ready\")].status}") == "False"
    });
    n.wait_pod("ended", "slow", "{.status.phase}", "Failed");
    // The node turned NotReady before the pod's container ended.
    let not_ready = n.node_path("{.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}");
    let finished = n.pod_path(
        "slow",
        "{.status.containerStatuses[0].state.terminated.finishedAt}",
    );
    eprintln!("node NotReady at {not_ready}, container finished at {finished}");

    assert!(
        !finished.is_empty() && not_ready < finished,
        "NotReady at {not_ready}, the container finished at {finished}"
    );
    assert_eq!(
        n.pod_path(
            "slow",
            "{.status.conditions[?(@.type==\"DisruptionTarget\")].status}"
        ),
        "True"
    );
}

#[tokio::test]
async fn a_pod_deleted_while_berthd_was_down_is_stopped_at_its_start() {
    let mut n = AgentNode::start("");
    let kept = n.running_sleepers(&["doomed", "kept"]).remove(1);
    n.agent.daemon.stop();
    n.cp.kubectl_ok(&[
        "-n",
        &n.ns,
        "delete",
        "pod",
        "doomed",
        "--force",
        "--grace-period=0",
    ]);
    n.agent.respawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !n.sandboxes("doomed").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the deleted pod's sandbox stayed"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    n.wait_pod(
        "kept Ready",
        "kept",
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        "True",
    );
    assert_eq!(
        n.pod_path("kept", "{.status.containerStatuses[0].containerID}"),
        kept
    );
}

/// A TCP relay to the test registry that sends the registry's answers at about 96 KiB/s, so a
/// pull through it takes seconds.
struct SlowRegistry {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SlowRegistry {
    fn start() -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(upstream) = std::net::TcpStream::connect(registry()) else {
                    continue;
                };
                let (Ok(mut c_read), Ok(mut u_write)) = (client.try_clone(), upstream.try_clone())
                else {
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_read, &mut u_write);
                });
                let (mut u_read, mut c_write) = (upstream, client);
                std::thread::spawn(move || {
                    let mut chunk = [0u8; 8192];
                    while let Ok(n) = u_read.read(&mut chunk) {
                        if n == 0 || c_write.write_all(&chunk[..n]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(80));
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { port, stop }
    }
}

impl Drop for SlowRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_long_pull_tells_its_progress_in_pulling_events() {
    let slow = SlowRegistry::start();
    let n = AgentNode::start("");
    n.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: slow\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  tolerations: [{{key: dedicated, operator: Exists}}]\n  containers:\n  - name: main\n    image: 127.0.0.1:{port}/busybox:latest\n    command: [sleep, \"1000\"]\n",
        ns = n.ns,
        node = n.node,
        port = slow.port,
    ));
    n.wait_pod("Running", "slow", "{.status.phase}", "Running");
    let pulling =
        n.cp.kubectl(&[
            "-n",
            &n.ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=slow,reason=Pulling",
            "-o",
            "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
        ])
        .1;
    // The first at the start, then at least one with the bytes so far, of the image's layers.
    let progress: Vec<(u64, u64)> = pulling
        .lines()
        .filter_map(|l| {
            let (_, counts) = l.split_once("\": ")?;
            let (received, rest) = counts.split_once(" of ")?;
            let total = rest.strip_suffix(" bytes received")?;
            Some((received.parse().ok()?, total.parse().ok()?))
        })
        .collect();
    assert!(
        pulling.lines().any(|l| l.ends_with("busybox:latest\"")),
        "{pulling}"
    );
    assert!(!progress.is_empty(), "no progress event: {pulling}");
    for (received, total) in progress {
        assert!(received > 0 && received < total, "{pulling}");
        // busybox's one layer (the manifest and config are not counted).
        assert!((1_000_000..2_000_000).contains(&total), "{pulling}");
    }
}
