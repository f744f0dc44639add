//! berthd's and its agent's Prometheus endpoints, scraped by a real Prometheus server (Debian's)
//! and queried through its API; the text itself checked for what the work done must show.

mod agent_support;
mod common;

use std::process::Command;
use std::time::Duration;

use agent_support::*;
use common::{TempDir, free_port, http_get, spawn_logged, terminate};
use serde_json::Value;

/// The body of an HTTP answer.
fn body(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// Value of the first sample of `series` (name with its labels, as the text writes them).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

/// A Prometheus server scraping `targets` (job name, address) every second.
struct Prometheus {
    dir: TempDir,
    address: String,
    child: Option<std::process::Child>,
}

impl Prometheus {
    fn start(targets: &[(&str, &str)]) -> Self {
        let dir = TempDir::new("prometheus");
        let jobs: String = targets
            .iter()
            .map(|(job, addr)| {
                format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{addr}\"]\n")
            })
            .collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{jobs}"
            ),
        )
        .expect("config");
        let address = format!("127.0.0.1:{}", free_port());
        let child = spawn_logged(
            Command::new("/usr/bin/prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={address}")),
            &dir.path().join("prometheus.log"),
        );
        Self {
            dir,
            address,
            child: Some(child),
        }
    }

    /// `GET /api/v1/<path>` as JSON (Null until the server answers).
    async fn api(&self, path: &str) -> Value {
        let answer = http_get(&self.address, &format!("/api/v1/{path}")).await;
        serde_json::from_str(body(&answer)).unwrap_or(Value::Null)
    }

    /// The instant value of `query`, once Prometheus has one (up to 30 s).
    async fn value(&self, query: &str) -> f64 {
        let q: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
        for _ in 0..150 {
            let v = self.api(&format!("query?query={q}")).await;
            if let Some(x) = v["data"]["result"][0]["value"][1]
                .as_str()
                .and_then(|s| s.parse().ok())
            {
                return x;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "Prometheus has no value for {query}\nlog: {}",
            std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            terminate(c);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_runtime_and_the_agent() {
    let a = Agent::start_with(&["--metrics-address".into(), "127.0.0.1:0".into()]);
    let metrics_addr = std::fs::read_to_string(a.daemon.state().join("metrics-endpoint"))
        .expect("the endpoint's address")
        .trim()
        .to_string();
    let agent_addr = format!("127.0.0.1:{}", a.port());
    // A pod with a readiness probe: a pull, a sandbox, a container, probe runs.
    a.write(
        "probed.yaml",
        &pod_yaml(
            "probed",
            "exec sleep 1000",
            "",
            "    readinessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 1\n",
        ),
    );
    a.wait_pod("default", "probed", "ready", |p| {
        running(p, "main") && container(p, "main")["ready"] == true
    });

    // The text, as served: OpenMetrics, with what was done counted.
    let answer = http_get(&metrics_addr, "/metrics").await;
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{answer}"
    );
    let text = body(&answer);
    assert!(text.ends_with("# EOF\n"), "{text}");
    let run_pod =
        "berth_cri_requests_total{method=\"/runtime.v1.RuntimeService/RunPodSandbox\",code=\"OK\"}";
    assert_eq!(sample(text, run_pod), Some(1.0), "{text}");
    assert_eq!(
        sample(text, "berth_image_pulls_total{result=\"success\"}"),
        Some(1.0)
    );
    let pulled = sample(text, "berth_image_pull_bytes_total").expect("pull bytes");
    assert!(pulled > 0.0);
    assert!(sample(text, "berth_image_layers_unpacked_total").expect("layers") >= 1.0);
    assert_eq!(
        sample(text, "berth_containers{state=\"running\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(text, "berth_pod_sandboxes{state=\"ready\"}"),
        Some(1.0)
    );
    assert_eq!(sample(text, "berth_shims"), Some(1.0));
    assert!(sample(text, "berth_snapshots").expect("snapshots") >= 2.0);
    assert!(sample(text, "process_resident_memory_bytes").expect("rss") > 1e6);
    assert!(
        text.contains("# TYPE berth_cri_request_duration_seconds histogram"),
        "{text}"
    );
    let agent_text = http_get(&agent_addr, "/metrics").await;
    let agent_text = body(&agent_text);
    assert!(
        sample(
            agent_text,
            "berth_agent_probe_results_total{probe_type=\"Readiness\",result=\"success\"}"
        )
        .expect("probe results")
            >= 1.0,
        "{agent_text}"
    );
    assert_eq!(
        sample(agent_text, "berth_agent_pods{phase=\"Running\"}"),
        Some(1.0)
    );

    // A real Prometheus scrapes both and reads the same.
    let prom = Prometheus::start(&[("berth", &metrics_addr), ("agent", &agent_addr)]);
    assert_eq!(prom.value("up{job=\"berth\"}").await, 1.0);
    assert_eq!(prom.value("up{job=\"agent\"}").await, 1.0);
    assert_eq!(
        prom.value(
            "berth_cri_requests_total{method=\"/runtime.v1.RuntimeService/RunPodSandbox\",code=\"OK\"}"
        )
        .await,
        1.0
    );
    assert_eq!(prom.value("berth_image_pull_bytes_total").await, pulled);
    assert_eq!(prom.value("berth_containers{state=\"running\"}").await, 1.0);
    assert!(
        prom.value("sum(berth_cri_request_duration_seconds_count)")
            .await
            >= 3.0
    );
    assert!(
        prom.value("berth_agent_probe_results_total{probe_type=\"Readiness\",result=\"success\"}")
            .await
            >= 1.0
    );
    // Every target scraped without an error.
    let targets = prom.api("targets").await;
    for t in targets["data"]["activeTargets"]
        .as_array()
        .expect("targets")
    {
        assert_eq!(t["health"], "up", "{t}");
        assert_eq!(t["lastError"], "", "{t}");
    }
    drop(prom);
    a.finish().await;
}

/// Anything but `GET /metrics` is refused, and the endpoint is off unless asked for.
#[tokio::test]
async fn the_endpoint_serves_metrics_only_and_is_off_by_default() {
    let d = common::Daemon::start_with(&["--metrics-address", "127.0.0.1:0"]);
    let addr = std::fs::read_to_string(d.state().join("metrics-endpoint")).expect("address");
    let other = http_get(addr.trim(), "/").await;
    assert!(
        other.starts_with("HTTP/1.0 404") || other.starts_with("HTTP/1.1 404"),
        "{other}"
    );
    let off = common::Daemon::start();
    assert!(!off.state().join("metrics-endpoint").exists());
}
