//! Pod networking through CRI with Debian's CNI plugins: pods get distinct IPs and talk over
//! TCP, a hostPort answers from the host, DNS options reach resolv.conf, stop/remove (twice)
//! and a berthd restart leave no veth, netns or IP allocation, a broken plugin fails
//! RunPodSandbox cleanly, NetworkReady follows the conf dir, and the pod CIDR feeds ipRanges.
//! Every address used is on the test's own bridge or inside pods the test made.

mod cni_support;
mod common;

use std::io::Read;
use std::time::Duration;

use cni_support::TestNet;
use common::*;
use k8s_cri::v1 as cri;
use serde_json::json;

fn start(net: &TestNet) -> Daemon {
    let args = net.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(&args)
}

async fn pod_ips(c: &berth::client::CriClient, id: &str) -> Vec<String> {
    let st = sandbox_status(c, id).await;
    let net = st.network.unwrap_or_default();
    let mut ips = vec![net.ip];
    ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
    ips.retain(|i| !i.is_empty());
    ips
}

async fn network_ready(c: &berth::client::CriClient) -> cri::RuntimeCondition {
    c.runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .into_inner()
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.r#type == "NetworkReady")
        .expect("NetworkReady condition")
}

fn pod_dirs(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(d.state().join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn cache_entries(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(d.root().join("net"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn nat_rules_mentioning(id: &str) -> Vec<String> {
    let out = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .expect("iptables-save");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(id))
        .map(str::to_string)
        .collect()
}

fn random_port() -> u16 {
    let mut b = [0u8; 2];
    getrandom::fill(&mut b).expect("random");
    20000 + u16::from_le_bytes(b) % 20000
}

/// Nothing of the test's network is left: no IP held, no veth on the bridge, no pod dir,
/// no cache entry.
fn assert_clean(net: &TestNet, d: &Daemon) {
    assert!(
        net.allocations().is_empty(),
        "IPs held: {:?}",
        net.allocations()
    );
    assert!(net.veths().is_empty(), "veths left: {:?}", net.veths());
    assert!(pod_dirs(d).is_empty(), "pod dirs left: {:?}", pod_dirs(d));
    assert!(
        cache_entries(d).is_empty(),
        "cache left: {:?}",
        cache_entries(d)
    );
}

#[tokio::test]
async fn pods_get_distinct_ips_talk_over_tcp_and_a_host_port_answers_from_the_host() {
    let net = TestNet::new("pods");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let d = start(&net);
    let c = d.client().await;
    assert!(network_ready(&c).await.status);
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let host_port = random_port();

    let mut cfg_a = pod_config("net-a", &logs, cri::NamespaceMode::Container);
    cfg_a.port_mappings.push(cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: i32::from(host_port),
        host_ip: String::new(),
    });
    cfg_a.dns_config = Some(cri::DnsConfig {
        servers: vec![format!("{}.53", net.prefix)],
        searches: vec!["berth.test".into()],
        options: vec!["ndots:3".into(), "timeout:2".into()],
    });
    let a = run_pod(&c, &cfg_a).await;
    let cfg_b = pod_config("net-b", &logs, cri::NamespaceMode::Container);
    let b = run_pod(&c, &cfg_b).await;

    let ips_a = pod_ips(&c, &a).await;
    let ips_b = pod_ips(&c, &b).await;
    assert_eq!(ips_a.len(), 1, "{ips_a:?}");
    assert_eq!(ips_b.len(), 1, "{ips_b:?}");
    assert_ne!(ips_a, ips_b);
    for ip in ips_a.iter().chain(&ips_b) {
        assert!(ip.starts_with(&format!("{}.", net.prefix)), "{ip}");
    }
    let mut held = net.allocations();
    held.sort();
    let mut want = vec![ips_a[0].clone(), ips_b[0].clone()];
    want.sort();
    assert_eq!(held, want);
    assert_eq!(net.veths().len(), 2);

    let server = run_container(
        &c,
        &a,
        &cfg_a,
        sh_container(
            "server",
            &busybox,
            "while true; do echo hello-from-a | nc -l -p 8080; done",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    let client = run_container(
        &c,
        &b,
        &cfg_b,
        sh_container(
            "client",
            &busybox,
            "exec sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;
    // Pod to pod over TCP (retried while the listener starts).
    let mut got = String::new();
    for _ in 0..50 {
        let r = exec(&c, &client, &["timeout", "3", "nc", &ips_a[0], "8080"], 10)
            .await
            .expect("ExecSync");
        got = String::from_utf8_lossy(&r.stdout).to_string();
        if got.contains("hello-from-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(got.contains("hello-from-a"), "pod b read {got:?}");
    let addr = exec_ok(&c, &client, &["ip", "-o", "-4", "addr", "show", "eth0"]).await;
    assert!(addr.contains(&ips_b[0]), "{addr}");

    // The hostPort, from the host (the bridge's address is the host's side of the subnet).
    let target = format!("{}:{host_port}", net.gateway());
    let mut from_host = String::new();
    for _ in 0..50 {
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(
            &target.parse().expect("addr"),
            Duration::from_secs(2),
        ) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let _ = s.read_to_string(&mut from_host);
            if from_host.contains("hello-from-a") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        from_host.contains("hello-from-a"),
        "host read {from_host:?} from {target}"
    );

    // DNS options in the pod's resolv.conf.
    let resolv = exec_ok(&c, &server, &["cat", "/etc/resolv.conf"]).await;
    assert!(
        resolv.contains(&format!("nameserver {}.53", net.prefix)),
        "{resolv}"
    );
    assert!(resolv.contains("search berth.test"), "{resolv}");
    assert!(resolv.contains("options ndots:3 timeout:2"), "{resolv}");

    assert!(
        !nat_rules_mentioning(&a).is_empty(),
        "portmap rules for pod a"
    );
    // Stop twice (DEL is idempotent), then remove.
    for _ in 0..2 {
        c.runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: a.clone(),
            })
            .await
            .expect("StopPodSandbox");
    }
    assert!(pod_ips(&c, &a).await.is_empty(), "a stopped pod has no IP");
    assert_eq!(net.allocations(), [ips_b[0].clone()]);
    remove_pod(&c, &a).await;
    remove_pod(&c, &b).await;
    assert!(
        nat_rules_mentioning(&a).is_empty(),
        "{:?}",
        nat_rules_mentioning(&a)
    );
    assert_clean(&net, &d);
}

#[tokio::test]
async fn del_is_sent_after_a_berthd_restart() {
    let net = TestNet::new("restart");
    net.write("10-test.conflist", &net.standard());
    let mut d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("restart", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    let ips = pod_ips(&c, &pod).await;
    assert_eq!(net.allocations(), ips);
    // A verbose status shows the last CNI CHECK (CNI 1.0.0 here), started in the background
    // by the first one ("pending" until it finishes): the attachment is intact.
    let mut info = serde_json::Value::Null;
    for _ in 0..100 {
        let verbose = c
            .runtime()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod.clone(),
                verbose: true,
            })
            .await
            .expect("status")
            .into_inner();
        info = serde_json::from_str(verbose.info.get("info").map_or("{}", String::as_str))
            .expect("json");
        if info["networkCheck"] != "pending" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(info["networkCheck"], "ok", "{info}");
    // The conf dir changes while berthd is down: DEL must use what ADD used.
    std::fs::remove_file(net.conf_dir().join("10-test.conflist")).expect("rm conf");
    d.kill9();
    d.spawn();
    let c = d.client().await;
    assert!(!network_ready(&c).await.status);
    assert_eq!(pod_ips(&c, &pod).await, ips, "the IP survives the restart");
    remove_pod(&c, &pod).await;
    assert_clean(&net, &d);
}

#[tokio::test]
async fn a_broken_plugin_fails_run_pod_sandbox_and_leaves_nothing() {
    let net = TestNet::new("broken");
    net.fake_plugin(
        "brokenplug",
        r#"case "$CNI_COMMAND" in ADD) echo '{"cniVersion":"1.0.0","code":11,"msg":"no luck","details":"by design"}'; exit 1;; esac"#,
    );
    net.write(
        "10-test.conflist",
        &net.conflist(
            "1.0.0",
            vec![net.bridge_plugin(), json!({"type": "brokenplug"})],
        ),
    );
    let d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let err = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("broken", &logs, cri::NamespaceMode::Pod)),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("RunPodSandbox must fail");
    assert!(
        err.message()
            .contains("CNI plugin \"brokenplug\" ADD failed (code 11): no luck: by design"),
        "{err:?}"
    );
    assert_eq!(net.calls("brokenplug"), ["ADD", "DEL"]);
    let pods = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .items;
    assert!(pods.is_empty());
    assert_clean(&net, &d);
}

#[tokio::test]
async fn network_ready_follows_the_conf_dir_and_host_network_pods_skip_cni() {
    let net = TestNet::new("ready");
    let d = start(&net);
    let c = d.client().await;
    let cond = network_ready(&c).await;
    assert!(!cond.status);
    assert_eq!(cond.reason, "NoNetworkConfig");
    assert!(
        cond.message.contains(&net.conf_dir().display().to_string()),
        "{}",
        cond.message
    );
    // Without a network, pods still run with loopback only.
    let logs = d.dir.path().join("logs");
    let lo_only = run_pod(
        &c,
        &pod_config("lo-only", &logs, cri::NamespaceMode::Container),
    )
    .await;
    assert!(pod_ips(&c, &lo_only).await.is_empty());
    remove_pod(&c, &lo_only).await;

    net.write("10-test.conflist", &net.standard());
    let cond = network_ready(&c).await;
    assert!(cond.status, "{cond:?}");
    // hostNetwork pods get no CNI attachment.
    let mut host_cfg = pod_config("hostnet", &logs, cri::NamespaceMode::Container);
    if let Some(ns) = host_cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.network = cri::NamespaceMode::Node as i32;
    }
    let host_pod = run_pod(&c, &host_cfg).await;
    assert!(pod_ips(&c, &host_pod).await.is_empty());
    assert!(net.allocations().is_empty());
    remove_pod(&c, &host_pod).await;

    std::fs::remove_file(net.conf_dir().join("10-test.conflist")).expect("rm");
    assert!(!network_ready(&c).await.status);
    assert_clean(&net, &d);
}

#[tokio::test]
async fn the_pod_cidr_from_update_runtime_config_feeds_ip_ranges() {
    let net = TestNet::new("cidr");
    // host-local adds runtimeConfig.ipRanges before its own ranges: the config gives none.
    let mut bridge = net.bridge_plugin();
    bridge["capabilities"] = json!({ "ipRanges": true });
    if let Some(ipam) = bridge["ipam"].as_object_mut() {
        ipam.remove("ranges");
    }
    net.write("10-test.conflist", &net.conflist("1.0.0", vec![bridge]));
    let d = start(&net);
    let c = d.client().await;
    let cidr = format!("{}.128/25", net.prefix);
    c.runtime()
        .update_runtime_config(cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: cidr.clone(),
                }),
            }),
        })
        .await
        .expect("UpdateRuntimeConfig");
    let logs = d.dir.path().join("logs");
    let pod = run_pod(
        &c,
        &pod_config("cidr", &logs, cri::NamespaceMode::Container),
    )
    .await;
    let ips = pod_ips(&c, &pod).await;
    let last: u8 = ips[0]
        .rsplit('.')
        .next()
        .and_then(|o| o.parse().ok())
        .expect("ipv4");
    assert!(last > 128, "{ips:?} should come from {cidr}");
    remove_pod(&c, &pod).await;
    assert_clean(&net, &d);
}

#[tokio::test]
async fn a_berthd_killed_during_add_releases_the_network_at_its_next_start() {
    let net = TestNet::new("crash");
    net.fake_plugin(
        "slowplug",
        r#"case "$CNI_COMMAND" in ADD) sleep 2; echo '{"cniVersion":"1.0.0"}';; esac"#,
    );
    net.write(
        "10-test.conflist",
        &net.conflist(
            "1.0.0",
            vec![net.bridge_plugin(), json!({"type": "slowplug"})],
        ),
    );
    let mut d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("crash", &logs, cri::NamespaceMode::Pod);
    let bg = tokio::spawn(async move {
        c.runtime()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: String::new(),
            })
            .await
    });
    for _ in 0..200 {
        if net.calls("slowplug").contains(&"ADD".to_string()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(net.calls("slowplug"), ["ADD"]);
    assert_eq!(net.allocations().len(), 1, "bridge ran before the crash");
    d.kill9();
    let _ = bg.await;
    d.spawn();
    // The half-made sandbox is rolled back at start and its network released in the background;
    // the host end of its veth goes with the namespace, which the kernel tears down after the
    // last reference is gone.
    for _ in 0..250 {
        if net.allocations().is_empty() && cache_entries(&d).is_empty() && net.veths().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(net.calls("slowplug").contains(&"DEL".to_string()));
    assert_clean(&net, &d);
}

#[tokio::test]
async fn dual_stack_pods_report_the_second_family_as_an_additional_ip() {
    if !std::path::Path::new("/proc/net/if_inet6").exists() {
        eprintln!("skipped: no IPv6 on this host");
        return;
    }
    let net = TestNet::new("dual");
    let mut bridge = net.bridge_plugin();
    let v6 = format!("fd00:1{}::/64", &net.bridge[2..5]);
    bridge["ipam"]["ranges"]
        .as_array_mut()
        .expect("ranges")
        .push(json!([{ "subnet": v6 }]));
    net.write("10-test.conflist", &net.conflist("1.0.0", vec![bridge]));
    let d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let pod = run_pod(
        &c,
        &pod_config("dual", &logs, cri::NamespaceMode::Container),
    )
    .await;
    let ips = pod_ips(&c, &pod).await;
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(
        ips[0].starts_with(&format!("{}.", net.prefix)),
        "IPv4 first: {ips:?}"
    );
    assert!(
        ips[1].starts_with(&v6[..v6.len() - 4]),
        "then IPv6: {ips:?}"
    );
    remove_pod(&c, &pod).await;
    assert_clean(&net, &d);
}

#[tokio::test]
async fn bandwidth_annotations_shape_the_pod_through_the_bandwidth_plugin() {
    let net = TestNet::new("bw");
    net.write(
        "10-test.conflist",
        &net.conflist(
            "1.0.0",
            vec![
                net.bridge_plugin(),
                json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            ],
        ),
    );
    let d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let mut cfg = pod_config("bw", &logs, cri::NamespaceMode::Container);
    cfg.annotations
        .insert("kubernetes.io/ingress-bandwidth".into(), "10M".into());
    cfg.annotations
        .insert("kubernetes.io/egress-bandwidth".into(), "20M".into());
    let pod = run_pod(&c, &cfg).await;
    let veth = net.veths().pop().expect("the pod's veth");
    let out = std::process::Command::new("tc")
        .args(["qdisc", "show", "dev", &veth])
        .output()
        .expect("tc");
    let qdisc = String::from_utf8_lossy(&out.stdout).to_string();
    // Ingress to the pod is shaped on the host side of its veth.
    assert!(qdisc.contains("tbf") && qdisc.contains("10Mbit"), "{qdisc}");
    remove_pod(&c, &pod).await;
    assert_clean(&net, &d);

    // A malformed annotation is the pod's error, not the network's.
    cfg.annotations
        .insert("kubernetes.io/egress-bandwidth".into(), "fast".into());
    cfg.metadata.as_mut().expect("metadata").name = "bw2".into();
    let err = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("bad annotation");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("kubernetes.io/egress-bandwidth"),
        "{err:?}"
    );
    assert_clean(&net, &d);
}

#[tokio::test]
async fn a_hung_plugin_holds_up_only_its_own_pod() {
    let net = TestNet::new("hang");
    let ip = format!("{}.5/24", net.prefix);
    net.fake_plugin(
        "sometimeshangs",
        &format!(
            r#"case "$CNI_COMMAND:$CNI_ARGS" in
  ADD:*"K8S_POD_NAME=slow;"*) exec sleep 30;;
  ADD:*) echo '{{"cniVersion":"1.0.0","ips":[{{"address":"{ip}"}}]}}';;
esac"#
        ),
    );
    net.write(
        "10-test.conflist",
        &net.conflist("1.0.0", vec![json!({"type": "sometimeshangs"})]),
    );
    let d = start(&net);
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let slow_cfg = pod_config("slow", &logs, cri::NamespaceMode::Container);
    let c2 = c.clone();
    let slow = tokio::spawn(async move {
        let t = std::time::Instant::now();
        let r = c2
            .runtime()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(slow_cfg),
                runtime_handler: String::new(),
            })
            .await;
        (r, t.elapsed())
    });
    for _ in 0..250 {
        if !net.calls("sometimeshangs").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While that ADD hangs (3 s timeout), another pod runs, stops and goes.
    let t = std::time::Instant::now();
    let fast = run_pod(
        &c,
        &pod_config("fast", &logs, cri::NamespaceMode::Container),
    )
    .await;
    assert_eq!(pod_ips(&c, &fast).await, [format!("{}.5", net.prefix)]);
    remove_pod(&c, &fast).await;
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "the fast pod waited {:?}",
        t.elapsed()
    );
    let (r, took) = slow.await.expect("join");
    let err = r.expect_err("the hung ADD fails");
    assert!(
        err.message()
            .contains("CNI plugin \"sometimeshangs\" ADD: timed out after 3000 ms"),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_clean(&net, &d);
}
