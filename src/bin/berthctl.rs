//! berthctl: a CRI client with crictl-like commands.

#[path = "berthctl/agent.rs"]
mod agent;
#[path = "berthctl/bench.rs"]
mod bench;
#[path = "berthctl/bench_scale.rs"]
mod bench_scale;
#[path = "berthctl/config.rs"]
mod config;
#[path = "berthctl/events.rs"]
mod events;
#[path = "berthctl/exec.rs"]
mod exec;
#[path = "berthctl/image.rs"]
mod image;
#[path = "berthctl/logs.rs"]
mod logs;
#[path = "berthctl/metrics.rs"]
mod metrics;
#[path = "berthctl/pods.rs"]
mod pods;
#[path = "berthctl/port_forward.rs"]
mod port_forward;
#[path = "berthctl/soak.rs"]
mod soak;
#[path = "berthctl/stats.rs"]
mod stats;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use berth::client::{CriClient, socket_path};
use clap::{Parser, Subcommand};
use k8s_cri::v1 as cri;

#[derive(Parser)]
#[command(
    name = "berthctl",
    version,
    about = "Talk to a CRI runtime (Berth, or any other) over its socket"
)]
struct Cli {
    /// CRI endpoint (unix socket).
    #[arg(
        long,
        short = 'r',
        global = true,
        env = "BERTH_ENDPOINT",
        default_value = "unix:///run/berth/berth.sock"
    )]
    endpoint: String,
    /// Output format: table (the default) or json; for `image export`, the archive's file
    /// (`-` for stdout).
    #[arg(long, short = 'o', global = true, value_name = "FORMAT|FILE")]
    output: Option<String>,
    /// The node agent's read-only TCP endpoint, when berthd serves one (`agent.address`), for
    /// `pods --agent` and `node`; without it they read the control socket.
    #[arg(long, global = true, env = "BERTH_AGENT_ADDRESS", default_value = "")]
    agent_address: String,
    /// The node agent's control socket (`node shutdown`, and `pods --agent` and `node` unless
    /// `--agent-address` is given).
    #[arg(
        long,
        global = true,
        env = "BERTH_AGENT_SOCKET",
        default_value = "/run/berth/agent/agent.sock"
    )]
    agent_socket: String,
    /// Seconds before a call gives up.
    #[arg(long, global = true, default_value_t = 600)]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum NodeAction {
    /// Shut the node's pods down as for a node shutdown (regular pods first, critical pods
    /// last, within agent.shutdown_grace_period_secs), then print what happened.
    Shutdown,
}

#[derive(Subcommand)]
enum Command {
    /// Runtime name and versions.
    Version,
    /// Runtime status and conditions.
    Info,
    /// Pull an image.
    Pull {
        /// Image reference.
        image: String,
        /// Registry credentials as USER:PASSWORD.
        #[arg(long)]
        creds: Option<String>,
        /// Registry bearer token.
        #[arg(long)]
        registry_token: Option<String>,
        /// Do not show progress.
        #[arg(long, short)]
        quiet: bool,
    },
    /// List images.
    Images {
        /// Only images matching this reference.
        image: Option<String>,
        /// Show only ids.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Show an image's status (verbose).
    Inspecti {
        /// Image reference or id.
        image: String,
    },
    /// Remove images.
    Rmi {
        /// Image references or ids.
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Image filesystem usage.
    Imagefsinfo,
    /// Image archives: `import FILE|-`, `export IMAGE... -o FILE|-`.
    Image {
        #[command(subcommand)]
        action: image::ImageAction,
    },
    /// Run a pod sandbox from a pod config (JSON, crictl's format); prints its id.
    Runp {
        /// Pod config file.
        pod_config: PathBuf,
        /// Runtime handler.
        #[arg(long, default_value = "")]
        runtime: String,
    },
    /// Create a container in a pod; prints its id.
    Create {
        /// Pod sandbox id.
        pod_id: String,
        /// Container config file (JSON, crictl's format).
        container_config: PathBuf,
        /// The pod's config file, as given to runp.
        pod_config: PathBuf,
    },
    /// Start created containers.
    Start {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Stop running containers.
    Stop {
        /// Seconds between the stop signal and SIGKILL.
        #[arg(short = 't', long = "stop-timeout", default_value_t = 0)]
        stop_timeout: i64,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Change the resources of created or running containers (UpdateContainerResources); only
    /// the limits given change.
    Update {
        /// Memory limit in bytes.
        #[arg(long)]
        memory: Option<i64>,
        /// CPU CFS quota in microseconds per period.
        #[arg(long)]
        cpu_quota: Option<i64>,
        /// CPU CFS period in microseconds.
        #[arg(long)]
        cpu_period: Option<i64>,
        /// CPU shares (relative weight).
        #[arg(long)]
        cpu_shares: Option<i64>,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove containers.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Stop pod sandboxes.
    Stopp {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove pod sandboxes (and their containers).
    Rmp {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// List containers (running ones unless --all).
    Ps {
        /// Containers in every state.
        #[arg(long, short)]
        all: bool,
        /// Only this pod's containers.
        #[arg(long, short)]
        pod: Option<String>,
        /// Show only ids.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Containers' status and verbose info, as JSON.
    Inspect {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Pod sandboxes' status (network, IP) and verbose info, as JSON.
    Inspectp {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Attach to a running container's streams (`-i` stdin, `-t` its terminal).
    Attach(exec::AttachArgs),
    /// Forward local ports to a pod's ports (`LOCAL:REMOTE`), until interrupted.
    PortForward(port_forward::PortForwardArgs),
    /// The CRI metrics of pods and their containers (every pod, or those whose ids begin
    /// with the ones given), one series per line.
    Metricsp {
        /// Pod sandbox ids or prefixes.
        pods: Vec<String>,
    },
    /// Follow the runtime's container events (created, started, stopped, deleted) as lines.
    Events,
    /// CPU, memory and disk use per container (`--watch` refreshes it).
    Stats(stats::StatsArgs),
    /// Run a command in a running container (`-i` stdin, `-t` a terminal); exits with its code.
    Exec(exec::ExecArgs),
    /// A container's log (its CRI log file), as `kubectl logs` shows it.
    Logs(logs::LogsArgs),
    /// List pod sandboxes.
    Pods {
        /// Only ready pods.
        #[arg(long)]
        ready: bool,
        /// Show only ids.
        #[arg(long, short)]
        quiet: bool,
        /// Show the node agent's pods (Kubernetes view: phase, readiness, restarts) instead
        /// of CRI sandboxes.
        #[arg(long)]
        agent: bool,
    },
    /// The node agent's Node: conditions, capacity and allocatable, identity.
    Node {
        #[command(subcommand)]
        action: Option<NodeAction>,
    },
    /// Print berthctl's manual page (roff).
    #[command(hide = true)]
    Man,
    /// Benchmarks over CRI.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Time RunPodSandbox, CreateContainer, StartContainer and the teardown for N pods.
    Lifecycle(bench::LifecycleArgs),
    /// Time ListContainers and ListPodSandbox with the pods the runtime has.
    Lists(bench_scale::ListsArgs),
    /// Time ListPodSandboxMetrics and ListPodSandboxStats with the pods the runtime has.
    Metrics(bench_scale::MetricsArgs),
    /// Time a container's exit (SIGKILL) to its CONTAINER_STOPPED event.
    Exits(bench_scale::ExitsArgs),
    /// Create and remove pods without pause for a while, sampling the daemon's memory and fds.
    Soak(soak::SoakArgs),
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("berthctl: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("berthctl: {e:#}");
        std::process::exit(1);
    }
}

/// Where `pods --agent` and `node` read the agent: its TCP endpoint when one is given, else its
/// control socket.
fn agent_reads(cli: &Cli) -> agent::Target<'_> {
    if cli.agent_address.is_empty() {
        agent::Target::ControlSocket(&cli.agent_socket)
    } else {
        agent::Target::Endpoint(&cli.agent_address)
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn human_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.3}{}", UNITS[u])
    }
}

fn status_message(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", e.code(), e.message())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json = match (&cli.command, cli.output.as_deref()) {
        (
            Command::Image {
                action: image::ImageAction::Export { .. },
            },
            _,
        ) => false,
        (_, None | Some("table")) => false,
        (_, Some("json")) => true,
        (_, Some(other)) => bail!("unknown output format {other:?}: table or json"),
    };
    // The agent's commands speak to its HTTP endpoint, not to CRI.
    match &cli.command {
        Command::Pods {
            agent: true, quiet, ..
        } => return agent::pods(agent_reads(&cli), json, *quiet),
        Command::Node { action: None } => return agent::node(agent_reads(&cli), json),
        Command::Node {
            action: Some(NodeAction::Shutdown),
        } => return agent::shutdown(&cli.agent_socket, json),
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut out)?;
            return Ok(std::io::stdout().write_all(&out)?);
        }
        _ => {}
    }
    let path = socket_path(&cli.endpoint);
    let client = tokio::time::timeout(Duration::from_secs(10), CriClient::connect(&path))
        .await
        .with_context(|| format!("timed out connecting to {}", path.display()))??;
    let deadline = Duration::from_secs(cli.timeout);
    match cli.command {
        Command::Version => {
            let v = client
                .runtime()
                .version(cri::VersionRequest {
                    version: "v1".into(),
                })
                .await
                .map_err(status_message)?
                .into_inner();
            if json {
                print_json(&v)?;
            } else {
                println!("Version:  {}", v.version);
                println!("RuntimeName:  {}", v.runtime_name);
                println!("RuntimeVersion:  {}", v.runtime_version);
                println!("RuntimeApiVersion:  {}", v.runtime_api_version);
            }
        }
        Command::Info => {
            let s = client
                .runtime()
                .status(cri::StatusRequest { verbose: true })
                .await
                .map_err(status_message)?
                .into_inner();
            if json {
                print_json(&s)?;
            } else {
                for c in s.status.iter().flat_map(|s| &s.conditions) {
                    println!(
                        "{:<14} {:<6} {} {}",
                        c.r#type, c.status, c.reason, c.message
                    );
                }
            }
        }
        Command::Pull {
            image,
            creds,
            registry_token,
            quiet,
        } => {
            let mut auth = None;
            if let Some(c) = creds {
                let (u, p) = c.split_once(':').context("--creds must be USER:PASSWORD")?;
                auth = Some(cri::AuthConfig {
                    username: u.into(),
                    password: p.into(),
                    ..Default::default()
                });
            }
            if let Some(t) = registry_token {
                auth = Some(cri::AuthConfig {
                    registry_token: t,
                    ..Default::default()
                });
            }
            let req = cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                auth,
                sandbox_config: None,
            };
            let mut images = client.images();
            let pull = tokio::time::timeout(deadline, images.pull_image(req));
            let show = !quiet && !json && std::io::IsTerminal::is_terminal(&std::io::stderr());
            let resp = if show {
                with_progress(&client, &image, pull).await
            } else {
                pull.await
            }
            .context("pull timed out")?
            .map_err(status_message)?
            .into_inner();
            if json {
                print_json(&resp)?;
            } else {
                println!("Image is up to date for {}", resp.image_ref);
            }
        }
        Command::Images { image, quiet } => {
            let filter = image.map(|i| cri::ImageFilter {
                image: Some(cri::ImageSpec {
                    image: i,
                    ..Default::default()
                }),
            });
            let list = client
                .images()
                .list_images(cri::ListImagesRequest { filter })
                .await
                .map_err(status_message)?
                .into_inner();
            if json {
                print_json(&list)?;
            } else if quiet {
                for i in &list.images {
                    println!("{}", i.id);
                }
            } else {
                println!(
                    "{:<50} {:<20} {:<15} {:<10}",
                    "IMAGE", "TAG", "IMAGE ID", "SIZE"
                );
                for i in &list.images {
                    let short =
                        i.id.trim_start_matches("sha256:")
                            .chars()
                            .take(13)
                            .collect::<String>();
                    let names: Vec<(String, String)> = if i.repo_tags.is_empty() {
                        i.repo_digests
                            .iter()
                            .map(|d| {
                                (
                                    d.split('@').next().unwrap_or_default().to_string(),
                                    "<none>".into(),
                                )
                            })
                            .take(1)
                            .collect()
                    } else {
                        i.repo_tags
                            .iter()
                            .map(|t| match t.rsplit_once(':') {
                                Some((r, tag)) if !tag.contains('/') => {
                                    (r.to_string(), tag.to_string())
                                }
                                _ => (t.clone(), "<none>".into()),
                            })
                            .collect()
                    };
                    for (repo, tag) in names {
                        println!(
                            "{repo:<50} {tag:<20} {short:<15} {:<10}",
                            human_size(i.size)
                        );
                    }
                }
            }
        }
        Command::Inspecti { image } => {
            let s = client
                .images()
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    verbose: true,
                })
                .await
                .map_err(status_message)?
                .into_inner();
            if s.image.is_none() {
                bail!("no such image {image}");
            }
            let info: serde_json::Map<String, serde_json::Value> = s
                .info
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        serde_json::from_str(v).unwrap_or(serde_json::Value::String(v.clone())),
                    )
                })
                .collect();
            print_json(&serde_json::json!({ "status": s.image, "info": info }))?;
        }
        Command::Rmi { images } => {
            for image in images {
                client
                    .images()
                    .remove_image(cri::RemoveImageRequest {
                        image: Some(cri::ImageSpec {
                            image: image.clone(),
                            ..Default::default()
                        }),
                    })
                    .await
                    .map_err(status_message)
                    .with_context(|| format!("removing {image}"))?;
                if !json {
                    println!("Deleted: {image}");
                }
            }
        }
        Command::Imagefsinfo => {
            let r = client
                .images()
                .image_fs_info(cri::ImageFsInfoRequest {})
                .await
                .map_err(status_message)?
                .into_inner();
            if json {
                print_json(&r)?;
            } else {
                for f in &r.image_filesystems {
                    println!(
                        "{}  used {}  inodes {}",
                        f.fs_id
                            .as_ref()
                            .map(|i| i.mountpoint.as_str())
                            .unwrap_or_default(),
                        human_size(f.used_bytes.as_ref().map(|u| u.value).unwrap_or_default()),
                        f.inodes_used.as_ref().map(|u| u.value).unwrap_or_default()
                    );
                }
            }
        }
        Command::Runp {
            pod_config,
            runtime,
        } => {
            let id = pods::run_pod(&client, &pod_config, &runtime).await?;
            print_id(&id, json)?;
        }
        Command::Create {
            pod_id,
            container_config,
            pod_config,
        } => {
            let id = pods::create(&client, &pod_id, &container_config, &pod_config).await?;
            print_id(&id, json)?;
        }
        Command::Start { ids } => {
            pods::each(&ids, json, "starting", |id| pods::start(&client, id)).await?;
        }
        Command::Stop { stop_timeout, ids } => {
            pods::each(&ids, json, "stopping", |id| {
                pods::stop(&client, id, stop_timeout)
            })
            .await?;
        }
        Command::Update {
            memory,
            cpu_quota,
            cpu_period,
            cpu_shares,
            ids,
        } => {
            let resources = cri::LinuxContainerResources {
                memory_limit_in_bytes: memory.unwrap_or_default(),
                cpu_quota: cpu_quota.unwrap_or_default(),
                cpu_period: cpu_period.unwrap_or_default(),
                cpu_shares: cpu_shares.unwrap_or_default(),
                ..Default::default()
            };
            pods::each(&ids, json, "updating", |id| {
                pods::update(&client, id, resources.clone())
            })
            .await?;
        }
        Command::Rm { ids } => {
            pods::each(&ids, json, "removing", |id| pods::remove(&client, id)).await?;
        }
        Command::Stopp { ids } => {
            pods::each(&ids, json, "stopping pod", |id| pods::stop_pod(&client, id)).await?;
        }
        Command::Rmp { ids } => {
            pods::each(&ids, json, "removing pod", |id| {
                pods::remove_pod(&client, id)
            })
            .await?;
        }
        Command::Ps { all, pod, quiet } => {
            pods::ps(&client, pods::PsArgs { all, pod, quiet }, json).await?;
        }
        Command::Pods { ready, quiet, .. } => pods::pods(&client, ready, quiet, json).await?,
        Command::Inspect { ids } => pods::inspect_containers(&client, &ids).await?,
        Command::Inspectp { ids } => pods::inspect_pods(&client, &ids).await?,
        Command::Logs(args) => logs::logs(&client, args).await?,
        Command::Stats(args) => stats::stats(&client, args, json).await?,
        Command::Events => events::follow(&client, json).await?,
        Command::Metricsp { pods } => metrics::metricsp(&client, &pods, json).await?,
        Command::PortForward(args) => port_forward::forward(&client, args).await?,
        Command::Attach(args) => {
            let code = exec::attach(&client, args).await?;
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        Command::Exec(args) => {
            let code = exec::exec(&client, args).await?;
            // Exits here: a read of stdin still blocked would otherwise hold the runtime open.
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
        Command::Image {
            action: image::ImageAction::Import { file },
        } => image::import(&client, &file, json).await?,
        Command::Image {
            action: image::ImageAction::Export { images },
        } => image::export(&client, images, cli.output.as_deref()).await?,
        Command::Node { .. } | Command::Man => {
            bail!("internal: answered before connecting to the runtime")
        }
        Command::Bench {
            bench: Bench::Lifecycle(args),
        } => bench::lifecycle(&client, args, json).await?,
        Command::Bench {
            bench: Bench::Lists(args),
        } => bench_scale::lists(&client, args, json).await?,
        Command::Bench {
            bench: Bench::Metrics(args),
        } => bench_scale::metrics(&client, args, json).await?,
        Command::Bench {
            bench: Bench::Exits(args),
        } => bench_scale::exits(&client, args, json).await?,
        Command::Bench {
            bench: Bench::Soak(args),
        } => soak::soak(&client, args, json).await?,
    }
    Ok(())
}

fn print_id(id: &str, json: bool) -> anyhow::Result<()> {
    if json {
        print_json(&serde_json::json!({ "id": id }))
    } else {
        println!("{id}");
        Ok(())
    }
}

/// Runs `pull` while drawing per-layer byte counts from the runtime's verbose status.
async fn with_progress<F, T>(client: &CriClient, image: &str, pull: F) -> T
where
    F: std::future::Future<Output = T>,
{
    tokio::pin!(pull);
    let mut drawn = 0usize;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut stderr = std::io::stderr();
    loop {
        tokio::select! {
            out = &mut pull => {
                if drawn > 0 {
                    let _ = write!(stderr, "\x1b[{drawn}A\x1b[J");
                }
                return out;
            }
            _ = ticker.tick() => {
                let Ok(s) = client.runtime().status(cri::StatusRequest { verbose: true }).await else { continue };
                let Some(pulls) = s.into_inner().info.get("pulls").cloned() else { continue };
                let Ok(pulls) = serde_json::from_str::<serde_json::Value>(&pulls) else { continue };
                let mut lines = Vec::new();
                for p in pulls["inProgress"].as_array().into_iter().flatten() {
                    let name = p["image"].as_str().unwrap_or_default();
                    if !name.contains(image.split(['@', ':']).next().unwrap_or(image)) {
                        continue;
                    }
                    for l in p["layers"].as_array().into_iter().flatten() {
                        let digest = l["digest"].as_str().unwrap_or_default();
                        let short = digest.trim_start_matches("sha256:").chars().take(12).collect::<String>();
                        let (r, t) = (l["received"].as_u64().unwrap_or(0), l["total"].as_u64().unwrap_or(0));
                        let state = match (r, t) {
                            (r, t) if r >= t && t > 0 => "done",
                            (0, _) => "waiting",
                            _ => "downloading",
                        };
                        lines.push(format!("{short}: {state:<11} {:>10} / {:<10}", human_size(r), human_size(t)));
                    }
                }
                if drawn > 0 {
                    let _ = write!(stderr, "\x1b[{drawn}A\x1b[J");
                }
                for l in &lines {
                    let _ = writeln!(stderr, "{l}");
                }
                drawn = lines.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
