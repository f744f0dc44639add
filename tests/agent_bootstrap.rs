//! A node joining a real cluster from nothing with a bootstrap token, as `kubeadm join` does:
//! berthd starts with only a bootstrap kubeconfig, asks for its client certificate with a
//! CertificateSigningRequest; a denied request is reported and asked again, without any
//! kubeconfig written; once the RBAC bindings for `system:bootstrappers` exist, the real
//! kube-controller-manager approves and signs the request, berthd writes its kubeconfig and the
//! node becomes Ready as `system:node:<name>`.

mod agent_support;
#[path = "agent_support/cluster_node.rs"]
mod cluster_node;
mod cni_support;
mod common;
mod kubelet_support;

use std::process::Command;
use std::time::{Duration, Instant};

use cluster_node::{AgentNode, user_kubeconfig};
use kubelet_support::control_plane::PlaneOptions;

const TOKEN_ID: &str = "b3rth0";
const TOKEN_SECRET: &str = "0123456789abcdef";

/// kubectl as admin of the control plane whose admin kubeconfig is `admin`.
fn kubectl(admin: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(kubelet_support::kube_bin("BERTH_TEST_KUBECTL"))
        .arg(format!("--kubeconfig={}", admin.display()))
        .args(args)
        .output()
        .expect("kubectl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// CSRs made by `user`: (name, conditions).
fn csrs_by(admin: &std::path::Path, user: &str) -> Vec<(String, String)> {
    let text = kubectl(admin, &["get", "csr", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|c| c["spec"]["username"] == user)
                .map(|c| {
                    let conditions: Vec<String> = c["status"]["conditions"]
                        .as_array()
                        .map(|cs| {
                            cs.iter()
                                .filter_map(|c| c["type"].as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    (
                        c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                        conditions.join(","),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// CSRs of the bootstrap token's user.
fn bootstrap_csrs(admin: &std::path::Path) -> Vec<(String, String)> {
    csrs_by(admin, &format!("system:bootstrap:{TOKEN_ID}"))
}

#[tokio::test]
async fn a_node_joins_with_a_bootstrap_token_after_a_denied_request_and_renews_its_certificate() {
    // Certificates of 7 minutes: the signer backdates them by 5 minutes, so one is good for 2
    // minutes after it is issued, and due for renewal (at 80 % of its life) 36 s after.
    let plane = PlaneOptions {
        signing_duration: Some("7m"),
        ..Default::default()
    };
    let mut kubeconfig = None;
    let mut approver = None;
    let n = AgentNode::start_with("", &plane, |cp, node| {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-{TOKEN_ID}\n  namespace: kube-system\ntype: bootstrap.kubernetes.io/token\nstringData:\n  token-id: {TOKEN_ID}\n  token-secret: {TOKEN_SECRET}\n  usage-bootstrap-authentication: \"true\"\n  auth-extra-groups: system:bootstrappers:berth\n"
        ));
        // Nodes may renew their own client certificates.
        cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "berth-nodes-renew",
            "--clusterrole=system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "--group=system:nodes",
        ]);
        // Bootstrappers may ask for certificates; approval comes later in the test.
        cp.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "berth-bootstrappers-create-csrs",
            "--clusterrole=system:node-bootstrapper",
            "--group=system:bootstrappers",
        ]);
        let bootstrap = user_kubeconfig(
            cp,
            "bootstrap.kubeconfig",
            &format!("{{token: {TOKEN_ID}.{TOKEN_SECRET}}}"),
        );
        let path = cp.dir.path().join(format!("{node}.kubeconfig"));
        kubeconfig = Some(path.clone());
        // Denies the first request, then lets the controller manager approve the next one.
        let admin = cp.admin.clone();
        let written = path.clone();
        approver = Some(std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let first = loop {
                assert!(Instant::now() < deadline, "no bootstrap CSR within 60 s");
                if let Some((name, _)) = bootstrap_csrs(&admin).into_iter().next() {
                    break name;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            kubectl(&admin, &["certificate", "deny", &first]);
            std::thread::sleep(Duration::from_secs(2));
            let kubeconfig_after_denial = written.exists();
            kubectl(
                &admin,
                &[
                    "create",
                    "clusterrolebinding",
                    "berth-bootstrappers-auto-approve",
                    "--clusterrole=system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                    "--group=system:bootstrappers",
                ],
            );
            (first, kubeconfig_after_denial)
        }));
        (
            path,
            vec![
                "--bootstrap-kubeconfig".into(),
                bootstrap.display().to_string(),
            ],
        )
    });
    let joined = Instant::now();
    let (denied, kubeconfig_after_denial) =
        approver.expect("approver").join().expect("approver thread");
    assert!(
        !kubeconfig_after_denial,
        "a kubeconfig was written before a certificate was issued"
    );
    let log = n.agent.daemon.log();
    assert!(
        log.contains(&format!("certificate request {denied} was denied")),
        "the denial is not reported:\n{}",
        agent_support::important_lines(&log)
    );
    let csrs = bootstrap_csrs(&n.cp.admin);
    assert!(
        csrs.iter()
            .any(|(name, c)| name != &denied && c.contains("Approved")),
        "no approved request after the denied one: {csrs:?}"
    );
    // The node is Ready (AgentNode waited for it) and acts as itself, not as the bootstrapper.
    assert!(
        !n.cp.audited(&n.user(), "create", "nodes").is_empty(),
        "the Node was not created by {}",
        n.user()
    );
    let path = kubeconfig.expect("kubeconfig path");
    let text = std::fs::read_to_string(&path).expect("the kubeconfig is written");
    assert!(text.contains("berth-client-current/tls.crt"), "{text}");
    // The certificate lives under the root dir, which a reboot keeps (not the state dir's tmpfs).
    let pki = n.agent.daemon.root().join("agent/pki");
    assert!(
        text.contains(&format!("{}/berth-client-current/tls.crt", pki.display())),
        "the client certificate is not under {}: {text}",
        pki.display()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o077, 0, "kubeconfig mode {mode:o}");

    // Renewal: a new certificate before the first expires, and the node goes on working with
    // it once the first has expired.
    n.cp.wait(
        "the client certificate renewed",
        Duration::from_secs(90),
        |_| n.agent.daemon.log().contains("client certificate renewed"),
    );
    let renewals = csrs_by(&n.cp.admin, &n.user());
    assert!(!renewals.is_empty(), "no renewal CSR from {}", n.user());
    // Past the first certificate's end (2 min after it was issued, just before `joined`).
    let first_expired = joined + Duration::from_secs(125);
    std::thread::sleep(first_expired.saturating_duration_since(Instant::now()));
    let before = n.cp.audited(&n.user(), "update", "leases").len();
    n.cp.wait(
        "lease renewals after the first certificate expired",
        Duration::from_secs(30),
        |cp| cp.audited(&n.user(), "update", "leases").len() > before + 1,
    );
    n.agent.finish().await;
}
