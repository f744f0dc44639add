//! berthd's Prometheus metrics: what the runtime counts as it works (CRI calls, pulls, layers,
//! shims, OOM kills, CNI calls, streaming sessions), kept in one process-wide set that every
//! part updates, and the registry that encodes it with what is read at each scrape.

use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Label pairs of a series.
pub type Labels<const N: usize> = [(&'static str, String); N];

type HistogramFamily<const N: usize> = Family<Labels<N>, Histogram, fn() -> Histogram>;

fn cri_buckets() -> Histogram {
    // 0.5 ms to about 75 s.
    Histogram::new(exponential_buckets(0.0005, 2.5, 14))
}

fn cni_buckets() -> Histogram {
    // 1 ms to about 60 s.
    Histogram::new(exponential_buckets(0.001, 3.0, 11))
}

/// The runtime's counters and histograms.
#[derive(Debug)]
pub struct RuntimeMetrics {
    /// CRI calls by method and gRPC code.
    pub cri_requests: Family<Labels<2>, Counter>,
    /// CRI call latency by method and gRPC code.
    pub cri_request_seconds: HistogramFamily<2>,
    /// Image pulls by result (`success`, `failure`).
    pub pulls: Family<Labels<1>, Counter>,
    /// Compressed bytes fetched from registries.
    pub pull_bytes: Counter,
    /// Time of each successful pull.
    pub pull_seconds: Histogram,
    /// Layers unpacked into snapshots.
    pub layers_unpacked: Counter,
    /// Shims found alive and taken over when berthd started.
    pub shims_reconnected: Counter,
    /// Shims that died while their container ran.
    pub shims_died: Counter,
    /// Containers killed by the kernel for memory.
    pub oom_kills: Counter,
    /// CNI plugin calls by operation (ADD, DEL, CHECK) and result.
    pub cni_seconds: HistogramFamily<2>,
    /// Streaming sessions started, by kind (exec, attach, portforward).
    pub stream_sessions: Family<Labels<1>, Counter>,
    /// Streaming sessions open now, by kind.
    pub stream_sessions_active: Family<Labels<1>, Gauge>,
}

impl RuntimeMetrics {
    fn new() -> Self {
        Self {
            cri_requests: Family::default(),
            cri_request_seconds: Family::new_with_constructor(cri_buckets),
            pulls: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            layers_unpacked: Counter::default(),
            shims_reconnected: Counter::default(),
            shims_died: Counter::default(),
            oom_kills: Counter::default(),
            cni_seconds: Family::new_with_constructor(cni_buckets),
            stream_sessions: Family::default(),
            stream_sessions_active: Family::default(),
        }
    }

    /// Counts one CRI call.
    pub fn cri_call(&self, method: &str, code: tonic::Code, seconds: f64) {
        // A method the server does not know is whatever a client sent: one label for them all.
        let method = if code == tonic::Code::Unimplemented
            && !(method.starts_with("/runtime.v1") && method.contains("Checkpoint"))
        {
            "unknown".to_string()
        } else {
            method.to_string()
        };
        let labels = [("method", method), ("code", code_name(code).to_string())];
        self.cri_requests.get_or_create(&labels).inc();
        self.cri_request_seconds
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// A streaming session of `kind` opened; it counts as active until the guard drops.
    pub fn stream_session(&'static self, kind: &'static str) -> ActiveSession {
        let labels = [("kind", kind.to_string())];
        self.stream_sessions.get_or_create(&labels).inc();
        self.stream_sessions_active.get_or_create(&labels).inc();
        ActiveSession(kind)
    }

    fn register(&'static self, r: &mut Registry) {
        r.register(
            "cri_requests",
            "CRI calls by method and gRPC code",
            self.cri_requests.clone(),
        );
        r.register_with_unit(
            "cri_request_duration",
            "CRI call latency by method and gRPC code",
            Unit::Seconds,
            self.cri_request_seconds.clone(),
        );
        r.register("image_pulls", "Image pulls by result", self.pulls.clone());
        r.register_with_unit(
            "image_pull",
            "Compressed image bytes fetched from registries",
            Unit::Bytes,
            self.pull_bytes.clone(),
        );
        r.register_with_unit(
            "image_pull_duration",
            "Time of successful image pulls",
            Unit::Seconds,
            self.pull_seconds.clone(),
        );
        r.register(
            "image_layers_unpacked",
            "Image layers unpacked into snapshots",
            self.layers_unpacked.clone(),
        );
        r.register(
            "shims_reconnected",
            "Shims found alive and taken over when berthd started",
            self.shims_reconnected.clone(),
        );
        r.register(
            "shims_died",
            "Shims that died while their container ran",
            self.shims_died.clone(),
        );
        r.register(
            "container_oom_kills",
            "Containers killed by the kernel for memory",
            self.oom_kills.clone(),
        );
        r.register_with_unit(
            "cni_duration",
            "CNI plugin calls by operation and result",
            Unit::Seconds,
            self.cni_seconds.clone(),
        );
        r.register(
            "stream_sessions",
            "Streaming sessions (exec, attach, port-forward) started",
            self.stream_sessions.clone(),
        );
        r.register(
            "stream_sessions_active",
            "Streaming sessions open now",
            self.stream_sessions_active.clone(),
        );
    }
}

/// An open streaming session (see [`RuntimeMetrics::stream_session`]).
#[derive(Debug)]
pub struct ActiveSession(&'static str);

impl Drop for ActiveSession {
    fn drop(&mut self) {
        runtime()
            .stream_sessions_active
            .get_or_create(&[("kind", self.0.to_string())])
            .dec();
    }
}

/// The gRPC code as its canonical name.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "Canceled",
        C::Unknown => "Unknown",
        C::InvalidArgument => "InvalidArgument",
        C::DeadlineExceeded => "DeadlineExceeded",
        C::NotFound => "NotFound",
        C::AlreadyExists => "AlreadyExists",
        C::PermissionDenied => "PermissionDenied",
        C::ResourceExhausted => "ResourceExhausted",
        C::FailedPrecondition => "FailedPrecondition",
        C::Aborted => "Aborted",
        C::OutOfRange => "OutOfRange",
        C::Unimplemented => "Unimplemented",
        C::Internal => "Internal",
        C::Unavailable => "Unavailable",
        C::DataLoss => "DataLoss",
        C::Unauthenticated => "Unauthenticated",
    }
}

/// The process-wide set.
pub fn runtime() -> &'static RuntimeMetrics {
    static METRICS: OnceLock<RuntimeMetrics> = OnceLock::new();
    METRICS.get_or_init(RuntimeMetrics::new)
}

/// A registry with the runtime's metrics under `berth_`, the process's own, and `collectors`
/// read at each scrape.
pub fn runtime_registry(
    collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
) -> Registry {
    let mut r = Registry::default();
    {
        let berth = r.sub_registry_with_prefix("berth");
        runtime().register(berth);
        for c in collectors {
            berth.register_collector(c);
        }
    }
    r.register_collector(Box::new(super::process::ProcessCollector));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_encodes_what_was_counted() {
        runtime().cri_call("/runtime.v1.RuntimeService/Version", tonic::Code::Ok, 0.001);
        runtime().cri_call("/made.up/Call", tonic::Code::Unimplemented, 0.001);
        let session = runtime().stream_session("exec");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &runtime_registry(Vec::new()))
            .expect("encode");
        assert!(
            text.contains(
                "berth_cri_requests_total{method=\"/runtime.v1.RuntimeService/Version\",code=\"OK\"}"
            ),
            "{text}"
        );
        assert!(
            text.contains("berth_cri_requests_total{method=\"unknown\",code=\"Unimplemented\"}"),
            "{text}"
        );
        assert!(!text.contains("made.up"));
        assert!(
            text.contains("berth_stream_sessions_active{kind=\"exec\"} 1"),
            "{text}"
        );
        drop(session);
        assert!(
            text.contains("# TYPE process_resident_memory_bytes gauge"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
