//! CRI metrics (ListMetricDescriptors, ListPodSandboxMetrics) checked against the cgroup files
//! and the pod's network namespace of a real container on a real CNI network.

mod cni_support;
mod common;

use std::collections::HashMap;
use std::time::Duration;

use berth::client::CriClient;
use berth::runtime::cgroups::Layout;
use cni_support::TestNet;
use common::*;
use k8s_cri::v1 as cri;

const MIB: i64 = 1 << 20;

async fn descriptors(c: &CriClient) -> Vec<cri::MetricDescriptor> {
    c.runtime()
        .list_metric_descriptors(cri::ListMetricDescriptorsRequest {})
        .await
        .expect("ListMetricDescriptors")
        .into_inner()
        .descriptors
}

async fn pod_metrics(c: &CriClient, pod: &str) -> Option<cri::PodSandboxMetrics> {
    c.runtime()
        .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner()
        .pod_metrics
        .into_iter()
        .find(|p| p.pod_sandbox_id == pod)
}

/// The value of the first series of `name` in `metrics`.
fn value(metrics: &[cri::Metric], name: &str) -> u64 {
    metrics
        .iter()
        .find(|m| m.name == name)
        .and_then(|m| m.value.as_ref())
        .map(|v| v.value)
        .unwrap_or_else(|| panic!("no series of {name}"))
}

fn read_u64(p: &std::path::Path) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `/proc/<pid>/net/dev` receive bytes of `iface`.
fn rx_bytes(pid: u32, iface: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).expect("net/dev");
    text.lines()
        .find_map(|l| {
            let (name, rest) = l.split_once(':')?;
            (name.trim() == iface).then(|| rest.split_whitespace().next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {iface} in {text}"))
}

#[tokio::test]
async fn pod_metrics_match_the_cgroup_and_the_pod_network() {
    let net = TestNet::new("metrics");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let args = net.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with(&args);
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let layout = Layout::detect().expect("layout");

    // Descriptors: help and labels on each, the base labels first, no name twice.
    let descs = descriptors(&c).await;
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    for desc in &descs {
        assert!(!desc.help.is_empty(), "{} has help", desc.name);
        assert_eq!(
            desc.label_keys[..5],
            ["pod", "namespace", "container", "id", "image"],
            "{}",
            desc.name
        );
        assert!(
            keys.insert(desc.name.clone(), desc.label_keys.clone())
                .is_none(),
            "{} listed once",
            desc.name
        );
    }
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_memory_rss",
        "container_fs_usage_bytes",
        "container_network_receive_bytes_total",
        "container_oom_events_total",
        "container_processes",
    ] {
        assert!(keys.contains_key(name), "{name} is declared");
    }

    let logs = d.dir.path().join("logs");
    let mut pod_cfg = pod_config("metrics", &logs, cri::NamespaceMode::Container);
    let parent = format!("/berth-test-metrics-{}", std::process::id());
    pod_cfg
        .linux
        .get_or_insert_with(Default::default)
        .cgroup_parent = parent.clone();
    let pod = run_pod(&c, &pod_cfg).await;
    let mut config = sh_container(
        "sleeper",
        &busybox,
        "head -c 1048576 /dev/zero > /written && exec sleep 1000",
        cri::NamespaceMode::Container,
    );
    config.linux.get_or_insert_with(Default::default).resources =
        Some(cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 1024,
            memory_limit_in_bytes: 64 * MIB,
            ..Default::default()
        });
    let id = run_container(&c, &pod, &pod_cfg, config).await;
    let status = container_status(&c, &id).await.expect("status");
    // The file is written and the shell has become `sleep`: one process in the cgroup.
    let procs = cgroup_file(&d, &id, "memory", "cgroup.procs");
    let mut pid = None;
    for _ in 0..200 {
        let pids: Vec<u32> = std::fs::read_to_string(&procs)
            .expect("cgroup.procs")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if let [only] = pids[..] {
            let comm = std::fs::read_to_string(format!("/proc/{only}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" {
                pid = Some(only);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = pid.expect("the container's shell became sleep");
    let usage_file = cgroup_file(
        &d,
        &id,
        "memory",
        if layout.is_v2() {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        },
    );
    let usage_before = read_u64(&usage_file);

    let m = pod_metrics(&c, &pod).await.expect("the pod's metrics");
    let usage_after = read_u64(&usage_file);
    assert_eq!(m.container_metrics.len(), 1, "{m:?}");
    let cm = &m.container_metrics[0];
    assert_eq!(cm.container_id, id);
    // Every series is declared, with as many label values as its descriptor has keys, and
    // the base labels name the pod, the container and its image.
    for metric in cm.metrics.iter().chain(&m.metrics) {
        let k = keys
            .get(&metric.name)
            .unwrap_or_else(|| panic!("{} is declared", metric.name));
        assert_eq!(metric.label_values.len(), k.len(), "{}", metric.name);
        assert!(metric.timestamp > 0);
    }
    for metric in &cm.metrics {
        assert_eq!(
            metric.label_values[..5],
            [
                "metrics",
                "default",
                "sleeper",
                id.as_str(),
                busybox.as_str()
            ],
            "{}",
            metric.name
        );
    }
    // Every declared metric has a series, but block I/O (nothing may have reached the disk)
    // and pressure (cgroup v2 only).
    let optional = |n: &str| {
        n.starts_with("container_fs_reads")
            || n.starts_with("container_fs_writes")
            || n == "container_blkio_device_usage_total"
            || n.starts_with("container_pressure_")
    };
    for name in keys.keys().filter(|n| !optional(n)) {
        assert!(
            cm.metrics.iter().chain(&m.metrics).any(|s| &s.name == name),
            "{name} has a series"
        );
    }
    let v = |name| value(&cm.metrics, name);
    assert_eq!(v("container_spec_memory_limit_bytes"), 64 << 20);
    assert_eq!(
        v("container_spec_memory_limit_bytes"),
        read_u64(&cgroup_file(
            &d,
            &id,
            "memory",
            if layout.is_v2() {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            }
        ))
    );
    assert_eq!(v("container_spec_cpu_period"), 100_000);
    assert_eq!(v("container_spec_cpu_quota"), 20_000);
    if !layout.is_v2() {
        assert_eq!(v("container_spec_cpu_shares"), 1024);
    }
    // One process (sleep), one task; its descriptors are counted.
    assert_eq!(v("container_processes"), 1);
    assert_eq!(v("container_threads"), 1);
    assert!(v("container_file_descriptors") >= 3);
    assert_eq!(v("container_oom_events_total"), 0);
    let usage = v("container_memory_usage_bytes");
    let (lo, hi) = (usage_before.min(usage_after), usage_before.max(usage_after));
    assert!(
        usage + (1 << 20) >= lo && usage <= hi + (1 << 20),
        "memory usage {usage} read between {usage_before} and {usage_after}"
    );
    assert!(v("container_memory_working_set_bytes") <= usage);
    assert_eq!(
        v("container_start_time_seconds"),
        u64::try_from(status.started_at).expect("started") / 1_000_000_000
    );
    assert!(v("container_fs_usage_bytes") >= 1 << 20, "the 1 MiB file");
    assert!(v("container_fs_inodes_total") >= v("container_fs_inodes_free"));
    // The pod's network: eth0 of its namespace, at pod level.
    let rx = m
        .metrics
        .iter()
        .find(|s| s.name == "container_network_receive_bytes_total")
        .expect("pod network series");
    assert_eq!(
        rx.label_values,
        ["metrics", "default", "", pod.as_str(), "", "eth0"]
    );
    let now = rx_bytes(pid, "eth0");
    assert!(
        rx.value.as_ref().map(|v| v.value).unwrap_or(u64::MAX) <= now,
        "received bytes no more than the namespace's counter now ({now})"
    );

    // A container that is gone is skipped, not an error.
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .expect("stop");
    let m = pod_metrics(&c, &pod)
        .await
        .expect("the pod is still listed");
    assert!(m.container_metrics.is_empty(), "{m:?}");
    remove_pod(&c, &pod).await;
    for dir in layout.dirs(&parent) {
        let _ = std::fs::remove_dir(dir);
    }
}
