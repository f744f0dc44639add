//! `berthctl bench soak`: pods created and removed without pause for a given time, with the
//! runtime daemon's memory and open files sampled along the way.
//!
//! A window of W pods stays running: each new pod (RunPodSandbox, CreateContainer,
//! StartContainer) is followed by the teardown of the oldest once there are more than W. Every
//! call is timed; the daemon's RSS and fd count are read from /proc every few seconds. The
//! report gives pods per second, p50/p99 of each call over the whole run, and the daemon's RSS
//! and fds after the warm-up against the end of the run.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth::client::CriClient;
use k8s_cri::v1 as cri;

use crate::bench::{DEFAULT_COMMAND, DOWN_STEPS, Plan, Pod, Stats, UP_STEPS, pull};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub duration_secs: u64,
    /// Pods kept running at once.
    #[arg(long, default_value_t = 10)]
    pub window: usize,
    /// Image of the container.
    #[arg(long)]
    pub image: String,
    /// Pods get their own network namespace (CNI); otherwise the host's.
    #[arg(long)]
    pub pod_network: bool,
    /// The runtime daemon's pid, whose memory and open files are sampled.
    #[arg(long)]
    pub pid: u32,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    pub sample_secs: u64,
    /// Seconds before the first sample that counts as warmed up.
    #[arg(long, default_value_t = 120)]
    pub warmup_secs: u64,
    /// Pod i gets the cgroup parent PREFIX/podI.
    #[arg(long)]
    pub cgroup_parent: Option<String>,
}

/// One reading of the daemon.
#[derive(Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Sample {
    at_secs: f64,
    rss_kib: u64,
    fds: usize,
}

fn sample(pid: u32, at: Duration) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Sample {
        at_secs: at.as_secs_f64(),
        rss_kib,
        fds,
    })
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SoakReport {
    runtime: String,
    duration_secs: f64,
    window: usize,
    pods: usize,
    failures: usize,
    pods_per_sec: f64,
    calls: Vec<(String, Stats)>,
    after_warmup: Option<Sample>,
    end: Option<Sample>,
    max_rss_kib: u64,
    max_fds: usize,
    rss_growth_kib: i64,
    fd_growth: i64,
    samples: Vec<Sample>,
}

pub async fn soak(client: &CriClient, args: SoakArgs, json: bool) -> anyhow::Result<()> {
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    if sample(args.pid, Duration::ZERO).is_none() {
        bail!("no process {} to sample (--pid)", args.pid);
    }
    let version = client
        .runtime()
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(crate::status_message)
        .context("Version")?
        .into_inner();
    let image_ref = pull(client, &args.image).await?;
    let run_id = format!(
        "soak{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
    );
    let log_dir = std::env::temp_dir().join(format!("berthctl-{run_id}"));
    let plan = Plan {
        client: client.clone(),
        run_id,
        image_ref,
        network: if args.pod_network {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Node
        } as i32,
        user_namespace: false,
        pid: cri::NamespaceMode::Container as i32,
        cgroup_parent: args.cgroup_parent.clone(),
        log_dir: log_dir.clone(),
        command: DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect(),
        stop_timeout: 2,
        interrupted: Arc::new(AtomicBool::new(false)),
    };
    let begun = Instant::now();
    let limit = Duration::from_secs(args.duration_secs);
    let every = Duration::from_secs(args.sample_secs.max(1));
    let mut next_sample = Duration::ZERO;
    let mut samples = Vec::new();
    let mut running: VecDeque<Pod> = VecDeque::new();
    let mut done: Vec<Pod> = Vec::new();
    let (mut failures, mut i) = (0usize, 0usize);
    while begun.elapsed() < limit {
        if begun.elapsed() >= next_sample {
            samples.extend(sample(args.pid, begun.elapsed()));
            next_sample += every;
        }
        let (pod, r) = plan.up(i).await;
        i += 1;
        if let Err(e) = r {
            failures += 1;
            eprintln!("berthctl: {e:#}");
            let _ = plan.down(pod).await;
            continue;
        }
        running.push_back(pod);
        if running.len() > args.window
            && let Some(old) = running.pop_front()
        {
            let (old, r) = plan.down(old).await;
            match r {
                Ok(()) => done.push(old),
                Err(e) => {
                    failures += 1;
                    eprintln!("berthctl: {e:#}");
                }
            }
        }
    }
    let elapsed = begun.elapsed();
    samples.extend(sample(args.pid, elapsed));
    for pod in running {
        let _ = plan.down(pod).await;
    }
    let _ = std::fs::remove_dir_all(&log_dir);

    let mut calls = Vec::new();
    for (k, step) in UP_STEPS.iter().enumerate() {
        let v: Vec<Duration> = done.iter().map(|p| p.up[k]).collect();
        calls.extend(Stats::of(&v).map(|s| (step.to_string(), s)));
    }
    for (k, step) in DOWN_STEPS.iter().enumerate() {
        let v: Vec<Duration> = done.iter().map(|p| p.down[k]).collect();
        calls.extend(Stats::of(&v).map(|s| (step.to_string(), s)));
    }
    let after_warmup = samples
        .iter()
        .find(|s| s.at_secs >= args.warmup_secs as f64)
        .copied();
    let end = samples.last().copied();
    let (rss_growth_kib, fd_growth) = match (after_warmup, end) {
        (Some(a), Some(e)) => (
            e.rss_kib as i64 - a.rss_kib as i64,
            e.fds as i64 - a.fds as i64,
        ),
        _ => (0, 0),
    };
    let report = SoakReport {
        runtime: format!("{} {}", version.runtime_name, version.runtime_version),
        duration_secs: elapsed.as_secs_f64(),
        window: args.window,
        pods: done.len(),
        failures,
        pods_per_sec: done.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        calls,
        after_warmup,
        end,
        max_rss_kib: samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        max_fds: samples.iter().map(|s| s.fds).max().unwrap_or(0),
        rss_growth_kib,
        fd_growth,
        samples,
    };
    if json {
        return crate::print_json(&report);
    }
    println!(
        "{}: {} pods in {:.0} s ({:.2} pods/s, window {}), {} failures",
        report.runtime,
        report.pods,
        report.duration_secs,
        report.pods_per_sec,
        report.window,
        report.failures
    );
    println!("{:<18} {:>6} {:>9} {:>9}", "CALL", "N", "P50 ms", "P99 ms");
    for (name, s) in &report.calls {
        println!(
            "{:<18} {:>6} {:>9.2} {:>9.2}",
            name, s.n, s.p50_ms, s.p99_ms
        );
    }
    if let (Some(a), Some(e)) = (report.after_warmup, report.end) {
        println!(
            "daemon after warm-up ({:.0} s): {} KiB, {} fds; at the end: {} KiB, {} fds; growth {} KiB, {} fds; max {} KiB, {} fds",
            a.at_secs,
            a.rss_kib,
            a.fds,
            e.rss_kib,
            e.fds,
            report.rss_growth_kib,
            report.fd_growth,
            report.max_rss_kib,
            report.max_fds
        );
    }
    Ok(())
}
