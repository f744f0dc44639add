//! The stock kubelet 1.20 on berthd, registered to a real API server (etcd, kube-apiserver and
//! kube-controller-manager on loopback), used through kubectl as a cluster user would:
//! `kubectl run`, logs, exec with stdin and with a TTY, port-forward (all through the kubelet
//! into Berth's streaming server), configMap and secret volumes and env with an update seen in
//! place, the service-account token, termination messages, CrashLoopBackOff, deletion with
//! grace, and /stats/summary through the API server's node proxy.

mod cni_support;
mod common;
mod kubelet_support;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use kubelet_support::control_plane::ControlPlane;
use kubelet_support::*;

/// A cluster of one Berth node: control plane, berthd on a test network, the kubelet.
struct Cluster {
    kubelet: Kubelet,
    daemon: Daemon,
    net: cni_support::TestNet,
    cp: ControlPlane,
    /// The test's namespace (named after the node, so its pod log dirs are found on cleanup).
    ns: String,
}

impl Cluster {
    fn start() -> Self {
        let net = cni_support::TestNet::new("cluster");
        net.write("10-test.conflist", &net.standard());
        net.bridge_up();
        let node = format!("node-{}", &net.name[4..]);
        let cp = ControlPlane::start(&node);
        let args = net.daemon_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let daemon = Daemon::start_with(&args);
        let kubelet = Kubelet::start(&daemon, cp.kubelet_options(&node, &net));
        cp.wait_node_ready(&node);
        cp.create_namespace(&node);
        Cluster {
            kubelet,
            daemon,
            net,
            cp,
            ns: node,
        }
    }

    fn node(&self) -> &str {
        &self.kubelet.node_name
    }

    fn k(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend(args);
        self.cp.kubectl_ok(&a)
    }

    fn pod_path(&self, pod: &str, path: &str) -> String {
        self.cp.jsonpath(&["-n", &self.ns, "pod", pod], path)
    }

    fn wait_phase(&self, pod: &str, phase: &str) {
        self.cp.wait(
            &format!("pod {pod} {phase}"),
            Duration::from_secs(90),
            |_| self.pod_path(pod, "{.status.phase}") == phase,
        );
    }

    /// A pod bound to this node (there is no scheduler): `spec` is YAML under `spec:`.
    fn create_pod(&self, name: &str, spec: &str) {
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 2\n{spec}",
            ns = self.ns,
            node = self.node()
        ));
    }
}

fn busybox() -> String {
    image("busybox:latest")
}

#[tokio::test]
async fn kubectl_through_the_kubelet_into_berth() {
    let cl = Cluster::start();
    let img = busybox();
    let overrides = format!(
        "{{\"apiVersion\":\"v1\",\"spec\":{{\"nodeName\":\"{}\",\"terminationGracePeriodSeconds\":2}}}}",
        cl.node()
    );

    // kubectl run: a web server on the pod network, its logs, exec, port-forward.
    cl.k(&[
        "run", "web", &format!("--image={img}"), "--restart=Never",
        &format!("--overrides={overrides}"), "--command", "--",
        "sh", "-c", "mkdir /www; echo served-by-berth > /www/index.html; echo web up; exec httpd -f -p 80 -h /www",
    ]);
    cl.wait_phase("web", "Running");
    let ip = cl.pod_path("web", "{.status.podIP}");
    assert!(ip.starts_with(&cl.net.prefix), "pod IP {ip}");
    cl.cp.wait("kubectl logs", Duration::from_secs(30), |_| {
        cl.cp
            .kubectl(&["-n", &cl.ns, "logs", "web"])
            .1
            .contains("web up")
    });

    // exec with stdin.
    let mut child = cl
        .cp
        .kubectl_command()
        .args([
            "-n",
            &cl.ns,
            "exec",
            "-i",
            "web",
            "--",
            "sh",
            "-c",
            "cat; echo :done",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl exec");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"from-stdin\n")
        .expect("write stdin");
    let out = child.wait_with_output().expect("exec output");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-stdin\n:done\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // exec with a TTY (script gives kubectl a terminal).
    let cmd = format!(
        "{} --kubeconfig={} -n {} exec -it web -- tty",
        kube_bin("BERTH_TEST_KUBECTL").display(),
        cl.cp.admin.display(),
        cl.ns
    );
    let (ok, out, err) = run_for(
        std::process::Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        Duration::from_secs(30),
    );
    assert!(ok && out.contains("/dev/pts/"), "tty: {out:?} {err}");

    // port-forward through the API server, the kubelet and Berth's streaming server.
    let local = free_port();
    let mut pf = cl
        .cp
        .kubectl_command()
        .args([
            "-n",
            &cl.ns,
            "port-forward",
            "pod/web",
            &format!("{local}:80"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let mut answer = String::new();
    for _ in 0..100 {
        use std::io::Read;
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", local)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let _ = s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n");
            let _ = s.read_to_string(&mut answer);
            if !answer.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = pf.kill();
    let _ = pf.wait();
    assert!(
        answer.contains("served-by-berth"),
        "port-forward: {answer:?}"
    );

    // configMap and secret: env and volumes, the service-account token, an update in place.
    cl.k(&[
        "create",
        "configmap",
        "conf",
        "--from-literal=greeting=hello-cm",
    ]);
    cl.k(&[
        "create",
        "secret",
        "generic",
        "sec",
        "--from-literal=password=s3cret",
    ]);
    cl.create_pod(
        "config",
        &format!(
            "  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, 'echo env $GREETING $PASSWORD; sleep 1000']\n    env:\n    - name: GREETING\n      valueFrom: {{configMapKeyRef: {{name: conf, key: greeting}}}}\n    - name: PASSWORD\n      valueFrom: {{secretKeyRef: {{name: sec, key: password}}}}\n    volumeMounts:\n    - {{name: cm, mountPath: /cm}}\n    - {{name: sec, mountPath: /sec}}\n  volumes:\n  - name: cm\n    configMap: {{name: conf}}\n  - name: sec\n    secret: {{secretName: sec}}\n"
        ),
    );
    cl.wait_phase("config", "Running");
    cl.cp.wait("env in the log", Duration::from_secs(30), |_| {
        cl.cp
            .kubectl(&["-n", &cl.ns, "logs", "config"])
            .1
            .contains("env hello-cm s3cret")
    });
    let files = cl.k(&[
        "exec", "config", "--", "sh", "-c",
        "cat /cm/greeting /sec/password; echo; wc -c < /var/run/secrets/kubernetes.io/serviceaccount/token",
    ]);
    assert!(files.starts_with("hello-cms3cret\n"), "{files:?}");
    let token_len: usize = files
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        token_len > 100,
        "service-account token of {token_len} bytes"
    );
    cl.k(&[
        "patch",
        "configmap",
        "conf",
        "-p",
        "{\"data\":{\"greeting\":\"updated\"}}",
    ]);
    cl.cp.wait(
        "the configMap update in place",
        Duration::from_secs(120),
        |_| {
            cl.cp
                .kubectl(&["-n", &cl.ns, "exec", "config", "--", "cat", "/cm/greeting"])
                .1
                == "updated"
        },
    );

    // Termination message: once, not doubled (the kubelet appends its file to the message).
    cl.create_pod(
        "done",
        &format!(
            "  restartPolicy: Never\n  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, 'printf DONE > /dev/termination-log']\n"
        ),
    );
    cl.wait_phase("done", "Succeeded");
    let terminated = "{.status.containerStatuses[0].state.terminated";
    assert_eq!(
        cl.pod_path("done", &format!("{terminated}.message}}")),
        "DONE"
    );
    assert_eq!(
        cl.pod_path("done", &format!("{terminated}.reason}}")),
        "Completed"
    );

    // CrashLoopBackOff.
    cl.create_pod(
        "crash",
        &format!(
            "  containers:\n  - name: main\n    image: {img}\n    command: [sh, -c, 'exit 3']\n"
        ),
    );
    cl.cp
        .wait("CrashLoopBackOff", Duration::from_secs(90), |_| {
            cl.pod_path(
                "crash",
                "{.status.containerStatuses[0].state.waiting.reason}",
            ) == "CrashLoopBackOff"
        });
    assert_eq!(
        cl.pod_path(
            "crash",
            "{.status.containerStatuses[0].lastState.terminated.exitCode}"
        ),
        "3"
    );

    // /stats/summary through the API server's node proxy: the pods' cpu and memory.
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", cl.node());
    let mut summary = serde_json::Value::Null;
    // Seconds on an idle host; the bound is for a host the serial e2e specs keep busy. Each
    // miss is logged (shown only if the test fails) with what the summary held.
    cl.cp.wait(
        "stats/summary with the web pod",
        Duration::from_secs(120),
        |cp| {
            let (_, out, err) = cp.kubectl(&["get", "--raw", &path]);
            summary = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
            let found = summary["pods"].as_array().is_some_and(|pods| {
                pods.iter().any(|p| {
                    p["podRef"]["name"] == "web"
                        && p["cpu"]["usageNanoCores"].is_u64()
                        && p["memory"]["workingSetBytes"]
                            .as_u64()
                            .is_some_and(|m| m > 0)
                })
            });
            if !found {
                let pods: Vec<String> = summary["pods"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        format!(
                            "{} cpu={} memory={}",
                            p["podRef"]["name"], p["cpu"], p["memory"]["workingSetBytes"]
                        )
                    })
                    .collect();
                eprintln!(
                    "stats/summary without the web pod's usage: pods {pods:?} {}",
                    err.trim()
                );
            }
            found
        },
    );

    // Deletion with grace: gone from the API server, and from Berth.
    let c = cl.daemon.client().await;
    cl.k(&["delete", "pod", "web", "--grace-period=2", "--wait=true"]);
    wait_for(
        &cl.kubelet,
        "web's sandbox gone from Berth",
        Duration::from_secs(60),
        || async {
            pod_sandboxes(&c, "web")
                .await
                .iter()
                .all(|s| s.state != k8s_cri::v1::PodSandboxState::SandboxReady as i32)
        },
    )
    .await;
    cl.k(&["delete", "pod", "--all", "--grace-period=1", "--wait=true"]);
}
