//! `berthctl stats`: CPU, memory and writable-layer use per container (CRI ListContainerStats),
//! CPU as a share of one core over a sampling interval, and the pressure stall totals where the
//! runtime reports them (CRI v0.36); `--watch` refreshes it like top.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use berth::client::CriClient;
use berth::cri::EncodedItems;
use berth::cri::api_v136 as api;
use k8s_cri::v1 as cri;
use prost::Message;

/// What to show.
#[derive(clap::Args)]
pub struct StatsArgs {
    /// Only this pod's containers.
    #[arg(long, short)]
    pub pod: Option<String>,
    /// Seconds between the two samples CPU use is computed from.
    #[arg(long, short, default_value_t = 1.0)]
    pub seconds: f64,
    /// Refresh until interrupted.
    #[arg(long, short)]
    pub watch: bool,
}

/// One container's row.
#[derive(Debug, serde::Serialize)]
struct Row {
    id: String,
    name: String,
    pod: String,
    cpu_percent: f64,
    memory_working_set_bytes: u64,
    writable_layer_bytes: u64,
    writable_layer_inodes: u64,
    /// Microseconds some of its tasks stalled on CPU, memory and I/O (CRI v0.36's PSI), where
    /// the runtime reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pressure_stall_us: Option<PressureTotals>,
}

/// The `some` totals of a container's three pressure files.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct PressureTotals {
    cpu: u64,
    memory: u64,
    io: u64,
}

/// The part of a v0.36 ContainerStats read for the pressure: its PSI fields.
#[derive(Clone, PartialEq, prost::Message)]
struct PressureItem {
    #[prost(message, optional, tag = "2")]
    cpu: Option<api::CpuUsageExt>,
    #[prost(message, optional, tag = "3")]
    memory: Option<api::MemoryUsageExt>,
    #[prost(message, optional, tag = "6")]
    io: Option<api::IoUsage>,
}

impl PressureItem {
    /// The `some` totals, when all three files were sent.
    fn totals(&self) -> Option<PressureTotals> {
        let some = |p: Option<&api::PsiStats>| p.and_then(|p| p.some.as_ref()).map(|d| d.total);
        Some(PressureTotals {
            cpu: some(self.cpu.as_ref().and_then(|c| c.psi.as_ref()))?,
            memory: some(self.memory.as_ref().and_then(|m| m.psi.as_ref()))?,
            io: some(self.io.as_ref().and_then(|i| i.psi.as_ref()))?,
        })
    }
}

/// One ListContainerStats: each item as k8s-cri reads it, with its pressure totals where the
/// runtime sends CRI v0.36's fields (the same item bytes read a second time).
async fn sample(
    c: &CriClient,
    pod: &Option<String>,
) -> anyhow::Result<Vec<(cri::ContainerStats, Option<PressureTotals>)>> {
    const METHOD: &str = "/runtime.v1.RuntimeService/ListContainerStats";
    let filter = pod.as_ref().map(|p| cri::ContainerStatsFilter {
        pod_sandbox_id: p.clone(),
        ..Default::default()
    });
    let mut grpc = tonic::client::Grpc::new(c.channel()).max_decoding_message_size(16 << 20);
    grpc.ready().await.context(METHOD)?;
    let codec = tonic_prost::ProstCodec::<cri::ListContainerStatsRequest, EncodedItems>::default();
    let items = grpc
        .unary(
            tonic::Request::new(cri::ListContainerStatsRequest { filter }),
            http::uri::PathAndQuery::from_static(METHOD),
            codec,
        )
        .await
        .map_err(crate::status_message)
        .context(METHOD)?
        .into_inner();
    items
        .0
        .into_iter()
        .map(|item| {
            let stats = cri::ContainerStats::decode(item.clone()).context(METHOD)?;
            let pressure = PressureItem::decode(item).context(METHOD)?.totals();
            Ok((stats, pressure))
        })
        .collect()
}

fn cpu_nanos(s: &cri::ContainerStats) -> Option<(u64, i64)> {
    let cpu = s.cpu.as_ref()?;
    Some((cpu.usage_core_nano_seconds.as_ref()?.value, cpu.timestamp))
}

/// Rows from two samples `interval` apart.
async fn rows(c: &CriClient, args: &StatsArgs) -> anyhow::Result<Vec<Row>> {
    let first: HashMap<String, (u64, i64)> = sample(c, &args.pod)
        .await?
        .iter()
        .filter_map(|(s, _)| Some((s.attributes.as_ref()?.id.clone(), cpu_nanos(s)?)))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds.clamp(0.1, 60.0))).await;
    let elapsed_ns = started.elapsed().as_nanos() as f64;
    let mut rows = Vec::new();
    for (s, pressure) in sample(c, &args.pod).await? {
        let Some(attrs) = &s.attributes else { continue };
        let cpu_percent = match (first.get(&attrs.id), cpu_nanos(&s)) {
            (Some((before, t0)), Some((after, t1))) => {
                // The runtime's own timestamps when it gives them, else the wall clock.
                let span = if t1 > *t0 {
                    (t1 - t0) as f64
                } else {
                    elapsed_ns
                };
                after.saturating_sub(*before) as f64 / span * 100.0
            }
            _ => 0.0,
        };
        let value = |v: &Option<cri::UInt64Value>| v.as_ref().map(|v| v.value).unwrap_or(0);
        rows.push(Row {
            id: attrs.id.clone(),
            name: attrs
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            pod: attrs
                .labels
                .get("io.kubernetes.pod.name")
                .cloned()
                .unwrap_or_default(),
            cpu_percent,
            memory_working_set_bytes: s
                .memory
                .as_ref()
                .map(|m| value(&m.working_set_bytes))
                .unwrap_or(0),
            writable_layer_bytes: s
                .writable_layer
                .as_ref()
                .map(|w| value(&w.used_bytes))
                .unwrap_or(0),
            writable_layer_inodes: s
                .writable_layer
                .as_ref()
                .map(|w| value(&w.inodes_used))
                .unwrap_or(0),
            pressure_stall_us: pressure,
        });
    }
    rows.sort_by(|a, b| b.cpu_percent.total_cmp(&a.cpu_percent));
    Ok(rows)
}

pub async fn stats(c: &CriClient, args: StatsArgs, json: bool) -> anyhow::Result<()> {
    loop {
        let rows = rows(c, &args).await?;
        if json {
            crate::print_json(&rows)?;
        } else {
            if args.watch {
                // Clear the screen and home the cursor, as top redraws.
                print!("\x1b[2J\x1b[H");
            }
            println!(
                "{:<13}  {:<20}  {:<24}  {:>7}  {:>10}  {:>10}  {:>7}",
                "CONTAINER", "NAME", "POD", "CPU %", "MEM", "DISK", "INODES"
            );
            for r in &rows {
                println!(
                    "{:<13}  {:<20}  {:<24}  {:>7.2}  {:>10}  {:>10}  {:>7}",
                    r.id.get(..13).unwrap_or(&r.id),
                    r.name,
                    r.pod,
                    r.cpu_percent,
                    crate::human_size(r.memory_working_set_bytes),
                    crate::human_size(r.writable_layer_bytes),
                    r.writable_layer_inodes
                );
            }
        }
        if !args.watch {
            return Ok(());
        }
    }
}
