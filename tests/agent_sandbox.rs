//! Pod-level settings of a manifest reaching a networked pod through the agent: hostname, DNS
//! (policy None with a dnsConfig), namespaced sysctls, the pod security context and a hostPort.
//! The pod network is the test's own bridge (Debian's CNI plugins).

mod agent_support;
mod cni_support;
mod common;

use agent_support::*;
use common::{free_port, http_get, image};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_pod_settings_reach_the_pod() {
    let net = cni_support::TestNet::new("agsb");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let a = Agent::start_with(&net.daemon_args());
    let host_port = free_port();
    // Port 80 as uid 1000 works only if the sysctl reached the pod's network namespace.
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: settings\nspec:\n  hostname: web-1\n  terminationGracePeriodSeconds: 1\n  dnsPolicy: \"None\"\n  dnsConfig:\n    nameservers: [192.0.2.53]\n    searches: [example.test]\n    options:\n    - name: ndots\n      value: \"2\"\n  securityContext:\n    runAsUser: 1000\n    runAsGroup: 3000\n    supplementalGroups: [4000]\n    sysctls:\n    - name: net.ipv4.ip_unprivileged_port_start\n      value: \"0\"\n  containers:\n  - name: main\n    image: {img}\n    command: [\"httpd\", \"-f\", \"-p\", \"80\", \"-h\", \"/\"]\n    ports:\n    - containerPort: 80\n      hostPort: {host_port}\n",
        img = image("busybox")
    );
    a.write("settings.yaml", &manifest);
    let p = a.wait_pod("default", "settings", "settings running", |p| {
        running(p, "main")
    });
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    let out = common::exec_ok(
        &c,
        &id,
        &[
            "sh",
            "-c",
            "hostname; id -u; id -g; id -G; cat /proc/sys/net/ipv4/ip_unprivileged_port_start; cat /etc/resolv.conf",
        ],
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"web-1"), "{out}");
    assert_eq!(lines.get(1), Some(&"1000"), "{out}");
    assert_eq!(lines.get(2), Some(&"3000"), "{out}");
    assert!(
        lines
            .get(3)
            .is_some_and(|g| g.split_whitespace().any(|g| g == "4000")),
        "{out}"
    );
    assert_eq!(lines.get(4), Some(&"0"), "{out}");
    for want in [
        "nameserver 192.0.2.53",
        "search example.test",
        "options ndots:2",
    ] {
        assert!(out.contains(want), "{want} in {out}");
    }
    assert!(
        !out.contains("nameserver 127."),
        "dnsPolicy None takes nothing from the host: {out}"
    );

    // The hostPort answers from the host (the bridge's address is the host's side).
    let target = format!("{}:{host_port}", net.gateway());
    let answer = http_get(&target, "/").await;
    assert!(answer.starts_with("HTTP/1."), "{target}: {answer:?}");
    a.finish().await;
}
