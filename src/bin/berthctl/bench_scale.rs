//! `berthctl bench lists`, `berthctl bench metrics` and `berthctl bench exits`: how fast a
//! runtime answers its list calls and its pod metrics and stats (with however many pods it
//! runs), and how soon a container's exit reaches an events subscriber.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth::client::CriClient;
use berth::cri::EncodedItems;
use k8s_cri::v1 as cri;

use crate::bench::Stats;
use crate::status_message;

#[derive(clap::Args)]
pub struct ListsArgs {
    /// Calls of each list method, one after the other.
    #[arg(long, default_value_t = 200)]
    pub calls: usize,
}

#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Calls of each method, one after the other.
    #[arg(long, default_value_t = 100)]
    pub calls: usize,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MetricsReport {
    pods: usize,
    series: usize,
    list_pod_sandbox_metrics: Option<Stats>,
    list_pod_sandbox_stats: Option<Stats>,
}

/// Times ListPodSandboxMetrics and ListPodSandboxStats (no filter), `calls` of each,
/// alternately.
pub async fn metrics(client: &CriClient, args: MetricsArgs, json: bool) -> anyhow::Result<()> {
    if args.calls == 0 {
        bail!("--calls must be at least 1");
    }
    let mut rt = client.runtime();
    let (mut metrics, mut stats) = (Vec::new(), Vec::new());
    let (mut pods, mut series) = (0, 0);
    for _ in 0..args.calls {
        let t = Instant::now();
        let m = rt
            .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {})
            .await
            .map_err(status_message)
            .context("ListPodSandboxMetrics")?
            .into_inner()
            .pod_metrics;
        metrics.push(t.elapsed());
        pods = m.len();
        series = m
            .iter()
            .map(|p| {
                p.metrics.len()
                    + p.container_metrics
                        .iter()
                        .map(|c| c.metrics.len())
                        .sum::<usize>()
            })
            .sum();
        let t = Instant::now();
        rt.list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
            .await
            .map_err(status_message)
            .context("ListPodSandboxStats")?;
        stats.push(t.elapsed());
    }
    let report = MetricsReport {
        pods,
        series,
        list_pod_sandbox_metrics: Stats::of(&metrics),
        list_pod_sandbox_stats: Stats::of(&stats),
    };
    if json {
        crate::print_json(&report)?;
    } else {
        println!("{pods} pods, {series} series");
        for (name, s) in [
            ("ListPodSandboxMetrics", report.list_pod_sandbox_metrics),
            ("ListPodSandboxStats", report.list_pod_sandbox_stats),
        ] {
            if let Some(s) = s {
                println!(
                    "{name:<24} p50 {:8.3} ms  p99 {:8.3} ms",
                    s.p50_ms, s.p99_ms
                );
            }
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct ExitsArgs {
    /// Image of the containers (pulled first).
    #[arg(long)]
    pub image: String,
    /// Containers killed, one at a time.
    #[arg(long, short = 'n', default_value_t = 50)]
    pub count: usize,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ListsReport {
    containers: usize,
    pod_sandboxes: usize,
    list_containers: Option<Stats>,
    list_pod_sandbox: Option<Stats>,
    /// The same calls with the items left encoded: the runtime's answer without the client's
    /// decoding of every item.
    list_containers_undecoded: Option<Stats>,
    list_pod_sandbox_undecoded: Option<Stats>,
    /// StreamContainers (CRI v0.36), decoded: to its first message and to its end (None where
    /// the runtime does not have the call).
    stream_containers_first: Option<Stats>,
    stream_containers_all: Option<Stats>,
}

/// One StreamContainers call without a filter: (time to the first message, time to the end,
/// items); None when the runtime answers Unimplemented.
async fn stream_containers(
    channel: &tonic::transport::Channel,
) -> anyhow::Result<Option<(Duration, Duration, usize)>> {
    const METHOD: &str = "/runtime.v1.RuntimeService/StreamContainers";
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(16 << 20);
    grpc.ready().await.context(METHOD)?;
    let codec =
        tonic_prost::ProstCodec::<cri::ListContainersRequest, cri::ListContainersResponse>::default(
        );
    let started = Instant::now();
    let answer = grpc
        .server_streaming(
            tonic::Request::new(Default::default()),
            http::uri::PathAndQuery::from_static(METHOD),
            codec,
        )
        .await;
    let mut stream = match answer {
        Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
        other => other.map_err(status_message).context(METHOD)?.into_inner(),
    };
    let (mut first, mut items) = (None, 0);
    while let Some(m) = stream
        .message()
        .await
        .map_err(status_message)
        .context(METHOD)?
    {
        first.get_or_insert_with(|| started.elapsed());
        items += m.containers.len();
    }
    let all = started.elapsed();
    Ok(Some((first.unwrap_or(all), all, items)))
}

/// One list call whose items are counted, not decoded; returns how many there were.
async fn undecoded_list(
    channel: &tonic::transport::Channel,
    method: &'static str,
) -> anyhow::Result<usize> {
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(16 << 20);
    grpc.ready().await.context(method)?;
    // Both list requests without a filter are the empty message.
    let codec = tonic_prost::ProstCodec::<cri::ListContainersRequest, EncodedItems>::default();
    let path = http::uri::PathAndQuery::from_static(method);
    let resp = grpc
        .unary(tonic::Request::new(Default::default()), path, codec)
        .await
        .map_err(status_message)
        .context(method)?;
    Ok(resp.into_inner().0.len())
}

/// Times ListContainers and ListPodSandbox (no filter), `calls` of each.
pub async fn lists(client: &CriClient, args: ListsArgs, json: bool) -> anyhow::Result<()> {
    if args.calls == 0 {
        bail!("--calls must be at least 1");
    }
    let mut rt = client.runtime();
    let (mut ctrs, mut pods) = (Vec::new(), Vec::new());
    let (mut n_ctrs, mut n_pods) = (0, 0);
    for _ in 0..args.calls {
        let t = Instant::now();
        n_ctrs = rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .map_err(status_message)
            .context("ListContainers")?
            .into_inner()
            .containers
            .len();
        ctrs.push(t.elapsed());
        let t = Instant::now();
        n_pods = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .map_err(status_message)
            .context("ListPodSandbox")?
            .into_inner()
            .items
            .len();
        pods.push(t.elapsed());
    }
    let channel = client.channel();
    let (mut raw_ctrs, mut raw_pods) = (Vec::new(), Vec::new());
    for _ in 0..args.calls {
        let t = Instant::now();
        undecoded_list(&channel, "/runtime.v1.RuntimeService/ListContainers").await?;
        raw_ctrs.push(t.elapsed());
        let t = Instant::now();
        undecoded_list(&channel, "/runtime.v1.RuntimeService/ListPodSandbox").await?;
        raw_pods.push(t.elapsed());
    }
    let (mut stream_first, mut stream_all) = (Vec::new(), Vec::new());
    for _ in 0..args.calls {
        let Some((first, all, items)) = stream_containers(&channel).await? else {
            break;
        };
        if items != n_ctrs {
            bail!("StreamContainers sent {items} containers, ListContainers {n_ctrs}");
        }
        stream_first.push(first);
        stream_all.push(all);
    }
    let report = ListsReport {
        containers: n_ctrs,
        pod_sandboxes: n_pods,
        list_containers: Stats::of(&ctrs),
        list_pod_sandbox: Stats::of(&pods),
        list_containers_undecoded: Stats::of(&raw_ctrs),
        list_pod_sandbox_undecoded: Stats::of(&raw_pods),
        stream_containers_first: Stats::of(&stream_first),
        stream_containers_all: Stats::of(&stream_all),
    };
    if json {
        crate::print_json(&report)?;
    } else {
        for (name, s) in [
            (format!("ListContainers ({n_ctrs})"), report.list_containers),
            ("  items undecoded".into(), report.list_containers_undecoded),
            (
                format!("ListPodSandbox ({n_pods})"),
                report.list_pod_sandbox,
            ),
            (
                "  items undecoded".into(),
                report.list_pod_sandbox_undecoded,
            ),
            (
                "StreamContainers first".into(),
                report.stream_containers_first,
            ),
            ("  to its end".into(), report.stream_containers_all),
        ] {
            if let Some(s) = s {
                println!(
                    "{name:<24} p50 {:8.3} ms  p99 {:8.3} ms",
                    s.p50_ms, s.p99_ms
                );
            }
        }
    }
    Ok(())
}

/// Runs `count` containers in one pod and kills each init with SIGKILL in turn, timing the
/// wait for its CONTAINER_STOPPED event on a GetContainerEvents stream.
pub async fn exits(client: &CriClient, args: ExitsArgs, json: bool) -> anyhow::Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    let mut rt = client.runtime();
    let mut events = rt
        .get_container_events(cri::GetEventsRequest {})
        .await
        .map_err(status_message)
        .context("GetContainerEvents")?
        .into_inner();
    crate::bench::pull(client, &args.image).await?;
    let host = cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ..Default::default()
    };
    let log_dir = std::env::temp_dir().join(format!("berthctl-exits-{}", std::process::id()));
    let pod_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "bench-exits".into(),
            namespace: "berth-bench".into(),
            uid: format!("bench-exits-{}", std::process::id()),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(host),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .map_err(status_message)
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id;
    let timed = time_exits(client, &mut events, &pod, &pod_config, &args).await;
    let _ = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await;
    let _ = rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await;
    let _ = std::fs::remove_dir_all(&log_dir);
    let stats = Stats::of(&timed?);
    if json {
        crate::print_json(&serde_json::json!({ "exitToEvent": stats }))?;
    } else if let Some(s) = stats {
        println!(
            "exit to STOPPED event ({}): p50 {:.3} ms  p99 {:.3} ms",
            s.n, s.p50_ms, s.p99_ms
        );
    }
    Ok(())
}

async fn time_exits(
    client: &CriClient,
    events: &mut tonic::Streaming<cri::ContainerEventResponse>,
    pod: &str,
    pod_config: &cri::PodSandboxConfig,
    args: &ExitsArgs,
) -> anyhow::Result<Vec<Duration>> {
    let mut rt = client.runtime();
    let mut samples = Vec::new();
    for i in 0..args.count {
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: format!("victim-{i}"),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: args.image.clone(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            log_path: format!("victim-{i}.log"),
            ..Default::default()
        };
        let id = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map_err(status_message)
            .context("CreateContainer")?
            .into_inner()
            .container_id;
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(status_message)
        .context("StartContainer")?;
        let info = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: true,
            })
            .await
            .map_err(status_message)
            .context("ContainerStatus")?
            .into_inner()
            .info;
        let pid = info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| v["pid"].as_i64())
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .with_context(|| format!("container {id}: no pid in its verbose status"))?;
        let process = rustix::process::Pid::from_raw(pid)
            .with_context(|| format!("container {id}: bad pid {pid}"))?;
        let killed = Instant::now();
        rustix::process::kill_process(process, rustix::process::Signal::KILL)
            .with_context(|| format!("killing pid {pid} of container {id}"))?;
        loop {
            let e = tokio::time::timeout(Duration::from_secs(10), events.message())
                .await
                .with_context(|| format!("no STOPPED event for {id} within 10 s"))?
                .map_err(status_message)?
                .context("the events stream ended")?;
            if e.container_id == id
                && e.container_event_type == cri::ContainerEventType::ContainerStoppedEvent as i32
            {
                samples.push(killed.elapsed());
                break;
            }
        }
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(status_message)
        .context("RemoveContainer")?;
    }
    Ok(samples)
}
