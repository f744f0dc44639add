//! `berthctl bench lifecycle`: times the pod lifecycle over CRI, in-process, against any runtime.
//!
//! N pods are brought up (RunPodSandbox, CreateContainer, StartContainer), optionally held
//! running so their memory can be measured, then torn down (StopContainer, RemoveContainer,
//! StopPodSandbox, RemovePodSandbox). Every call is timed on its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth::client::CriClient;
use futures_util::StreamExt;
use k8s_cri::v1 as cri;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::status_message;

/// The container's default command: a long sleep that exits 0 on SIGTERM, so StopContainer
/// measures a graceful stop rather than the stop timeout.
pub(crate) const DEFAULT_COMMAND: [&str; 3] = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"];

#[derive(clap::Args)]
pub struct LifecycleArgs {
    /// Number of pods.
    #[arg(long, short = 'n', default_value_t = 50)]
    pub count: usize,
    /// Image of the container (pulled once before timing starts).
    #[arg(long)]
    pub image: String,
    /// Pods in the host's network namespace (the default; containerd needs CNI otherwise).
    #[arg(long, conflicts_with = "pod_network")]
    pub host_network: bool,
    /// Pods get their own network namespace.
    #[arg(long)]
    pub pod_network: bool,
    /// Pods brought up (and torn down) at once; 1 is strictly sequential.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub parallel: u16,
    /// Once all pods run, print "ready" on stderr and wait for SIGUSR1 (or a line on stdin,
    /// or SIGINT/SIGTERM) before tearing them down.
    #[arg(long)]
    pub hold: bool,
    /// Keep all pods running this many seconds before tearing them down.
    #[arg(long, conflicts_with = "hold")]
    pub hold_secs: Option<u64>,
    /// StopContainer's timeout in seconds.
    #[arg(long, default_value_t = 10)]
    pub stop_timeout: i64,
    /// Each pod gets its own user namespace (pod i maps container ids 0-65535 to host ids
    /// from 65536 * (i + 16)); needs --pod-network.
    #[arg(long, requires = "pod_network")]
    pub user_namespace: bool,
    /// The pod's containers share one PID namespace (shareProcessNamespace: true), whose init
    /// the runtime provides.
    #[arg(long)]
    pub share_pid: bool,
    /// Pod i gets the cgroup parent PREFIX/podI, or for a systemd slice PREFIX (`x.slice`) the
    /// slice `x-podI.slice` (default: none, the runtime's default).
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// Directory for the pods' logs (default: a temporary one, removed at the end).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// The container's command (default: sh -c "trap 'exit 0' TERM; sleep 3600 & wait").
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub(crate) const UP_STEPS: [&str; 3] = ["RunPodSandbox", "CreateContainer", "StartContainer"];
pub(crate) const DOWN_STEPS: [&str; 4] = [
    "StopContainer",
    "RemoveContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
];

/// One pod as far as it got.
#[derive(Default)]
pub(crate) struct Pod {
    pub(crate) sandbox: Option<String>,
    pub(crate) container: Option<String>,
    pub(crate) up: [Duration; 3],
    pub(crate) down: [Duration; 4],
}

/// What every pod shares.
pub(crate) struct Plan {
    pub(crate) client: CriClient,
    pub(crate) run_id: String,
    pub(crate) image_ref: String,
    pub(crate) network: i32,
    pub(crate) user_namespace: bool,
    /// The PID namespace mode of the pods and their containers.
    pub(crate) pid: i32,
    pub(crate) cgroup_parent: Option<String>,
    pub(crate) log_dir: PathBuf,
    pub(crate) command: Vec<String>,
    pub(crate) stop_timeout: i64,
    pub(crate) interrupted: Arc<AtomicBool>,
}

impl Plan {
    fn pod_config(&self, i: usize) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("bench-{i}"),
                namespace: "berth-bench".into(),
                uid: format!("{}-{i}", self.run_id),
                attempt: 0,
            }),
            // As the kubelet: host-network pods have the node's hostname (runc refuses one).
            hostname: if self.network == cri::NamespaceMode::Node as i32 {
                String::new()
            } else {
                format!("bench-{i}")
            },
            log_directory: self.log_dir.join(format!("pod-{i}")).display().to_string(),
            labels: [("berth-bench".to_string(), self.run_id.clone())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self
                    .cgroup_parent
                    .as_ref()
                    .map(|p| pod_cgroup_parent(p, i))
                    .unwrap_or_default(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: self.network,
                        pid: self.pid,
                        userns_options: self.user_namespace(i),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Pod i's own user namespace, when asked for: 65536 ids of its own.
    fn user_namespace(&self, i: usize) -> Option<cri::UserNamespace> {
        if !self.user_namespace {
            return None;
        }
        let m = cri::IdMapping {
            host_id: 65536 * (u32::try_from(i).unwrap_or(0) + 16),
            container_id: 0,
            length: 65536,
        };
        Some(cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![m],
            gids: vec![m],
        })
    }

    fn container_config(&self) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "bench".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.image_ref.clone(),
                ..Default::default()
            }),
            command: self.command.clone(),
            log_path: "bench.log".into(),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: self.network,
                        pid: self.pid,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// RunPodSandbox, CreateContainer, StartContainer, each timed. On error the pod is
    /// returned as far as it got, for the clean-up.
    pub(crate) async fn up(&self, i: usize) -> (Pod, anyhow::Result<()>) {
        let mut pod = Pod::default();
        if self.interrupted.load(Ordering::Relaxed) {
            return (pod, Err(anyhow::anyhow!("interrupted")));
        }
        let r = self.up_steps(i, &mut pod).await;
        (pod, r.with_context(|| format!("pod {i}")))
    }

    async fn up_steps(&self, i: usize, pod: &mut Pod) -> anyhow::Result<()> {
        let pod_config = self.pod_config(i);
        std::fs::create_dir_all(&pod_config.log_directory)
            .with_context(|| format!("creating {}", pod_config.log_directory))?;
        let mut rt = self.client.runtime();
        let req = cri::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        };
        let t = Instant::now();
        let sandbox = rt
            .run_pod_sandbox(req)
            .await
            .map_err(status_message)
            .context("RunPodSandbox")?
            .into_inner()
            .pod_sandbox_id;
        pod.up[0] = t.elapsed();
        pod.sandbox = Some(sandbox.clone());
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox,
            config: Some(self.container_config()),
            sandbox_config: Some(pod_config),
        };
        let t = Instant::now();
        let container = rt
            .create_container(req)
            .await
            .map_err(status_message)
            .context("CreateContainer")?
            .into_inner()
            .container_id;
        pod.up[1] = t.elapsed();
        pod.container = Some(container.clone());
        let req = cri::StartContainerRequest {
            container_id: container,
        };
        let t = Instant::now();
        rt.start_container(req)
            .await
            .map_err(status_message)
            .context("StartContainer")?;
        pod.up[2] = t.elapsed();
        Ok(())
    }

    /// StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox, each timed; steps for
    /// what the pod never got are skipped.
    pub(crate) async fn down(&self, mut pod: Pod) -> (Pod, anyhow::Result<()>) {
        let r = self.down_steps(&mut pod).await;
        let id = pod.sandbox.clone().unwrap_or_default();
        (
            pod,
            r.with_context(|| format!("tearing down pod sandbox {id}")),
        )
    }

    async fn down_steps(&self, pod: &mut Pod) -> anyhow::Result<()> {
        let mut rt = self.client.runtime();
        if let Some(id) = pod.container.clone() {
            let req = cri::StopContainerRequest {
                container_id: id.clone(),
                timeout: self.stop_timeout,
            };
            let t = Instant::now();
            rt.stop_container(req)
                .await
                .map_err(status_message)
                .context("StopContainer")?;
            pod.down[0] = t.elapsed();
            let req = cri::RemoveContainerRequest { container_id: id };
            let t = Instant::now();
            rt.remove_container(req)
                .await
                .map_err(status_message)
                .context("RemoveContainer")?;
            pod.down[1] = t.elapsed();
        }
        if let Some(id) = pod.sandbox.clone() {
            let req = cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            };
            let t = Instant::now();
            rt.stop_pod_sandbox(req)
                .await
                .map_err(status_message)
                .context("StopPodSandbox")?;
            pod.down[2] = t.elapsed();
            let req = cri::RemovePodSandboxRequest { pod_sandbox_id: id };
            let t = Instant::now();
            rt.remove_pod_sandbox(req)
                .await
                .map_err(status_message)
                .context("RemovePodSandbox")?;
            pod.down[3] = t.elapsed();
        }
        Ok(())
    }
}

/// p50, p99 (nearest rank), mean, min and max of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Stats {
    pub fn of(samples: &[Duration]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = (p / 100.0 * ms.len() as f64).ceil() as usize;
            ms[r.clamp(1, ms.len()) - 1]
        };
        Some(Stats {
            n: ms.len(),
            p50_ms: rank(50.0),
            p99_ms: rank(99.0),
            mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
            min_ms: ms[0],
            max_ms: ms[ms.len() - 1],
        })
    }
}

/// PullImage of `image`; returns the image reference the runtime gives.
pub async fn pull(client: &CriClient, image: &str) -> anyhow::Result<String> {
    Ok(client
        .images()
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map_err(status_message)
        .with_context(|| format!("pulling {image}"))?
        .into_inner()
        .image_ref)
}

/// Pod `i`'s cgroup parent below `prefix`: a path below a path, a slice below a slice.
fn pod_cgroup_parent(prefix: &str, i: usize) -> String {
    match prefix.strip_suffix(".slice") {
        Some(base) if !prefix.contains('/') => format!("{base}-pod{i}.slice"),
        _ => format!("{}/pod{i}", prefix.trim_end_matches('/')),
    }
}

pub async fn lifecycle(client: &CriClient, args: LifecycleArgs, json: bool) -> anyhow::Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    watch_signals(interrupted.clone(), wake.clone())?;
    if args.hold || args.hold_secs.is_some() {
        watch_stdin(wake.clone());
    }

    let version = client
        .runtime()
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(status_message)
        .context("Version")?
        .into_inner();
    let t = Instant::now();
    let image_ref = pull(client, &args.image).await?;
    eprintln!(
        "{} {}: pulled {} ({image_ref}) in {} ms",
        version.runtime_name,
        version.runtime_version,
        args.image,
        t.elapsed().as_millis()
    );

    let run_id = format!(
        "{:x}{:04x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
        std::process::id() & 0xffff
    );
    let (log_dir, own_log_dir) = match &args.log_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("berthctl-bench-{run_id}")),
            true,
        ),
    };
    let network = if args.pod_network {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Node
    } as i32;
    let plan = Plan {
        client: client.clone(),
        run_id,
        image_ref,
        network,
        user_namespace: args.user_namespace,
        // As the kubelet: a pod PID namespace only for shareProcessNamespace.
        pid: if args.share_pid {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        cgroup_parent: args.cgroup_parent.clone(),
        log_dir: log_dir.clone(),
        command: if args.command.is_empty() {
            DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()
        } else {
            args.command.clone()
        },
        stop_timeout: args.stop_timeout,
        interrupted: interrupted.clone(),
    };
    let k = usize::from(args.parallel);

    // Up.
    let t = Instant::now();
    let mut pods = Vec::with_capacity(args.count);
    let mut failure = None;
    let mut ups = futures_util::stream::iter(0..args.count)
        .map(|i| plan.up(i))
        .buffered(k);
    while let Some((pod, r)) = ups.next().await {
        pods.push(pod);
        if let Err(e) = r {
            // Later pods see the flag and do nothing; the ones in flight finish.
            interrupted.store(true, Ordering::Relaxed);
            failure.get_or_insert(e);
        }
    }
    drop(ups);
    let up_wall = t.elapsed();
    if let Some(e) = failure {
        eprintln!("berthctl: {e:#}; removing the pods made so far");
        let _ = teardown(&plan, pods, k).await;
        if own_log_dir {
            let _ = std::fs::remove_dir_all(&log_dir);
        }
        return Err(e);
    }

    eprintln!(
        "ready: {} pods running (berthctl pid {})",
        pods.len(),
        std::process::id()
    );
    if args.hold {
        wake.notified().await;
    } else if let Some(s) = args.hold_secs {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(s)) => {}
            _ = wake.notified() => {}
        }
    }

    // Down.
    let t = Instant::now();
    let (pods, down_err) = teardown(&plan, pods, k).await;
    let down_wall = t.elapsed();
    if own_log_dir {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    if let Some(e) = down_err {
        return Err(e);
    }

    let report = Report::new(&version, &args, &pods, up_wall, down_wall);
    if json {
        crate::print_json(&report)?;
    } else {
        report.print();
    }
    Ok(())
}

/// Tears every pod down (k at a time), carrying on past errors; returns the pods and the first
/// error.
async fn teardown(plan: &Plan, pods: Vec<Pod>, k: usize) -> (Vec<Pod>, Option<anyhow::Error>) {
    let mut downs = futures_util::stream::iter(pods)
        .map(|p| plan.down(p))
        .buffered(k);
    let mut out = Vec::new();
    let mut first = None;
    while let Some((pod, r)) = downs.next().await {
        if let Err(e) = r {
            eprintln!("berthctl: {e:#}");
            first.get_or_insert(e);
        }
        out.push(pod);
    }
    (out, first)
}

/// SIGINT/SIGTERM stop bringing pods up; they and SIGUSR1 end a hold.
fn watch_signals(interrupted: Arc<AtomicBool>, wake: Arc<Notify>) -> anyhow::Result<()> {
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut usr1 = signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => interrupted.store(true, Ordering::Relaxed),
                _ = term.recv() => interrupted.store(true, Ordering::Relaxed),
                _ = usr1.recv() => {}
            }
            wake.notify_one();
        }
    });
    Ok(())
}

/// Wakes `wake` when a line arrives on stdin (end of input does not).
fn watch_stdin(wake: Arc<Notify>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut line = String::new();
        if matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(());
        }
    });
    tokio::spawn(async move {
        if rx.await.is_ok() {
            wake.notify_one();
        }
    });
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    runtime_name: String,
    runtime_version: String,
    image: String,
    count: usize,
    parallel: u16,
    host_network: bool,
    /// Per step, and `sandbox+create+start` and `stop+remove` (all four teardown calls) per pod.
    steps: serde_json::Map<String, serde_json::Value>,
    /// Per step, each pod's time in milliseconds, in pod order.
    samples_ms: serde_json::Map<String, serde_json::Value>,
    #[serde(skip)]
    rows: Vec<(String, Stats)>,
    up_seconds: f64,
    down_seconds: f64,
}

impl Report {
    fn new(
        v: &cri::VersionResponse,
        args: &LifecycleArgs,
        pods: &[Pod],
        up: Duration,
        down: Duration,
    ) -> Report {
        let mut rows = Vec::new();
        let mut samples_ms = serde_json::Map::new();
        let mut add = |name: &str, samples: Vec<Duration>| {
            if let Some(s) = Stats::of(&samples) {
                rows.push((name.to_string(), s));
            }
            let ms: Vec<f64> = samples
                .iter()
                .map(|d| (d.as_secs_f64() * 1e4).round() / 10.0)
                .collect();
            samples_ms.insert(name.to_string(), serde_json::json!(ms));
        };
        for (i, step) in UP_STEPS.iter().enumerate() {
            add(step, pods.iter().map(|p| p.up[i]).collect());
        }
        add(
            "sandbox+create+start",
            pods.iter().map(|p| p.up.iter().sum()).collect(),
        );
        for (i, step) in DOWN_STEPS.iter().enumerate() {
            add(step, pods.iter().map(|p| p.down[i]).collect());
        }
        add(
            "stop+remove",
            pods.iter().map(|p| p.down.iter().sum()).collect(),
        );
        let steps = rows
            .iter()
            .map(|(n, s)| (n.clone(), serde_json::json!(s)))
            .collect();
        Report {
            runtime_name: v.runtime_name.clone(),
            runtime_version: v.runtime_version.clone(),
            image: args.image.clone(),
            count: pods.len(),
            parallel: args.parallel,
            host_network: !args.pod_network,
            steps,
            samples_ms,
            rows,
            up_seconds: up.as_secs_f64(),
            down_seconds: down.as_secs_f64(),
        }
    }

    fn print(&self) {
        println!(
            "{} {}: {} pods ({}), {}, image {}",
            self.runtime_name,
            self.runtime_version,
            self.count,
            if self.parallel == 1 {
                "sequential".to_string()
            } else {
                format!("{} at a time", self.parallel)
            },
            if self.host_network {
                "host network"
            } else {
                "pod network"
            },
            self.image
        );
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "step", "p50 ms", "p99 ms", "mean ms", "min ms", "max ms"
        );
        for (name, s) in &self.rows {
            println!(
                "{name:<22} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                s.p50_ms, s.p99_ms, s.mean_ms, s.min_ms, s.max_ms
            );
        }
        println!(
            "up: {} pods in {:.2} s ({:.1} pods/s); down in {:.2} s",
            self.count,
            self.up_seconds,
            self.count as f64 / self.up_seconds.max(1e-9),
            self.down_seconds
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroup_parents_follow_the_prefix_form() {
        assert_eq!(pod_cgroup_parent("/bench/", 3), "/bench/pod3");
        assert_eq!(pod_cgroup_parent("bench.slice", 3), "bench-pod3.slice");
    }

    #[test]
    fn nearest_rank_percentiles() -> anyhow::Result<()> {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Stats::of(&samples).context("stats")?;
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.min_ms, s.max_ms),
            (50.0, 99.0, 1.0, 100.0)
        );
        assert!((s.mean_ms - 50.5).abs() < 1e-9);
        let one = Stats::of(&[Duration::from_millis(7)]).context("stats")?;
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
        assert!(Stats::of(&[]).is_none());
        Ok(())
    }
}
