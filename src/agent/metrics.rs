//! The agent's Prometheus metrics, at `/metrics` on its endpoint: probe results and evictions
//! as they happen, and, read at each scrape, its pods by phase and its garbage collection.

use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::AgentContext;
use crate::metrics::prometheus::Labels;

/// What the agent counts as it works.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    /// Probe runs by probe type (startup, liveness, readiness) and result (success, failure).
    pub probe_results: Family<Labels<2>, Counter>,
    /// Pods evicted, by the signal that reclaimed them.
    pub evictions: Family<Labels<1>, Counter>,
}

/// The process-wide set.
pub fn agent() -> &'static AgentMetrics {
    static METRICS: OnceLock<AgentMetrics> = OnceLock::new();
    METRICS.get_or_init(AgentMetrics::default)
}

/// Reads the agent's pods and GC counters when encoded.
struct StateCollector(Arc<AgentContext>);

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("agent::StateCollector")
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pods = self.0.pods.list();
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "pods",
            "Pods the agent runs (one worker each), by phase",
            None,
            gauge.metric_type(),
        )?;
        for phase in ["Pending", "Running", "Succeeded", "Failed", "Unknown"] {
            let n = pods
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .unwrap_or("Pending")
                        == phase
                })
                .count() as i64;
            ConstGauge::new(n).encode(family.encode_family(&[("phase", phase)])?)?;
        }
        let gc = crate::agent::gc::counters(&self.0.gc);
        for (name, help, unit, value) in [
            (
                "gc_containers_removed",
                "Dead containers removed by garbage collection",
                None,
                gc.containers_removed,
            ),
            (
                "gc_sandboxes_removed",
                "Dead pod sandboxes removed by garbage collection",
                None,
                gc.sandboxes_removed,
            ),
            (
                "gc_images_removed",
                "Unused images removed by garbage collection",
                None,
                gc.images_removed,
            ),
            (
                "gc_image_freed",
                "Image bytes freed by garbage collection",
                Some(Unit::Bytes),
                gc.image_bytes_freed,
            ),
        ] {
            let c = ConstCounter::new(value);
            c.encode(encoder.encode_descriptor(name, help, unit.as_ref(), c.metric_type())?)?;
        }
        Ok(())
    }
}

/// The agent's registry (`berth_agent_*`) for the pods and counters of `ctx`.
pub fn registry(ctx: Arc<AgentContext>) -> Registry {
    let mut r = Registry::default();
    let sub = r.sub_registry_with_prefix("berth_agent");
    let m = agent();
    sub.register(
        "probe_results",
        "Probe runs by probe type and result",
        m.probe_results.clone(),
    );
    sub.register(
        "evictions",
        "Pods evicted, by the signal that reclaimed them",
        m.evictions.clone(),
    );
    sub.register_collector(Box::new(StateCollector(ctx)));
    r
}
