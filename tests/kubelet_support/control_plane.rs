//! A real control plane on loopback for the kubelet tests: etcd, kube-apiserver and
//! kube-controller-manager 1.20.2 with certificates made by openssl (a CA, the API server's
//! serving and kubelet-client certificates, an admin and one node identity), RBAC and the Node
//! authorizer on, and a kubectl 1.20 pointed at it. Everything stops on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{KubeletOptions, kube_bin, run_for};
use crate::common::{TempDir, free_port, spawn_logged, tail};

/// The service network (virtual: nothing is routed to it), inside the CRI test range.
const SERVICE_RANGE: &str = "10.190.0.0/24";
const SERVICE_IP: &str = "10.190.0.1";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `<name>.key` and `<name>.crt` signed by the CA in `dir`.
fn issue(dir: &Path, name: &str, subject: &str, sans: Option<&str>) {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    openssl(
        dir,
        &[
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            subject,
        ],
    );
    let ext = format!("{name}.ext");
    let mut text = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
                    extendedKeyUsage=serverAuth,clientAuth\n"
        .to_string();
    if let Some(s) = sans {
        text.push_str(&format!("subjectAltName={s}\n"));
    }
    std::fs::write(dir.join(&ext), text).expect("extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// How a control plane differs from the default one.
#[derive(Debug, Clone, Default)]
pub struct PlaneOptions {
    /// The API server checks the nodes' serving certificates against the cluster CA
    /// (`--kubelet-certificate-authority`).
    pub verify_kubelets: bool,
    /// How long the certificates the controller manager signs last (`--cluster-signing-duration`,
    /// e.g. `90s`; default a year).
    pub signing_duration: Option<&'static str>,
}

/// A running etcd + kube-apiserver + kube-controller-manager.
pub struct ControlPlane {
    pub dir: TempDir,
    children: Vec<(String, Child)>,
    /// How each component was started (program and arguments), to start it again.
    commands: Vec<(String, std::ffi::OsString, Vec<std::ffi::OsString>)>,
    pub api_port: u16,
    pub admin: PathBuf,
}

impl ControlPlane {
    /// Starts everything and waits until the API server is ready and the default service
    /// account exists (pods can be created).
    pub fn start(node_name: &str) -> Self {
        Self::start_with(node_name, &PlaneOptions::default())
    }

    /// As [`ControlPlane::start`], with `opts`.
    pub fn start_with(node_name: &str, opts: &PlaneOptions) -> Self {
        let verify_kubelets = opts.verify_kubelets;
        let dir = TempDir::new("controlplane");
        let d = dir.path().to_path_buf();
        openssl(
            &d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=berth-test-ca",
            ],
        );
        issue(
            &d,
            "apiserver",
            "/CN=kube-apiserver",
            // 10.0.2.2: the host's loopback as the node VM's guest reaches it.
            Some(&format!(
                "IP:127.0.0.1,IP:10.0.2.2,DNS:localhost,IP:{SERVICE_IP},DNS:kubernetes.default.svc"
            )),
        );
        issue(
            &d,
            "apiserver-kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            None,
        );
        issue(&d, "admin", "/O=system:masters/CN=admin", None);
        issue(
            &d,
            "node",
            &format!("/O=system:nodes/CN=system:node:{node_name}"),
            None,
        );
        openssl(&d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(&d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);

        let api_port = free_port();
        let mut cp = ControlPlane {
            admin: d.join("admin.kubeconfig"),
            dir,
            children: Vec::new(),
            commands: Vec::new(),
            api_port,
        };
        cp.write_kubeconfig("admin.kubeconfig", "admin");
        cp.write_kubeconfig("node.kubeconfig", "node");

        let (client, peer) = (free_port(), free_port());
        cp.spawn(
            "etcd",
            Command::new(kube_bin("BERTH_TEST_ETCD"))
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
                .arg("--name=default"),
        );
        let f = |n: &str| d.join(n).display().to_string();
        // Every request's metadata goes to the audit log: tests count what a node sent.
        std::fs::write(
            d.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )
        .expect("audit policy");
        cp.spawn(
            "kube-apiserver",
            Command::new(kube_bin("BERTH_TEST_KUBE_APISERVER"))
                .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={api_port}"))
                .arg("--insecure-port=0")
                .arg("--advertise-address=127.0.0.1")
                .arg("--endpoint-reconciler-type=none")
                .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
                .arg(format!("--client-ca-file={}", f("ca.crt")))
                .arg(format!("--tls-cert-file={}", f("apiserver.crt")))
                .arg(format!("--tls-private-key-file={}", f("apiserver.key")))
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    f("apiserver-kubelet-client.crt")
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    f("apiserver-kubelet-client.key")
                ))
                .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
                .args(
                    verify_kubelets
                        .then(|| format!("--kubelet-certificate-authority={}", f("ca.crt"))),
                )
                .arg(format!("--service-account-key-file={}", f("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    f("sa.key")
                ))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg("--api-audiences=https://kubernetes.default.svc")
                .arg("--authorization-mode=Node,RBAC")
                .arg("--enable-bootstrap-token-auth")
                .arg("--enable-admission-plugins=NodeRestriction")
                .arg("--allow-privileged=true")
                .arg(format!("--cert-dir={}", f("apiserver-certs")))
                .arg(format!("--audit-policy-file={}", f("audit-policy.yaml")))
                .arg(format!("--audit-log-path={}", f("audit.log"))),
        );
        cp.wait("the API server ready", Duration::from_secs(90), |cp| {
            cp.kubectl(&["get", "--raw", "/readyz"]).0
        });
        cp.spawn(
            "kube-controller-manager",
            Command::new(kube_bin("BERTH_TEST_KUBE_CONTROLLER_MANAGER"))
                .arg(format!("--kubeconfig={}", f("admin.kubeconfig")))
                .arg("--bind-address=127.0.0.1")
                .arg("--port=0")
                .arg("--secure-port=0")
                .arg("--leader-elect=false")
                .arg(format!(
                    "--service-account-private-key-file={}",
                    f("sa.key")
                ))
                .arg(format!("--root-ca-file={}", f("ca.crt")))
                .arg(format!("--cluster-signing-cert-file={}", f("ca.crt")))
                .arg(format!("--cluster-signing-key-file={}", f("ca.key")))
                .args(
                    opts.signing_duration
                        .map(|d| format!("--cluster-signing-duration={d}")),
                )
                .arg("--node-monitor-grace-period=20s")
                .arg("--node-monitor-period=2s"),
        );
        cp.wait(
            "the default service account",
            Duration::from_secs(90),
            |cp| {
                cp.kubectl(&["get", "serviceaccount", "default", "-o", "name"])
                    .0
                    && cp
                        .kubectl(&["get", "secrets", "-o", "name"])
                        .1
                        .contains("default-token")
            },
        );
        cp
    }

    /// Starts kube-scheduler (tests that create pods without a node name need it).
    pub fn start_scheduler(&mut self) {
        let admin = self.admin.display().to_string();
        self.spawn(
            "kube-scheduler",
            Command::new(kube_bin("BERTH_TEST_KUBE_SCHEDULER"))
                .arg(format!("--kubeconfig={admin}"))
                .arg(format!("--authentication-kubeconfig={admin}"))
                .arg(format!("--authorization-kubeconfig={admin}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--port=0")
                .arg(format!("--secure-port={}", free_port()))
                .arg("--leader-elect=false"),
        );
    }

    fn write_kubeconfig(&self, file: &str, who: &str) {
        let d = self.dir.path();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\n\
             users:\n- name: {who}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n\
             contexts:\n- name: test\n  context: {{cluster: test, user: {who}}}\ncurrent-context: test\n",
            port = self.api_port,
            ca = d.join("ca.crt").display(),
            crt = d.join(format!("{who}.crt")).display(),
            key = d.join(format!("{who}.key")).display(),
        );
        std::fs::write(d.join(file), text).expect("kubeconfig");
    }

    /// Options for a kubelet registered here as `node`, serving on `net`'s host side.
    pub fn kubelet_options(&self, node: &str, net: &crate::cni_support::TestNet) -> KubeletOptions {
        KubeletOptions {
            kubeconfig: Some(self.node_kubeconfig()),
            node_name: Some(node.to_string()),
            client_ca: Some(self.ca()),
            address: Some(net.gateway()),
            port: None,
            extra_config: String::new(),
        }
    }

    /// Waits until Node `node` is Ready.
    pub fn wait_node_ready(&self, node: &str) {
        self.wait("the node Ready", Duration::from_secs(90), |cp| {
            cp.jsonpath(
                &["node", node],
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            ) == "True"
        });
    }

    /// Creates namespace `ns` and waits for its default service account and the cluster CA's
    /// configMap (every pod's token volume needs both; without the configMap the kubelet's
    /// first mount fails).
    pub fn create_namespace(&self, ns: &str) {
        self.kubectl_ok(&["create", "namespace", ns]);
        self.wait(
            "the namespace's service account and kube-root-ca.crt",
            Duration::from_secs(60),
            |cp| {
                cp.kubectl(&["-n", ns, "get", "serviceaccount", "default"])
                    .0
                    && cp
                        .kubectl(&["-n", ns, "get", "configmap", "kube-root-ca.crt"])
                        .0
            },
        );
    }

    /// A kubeconfig of one more node identity, `system:node:<name>` in `system:nodes`.
    pub fn add_node(&self, name: &str) -> PathBuf {
        let file = format!("node-{name}");
        issue(
            self.dir.path(),
            &file,
            &format!("/O=system:nodes/CN=system:node:{name}"),
            None,
        );
        self.write_kubeconfig(&format!("{file}.kubeconfig"), &file);
        self.dir.path().join(format!("{file}.kubeconfig"))
    }

    /// The kubeconfig of the node identity (`system:node:<name>`).
    pub fn node_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("node.kubeconfig")
    }

    /// The CA that signed every certificate (the kubelet authenticates the API server with it).
    /// A certificate and key signed by the cluster CA for `subject` (`/O=.../CN=...`), with
    /// subject alternative names `sans` (`IP:...,DNS:...`): usable to serve and as a client.
    pub fn issue(&self, name: &str, subject: &str, sans: Option<&str>) -> (PathBuf, PathBuf) {
        issue(self.dir.path(), name, subject, sans);
        (
            self.dir.path().join(format!("{name}.crt")),
            self.dir.path().join(format!("{name}.key")),
        )
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn spawn(&mut self, name: &str, cmd: &mut Command) {
        let child = spawn_logged(cmd, &self.dir.path().join(format!("{name}.log")));
        self.children.push((name.to_string(), child));
        if !self.commands.iter().any(|(n, _, _)| n == name) {
            self.commands.push((
                name.to_string(),
                cmd.get_program().to_os_string(),
                cmd.get_args().map(|a| a.to_os_string()).collect(),
            ));
        }
    }

    /// The audit events so far whose user is `user`, verb `verb` and resource `resource`
    /// (`nodes/status`, `leases`, ...), as the API server logged them.
    pub fn audited(&self, user: &str, verb: &str, resource: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        let (res, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, s),
            None => (resource, ""),
        };
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .filter(|e| e["user"]["username"] == user && e["verb"] == verb)
            .filter(|e| {
                e["objectRef"]["resource"] == res
                    && e["objectRef"]["subresource"].as_str().unwrap_or("") == sub
            })
            .collect()
    }

    /// Stops component `name` (SIGKILL, as a crash or an outage).
    pub fn stop_component(&mut self, name: &str) {
        if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts component `name` again as it was first started; for the API server, waits until
    /// it is ready.
    pub fn start_component(&mut self, name: &str) {
        let Some((_, program, args)) = self.commands.iter().find(|(n, _, _)| n == name).cloned()
        else {
            panic!("{name} was never started");
        };
        self.spawn(name, Command::new(program).args(args));
        if name == "kube-apiserver" {
            self.wait(
                "the API server ready again",
                Duration::from_secs(90),
                |cp| cp.kubectl(&["get", "--raw", "/readyz"]).0,
            );
        }
    }

    /// A component's log.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Runs kubectl as admin: (success, stdout, stderr), bounded by 60 s.
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        run_for(self.kubectl_command().args(args), Duration::from_secs(60))
    }

    /// kubectl as admin, to run with extra settings (stdin, a background process).
    pub fn kubectl_command(&self) -> Command {
        let mut c = Command::new(kube_bin("BERTH_TEST_KUBECTL"));
        c.arg(format!("--kubeconfig={}", self.admin.display()));
        c
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed: {err}{out}");
        out
    }

    /// Applies a manifest given as text.
    pub fn apply(&self, yaml: &str) {
        let file = self.dir.path().join(format!("apply-{}.yaml", free_port()));
        std::fs::write(&file, yaml).expect("manifest");
        self.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    }

    /// `kubectl get ... -o jsonpath=<path>` (empty when it fails).
    pub fn jsonpath(&self, what: &[&str], path: &str) -> String {
        let mut args: Vec<&str> = vec!["get"];
        args.extend(what);
        let p = format!("-o=jsonpath={path}");
        args.push(&p);
        self.kubectl(&args).1
    }

    /// Polls `f` until it holds, up to `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!(
            "{what}: not within {timeout:?}\napiserver:\n{}\ncontroller-manager:\n{}",
            tail(&self.log("kube-apiserver"), 20),
            tail(&self.log("kube-controller-manager"), 20)
        );
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The controller manager first, etcd last.
        for (_, c) in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
