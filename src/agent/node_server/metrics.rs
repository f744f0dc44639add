//! Prometheus text for `/metrics/resource` (the kubelet's resource metrics, what metrics-server
//! 0.6 reads) and `/metrics` (the agent's own gauges).

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;

use super::stats::{CpuStats, MemoryStats, Summary};
use crate::agent::AgentContext;

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Milliseconds since the epoch of an RFC 3339 time (0 when it does not parse).
fn millis(time: &str) -> i64 {
    time.parse::<Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(0)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn cpu_line(out: &mut String, name: &str, labels: &str, cpu: Option<&CpuStats>) {
    if let Some(c) = cpu
        && let Some(ns) = c.usage_core_nano_seconds
    {
        let _ = writeln!(
            out,
            "{name}{labels} {} {}",
            ns as f64 / 1e9,
            millis(&c.time)
        );
    }
}

fn memory_line(out: &mut String, name: &str, labels: &str, memory: Option<&MemoryStats>) {
    if let Some(m) = memory {
        let _ = writeln!(
            out,
            "{name}{labels} {} {}",
            m.working_set_bytes,
            millis(&m.time)
        );
    }
}

/// The resource metrics of `s`.
pub fn resource(s: &Summary) -> String {
    let mut out = String::new();
    let container_labels = |ns: &str, pod: &str, c: &str| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            label(c),
            label(ns),
            label(pod)
        )
    };
    header(
        &mut out,
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
    );
    for p in &s.pods {
        for c in &p.containers {
            let l = container_labels(&p.pod_ref.namespace, &p.pod_ref.name, &c.name);
            cpu_line(
                &mut out,
                "container_cpu_usage_seconds_total",
                &l,
                c.cpu.as_ref(),
            );
        }
    }
    header(
        &mut out,
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
    );
    for p in &s.pods {
        for c in &p.containers {
            let l = container_labels(&p.pod_ref.namespace, &p.pod_ref.name, &c.name);
            memory_line(
                &mut out,
                "container_memory_working_set_bytes",
                &l,
                c.memory.as_ref(),
            );
        }
    }
    header(
        &mut out,
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
    );
    for p in &s.pods {
        for c in &p.containers {
            let l = container_labels(&p.pod_ref.namespace, &p.pod_ref.name, &c.name);
            let _ = writeln!(
                out,
                "container_start_time_seconds{l} {}",
                millis(&c.start_time) as f64 / 1e3
            );
        }
    }
    header(
        &mut out,
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
    );
    cpu_line(
        &mut out,
        "node_cpu_usage_seconds_total",
        "",
        s.node.cpu.as_ref(),
    );
    header(
        &mut out,
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
    );
    memory_line(
        &mut out,
        "node_memory_working_set_bytes",
        "",
        s.node.memory.as_ref(),
    );
    header(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
    );
    for p in &s.pods {
        let l = format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.pod_ref.namespace),
            label(&p.pod_ref.name)
        );
        cpu_line(&mut out, "pod_cpu_usage_seconds_total", &l, p.cpu.as_ref());
    }
    header(
        &mut out,
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
    );
    for p in &s.pods {
        let l = format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.pod_ref.namespace),
            label(&p.pod_ref.name)
        );
        memory_line(
            &mut out,
            "pod_memory_working_set_bytes",
            &l,
            p.memory.as_ref(),
        );
    }
    header(
        &mut out,
        "scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
    );
    out.push_str("scrape_error 0\n");
    out
}

/// The agent's own gauges, named as the kubelet's.
pub fn agent(ctx: &AgentContext) -> String {
    let pods = ctx.pods.list();
    let running_containers: usize = pods
        .iter()
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP kubelet_node_name The node's name. The count is always 1."
    );
    let _ = writeln!(out, "# TYPE kubelet_node_name gauge");
    let _ = writeln!(
        out,
        "kubelet_node_name{{node=\"{}\"}} 1",
        label(&ctx.node.name)
    );
    let _ = writeln!(
        out,
        "# HELP kubelet_running_pods Number of pods the agent runs."
    );
    let _ = writeln!(out, "# TYPE kubelet_running_pods gauge");
    let _ = writeln!(out, "kubelet_running_pods {}", pods.len());
    let _ = writeln!(
        out,
        "# HELP kubelet_running_containers Number of containers currently running."
    );
    let _ = writeln!(out, "# TYPE kubelet_running_containers gauge");
    let _ = writeln!(
        out,
        "kubelet_running_containers{{container_state=\"running\"}} {running_containers}"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::node_server::stats::{ContainerStats, NodeStats, PodReference, PodStats};

    #[test]
    fn resource_metrics_carry_the_summarys_values() {
        let t = "2026-12-03T10:00:00Z".to_string();
        let cpu = Some(CpuStats {
            time: t.clone(),
            usage_nano_cores: Some(5),
            usage_core_nano_seconds: Some(1_500_000_000),
        });
        let memory = Some(MemoryStats {
            time: t.clone(),
            available_bytes: None,
            usage_bytes: 10,
            working_set_bytes: 4096,
            rss_bytes: 1,
            page_faults: 0,
            major_page_faults: 0,
        });
        let s = Summary {
            node: NodeStats {
                node_name: "n".into(),
                system_containers: vec![],
                start_time: t.clone(),
                cpu: cpu.clone(),
                memory: memory.clone(),
                network: None,
                fs: None,
                runtime: None,
                rlimit: None,
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "p\"q".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                },
                start_time: t.clone(),
                containers: vec![ContainerStats {
                    name: "c".into(),
                    start_time: t.clone(),
                    cpu: cpu.clone(),
                    memory: memory.clone(),
                    rootfs: None,
                    logs: None,
                }],
                cpu,
                memory,
                network: None,
                volume: vec![],
                ephemeral_storage: None,
                process_stats: None,
            }],
        };
        let text = resource(&s);
        let ms = 1_796_292_000_000i64;
        for want in [
            format!(
                "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"ns\",pod=\"p\\\"q\"}} 1.5 {ms}"
            ),
            format!(
                "container_memory_working_set_bytes{{container=\"c\",namespace=\"ns\",pod=\"p\\\"q\"}} 4096 {ms}"
            ),
            format!("node_cpu_usage_seconds_total 1.5 {ms}"),
            format!("node_memory_working_set_bytes 4096 {ms}"),
            format!("pod_memory_working_set_bytes{{namespace=\"ns\",pod=\"p\\\"q\"}} 4096 {ms}"),
            "scrape_error 0".to_string(),
        ] {
            assert!(text.lines().any(|l| l == want), "{want} missing in\n{text}");
        }
    }
}
