//! `berthctl metricsp`: the CRI metrics of pods and their containers (ListPodSandboxMetrics),
//! each series labelled with the keys ListMetricDescriptors gives its name.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use berth::client::CriClient;
use k8s_cri::v1 as cri;

/// One series of one pod or container.
#[derive(Debug, serde::Serialize)]
struct Series {
    pod: String,
    container: String,
    name: String,
    labels: BTreeMap<String, String>,
    value: Option<u64>,
}

/// Prints the metrics of `pods` (every pod when empty): a line per series, or JSON.
pub async fn metricsp(client: &CriClient, pods: &[String], json: bool) -> anyhow::Result<()> {
    let mut rt = client.runtime();
    let keys: HashMap<String, Vec<String>> = rt
        .list_metric_descriptors(cri::ListMetricDescriptorsRequest {})
        .await
        .map_err(crate::status_message)
        .context("ListMetricDescriptors")?
        .into_inner()
        .descriptors
        .into_iter()
        .map(|d| (d.name, d.label_keys))
        .collect();
    let all = rt
        .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})
        .await
        .map_err(crate::status_message)
        .context("ListPodSandboxMetrics")?
        .into_inner()
        .pod_metrics;
    let wanted = |id: &str| pods.is_empty() || pods.iter().any(|p| id.starts_with(p.as_str()));
    let mut series = Vec::new();
    for pod in all.iter().filter(|p| wanted(&p.pod_sandbox_id)) {
        let own = pod.metrics.iter().map(|m| ("", m));
        let containers = pod
            .container_metrics
            .iter()
            .flat_map(|c| c.metrics.iter().map(|m| (c.container_id.as_str(), m)));
        for (container, m) in own.chain(containers) {
            let names = keys.get(&m.name).map(Vec::as_slice).unwrap_or_default();
            series.push(Series {
                pod: pod.pod_sandbox_id.clone(),
                container: container.to_string(),
                name: m.name.clone(),
                labels: names.iter().cloned().zip(m.label_values.clone()).collect(),
                value: m.value.as_ref().map(|v| v.value),
            });
        }
    }
    if json {
        return crate::print_json(&series);
    }
    for s in &series {
        let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        let value = s.value.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:.13} {:<13.13} {}{{{}}} {value}",
            s.pod,
            if s.container.is_empty() {
                "-"
            } else {
                &s.container
            },
            s.name,
            labels.join(",")
        );
    }
    Ok(())
}
