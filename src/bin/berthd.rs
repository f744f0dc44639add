//! berthd: the Berth daemon (CRI server).

use std::path::PathBuf;

use berth::config::{Config, DEFAULT_CONFIG_PATH};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "berthd",
    version,
    about = "Berth container runtime daemon (CRI v1 server)"
)]
struct Cli {
    /// Configuration file (TOML); missing is fine unless given explicitly.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory of drop-in configuration files (`*.toml`, applied in file-name order after
    /// the configuration file; flags still win).
    #[arg(long, value_name = "DIR")]
    config_dir: Option<PathBuf>,
    /// Persistent state directory.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Volatile state directory.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// CRI socket path.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Group (name or gid) allowed to use the CRI and agent sockets (mode 0660).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Log level (error, warn, info, debug, trace, or target=level,...).
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Registry reached over plain HTTP (repeatable).
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// Directory of containerd-style `<host>/hosts.toml` registry files.
    #[arg(long, value_name = "DIR")]
    registry_config_dir: Option<PathBuf>,
    /// Layers fetched at once per pull.
    #[arg(long, value_name = "N")]
    max_concurrent_downloads: Option<usize>,
    /// CNI network config directory.
    #[arg(long, value_name = "DIR")]
    cni_conf_dir: Option<PathBuf>,
    /// CNI plugin directory (repeatable; replaces the configured list).
    #[arg(long = "cni-bin-dir", value_name = "DIR")]
    cni_bin_dirs: Vec<PathBuf>,
    /// Seconds one CNI plugin call may take.
    #[arg(long, value_name = "SECS")]
    cni_plugin_timeout: Option<f64>,
    /// Streaming server (exec, attach, port-forward) address; port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT")]
    stream_address: Option<String>,
    /// Serve Prometheus metrics at HOST:PORT/metrics (overrides metrics.address); port 0 picks
    /// a free port, written to <state-dir>/metrics-endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<String>,
    /// Do not run the embedded node agent (as when a kubelet drives berthd).
    #[arg(long)]
    no_agent: bool,
    /// Directory of static pod manifests for the agent.
    #[arg(long, value_name = "DIR")]
    manifest_dir: Option<PathBuf>,
    /// The agent's read-only status endpoint.
    #[arg(long, value_name = "HOST:PORT")]
    agent_address: Option<String>,
    /// Kubeconfig with a bootstrap token: with no --kubeconfig file yet, the node asks for its
    /// client certificate and writes that kubeconfig.
    #[arg(long, value_name = "FILE")]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// The node server (HTTPS, for the API server: logs, exec, port-forward, stats); empty: off.
    #[arg(long, value_name = "HOST:PORT")]
    agent_server_address: Option<String>,
    /// Plain-HTTP /healthz beside the node server; empty: off.
    #[arg(long, value_name = "HOST:PORT")]
    healthz_address: Option<String>,
    /// The node server's certificate (PEM; default: self-signed for the node).
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// The node server's private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_private_key_file: Option<PathBuf>,
    /// CA of the client certificates the node server accepts.
    #[arg(long, value_name = "FILE")]
    client_ca_file: Option<PathBuf>,
    /// Kubeconfig of the API server the agent joins as a node (off: pods from files only).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The node's name (default: the host name, lower-cased).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Labels of the Node besides the kubelet's own, `k=v,...`.
    #[arg(long, value_name = "K=V,...", value_delimiter = ',')]
    node_labels: Vec<String>,
    /// Taints the Node is registered with, `key=value:Effect,...`.
    #[arg(long, value_name = "TAINT,...", value_delimiter = ',')]
    register_with_taints: Vec<String>,
    /// The node's IP address (default: the source address of the default route).
    #[arg(long, value_name = "IP")]
    node_ip: Option<String>,
    /// Addresses of the cluster's DNS service for ClusterFirst pods, `IP,...`.
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    cluster_dns: Vec<String>,
    /// The cluster's DNS domain.
    #[arg(long, value_name = "DOMAIN")]
    cluster_domain: Option<String>,
    /// Whether the agent creates its Node (false: adopt the one an admin made).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    register_node: Option<bool>,
    /// Unsafe sysctls pods may set besides the safe ones, `name,prefix*,...` (overrides
    /// agent.allowed_unsafe_sysctls).
    #[arg(long, value_name = "SYSCTL,...", value_delimiter = ',')]
    allowed_unsafe_sysctls: Vec<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Print a manual page (roff): berthd(8) or berth.toml(5).
    #[command(hide = true)]
    Man {
        #[arg(value_enum, default_value = "berthd")]
        page: ManPage,
    },
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
    /// Internal: create and pin a pod's namespaces (berthd runs this in a child process).
    #[command(hide = true)]
    PinNamespaces {
        #[arg(long)]
        net: Option<PathBuf>,
        #[arg(long)]
        ipc: Option<PathBuf>,
        #[arg(long)]
        uts: Option<PathBuf>,
        /// Pin a new PID namespace here, with berth-pod-init as its init.
        #[arg(long)]
        pid: Option<PathBuf>,
        /// Pin a new user namespace here (it owns the others); needs --uid-map and --gid-map.
        #[arg(long, requires_all = ["uid_map", "gid_map"])]
        user: Option<PathBuf>,
        /// CONTAINER:HOST:LENGTH uid mapping of the new user namespace.
        #[arg(long)]
        uid_map: Option<String>,
        /// CONTAINER:HOST:LENGTH gid mapping of the new user namespace.
        #[arg(long)]
        gid_map: Option<String>,
        /// cgroup directory the pod init joins (repeatable).
        #[arg(long = "cgroup")]
        cgroups: Vec<PathBuf>,
        #[arg(long)]
        hostname: Option<String>,
        /// NAME=VALUE (repeatable).
        #[arg(long = "sysctl")]
        sysctls: Vec<String>,
    },
    /// Internal: pid 1 of a pod's shared PID namespace (started by pin-namespaces).
    #[command(hide = true)]
    PodInit,
    /// Internal: holds its namespaces until killed (the user namespace probe at start).
    #[command(hide = true)]
    NamespaceHolder,
}

/// The manual pages berthd prints.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ManPage {
    /// berthd(8): the daemon and its flags.
    Berthd,
    /// berth.toml(5): the configuration file.
    BerthToml,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the full default configuration file.
    Default,
    /// Print the effective configuration (file plus flags).
    Show,
    /// Print every option of the configuration file: type, default and meaning.
    Reference,
}

fn effective_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut cfg = match &cli.config {
        Some(path) => Config::load_with_drop_ins(path, true, cli.config_dir.as_deref())?,
        None => Config::load_with_drop_ins(
            std::path::Path::new(DEFAULT_CONFIG_PATH),
            false,
            cli.config_dir.as_deref(),
        )?,
    };
    if let Some(v) = &cli.root {
        cfg.root = v.clone();
    }
    if let Some(v) = &cli.state_dir {
        cfg.state_dir = v.clone();
        if cli.socket.is_none() && cfg.socket == Config::default().socket {
            cfg.socket = v.join("berth.sock");
        }
    }
    if let Some(v) = &cli.socket {
        cfg.socket = v.clone();
    }
    if let Some(v) = &cli.socket_group {
        cfg.socket_group = v.clone();
    }
    if let Some(v) = &cli.log_level {
        cfg.log_level = v.clone();
    }
    for r in &cli.insecure_registries {
        if !cfg.registry.insecure_registries.contains(r) {
            cfg.registry.insecure_registries.push(r.clone());
        }
    }
    if let Some(v) = &cli.registry_config_dir {
        cfg.registry.config_dir = v.clone();
    }
    if let Some(v) = cli.max_concurrent_downloads {
        cfg.registry.max_concurrent_downloads = v;
    }
    if let Some(v) = &cli.cni_conf_dir {
        cfg.cni.conf_dir = v.clone();
    }
    if !cli.cni_bin_dirs.is_empty() {
        cfg.cni.bin_dirs = cli.cni_bin_dirs.clone();
    }
    if let Some(v) = cli.cni_plugin_timeout {
        cfg.cni.plugin_timeout_secs = v;
    }
    if let Some(v) = &cli.metrics_address {
        cfg.metrics.address = v.clone();
    }
    if let Some(v) = &cli.stream_address {
        cfg.stream.address = v.clone();
    }
    if cli.no_agent {
        cfg.agent.enabled = false;
    }
    if let Some(v) = &cli.manifest_dir {
        cfg.agent.manifest_dir = v.clone();
    }
    if let Some(v) = &cli.agent_address {
        cfg.agent.address = v.clone();
    }
    if let Some(v) = &cli.kubeconfig {
        cfg.agent.kubeconfig = Some(v.clone());
    }
    if let Some(v) = &cli.bootstrap_kubeconfig {
        cfg.agent.bootstrap_kubeconfig = Some(v.clone());
    }
    if let Some(v) = &cli.agent_server_address {
        cfg.agent.server_address = v.clone();
    }
    if let Some(v) = &cli.healthz_address {
        cfg.agent.healthz_address = v.clone();
    }
    if let Some(v) = &cli.tls_cert_file {
        cfg.agent.tls_cert_file = Some(v.clone());
    }
    if let Some(v) = &cli.tls_private_key_file {
        cfg.agent.tls_private_key_file = Some(v.clone());
    }
    if let Some(v) = &cli.client_ca_file {
        cfg.agent.client_ca_file = Some(v.clone());
    }
    if let Some(v) = &cli.node_name {
        cfg.agent.node_name = Some(v.clone());
    }
    for kv in &cli.node_labels {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--node-labels: {kv:?} is not key=value"))?;
        cfg.agent.node_labels.insert(k.to_string(), v.to_string());
    }
    if !cli.register_with_taints.is_empty() {
        cfg.agent.register_with_taints = cli.register_with_taints.clone();
    }
    if let Some(v) = &cli.node_ip {
        cfg.agent.node_ip = Some(v.clone());
    }
    if let Some(v) = cli.register_node {
        cfg.agent.register_node = v;
    }
    if !cli.cluster_dns.is_empty() {
        cfg.agent.cluster_dns = cli.cluster_dns.clone();
    }
    if let Some(v) = &cli.cluster_domain {
        cfg.agent.cluster_domain = v.clone();
    }
    if !cli.allowed_unsafe_sysctls.is_empty() {
        cfg.agent.allowed_unsafe_sysctls = cli.allowed_unsafe_sysctls.clone();
    }
    cfg.validate()?;
    Ok(cfg)
}

fn main() {
    let cli = Cli::parse();
    if let Some(Command::Man { page }) = &cli.command {
        let text = match page {
            ManPage::Berthd => {
                let mut out = Vec::new();
                let cmd = <Cli as clap::CommandFactory>::command();
                match clap_mangen::Man::new(cmd).section("8").render(&mut out) {
                    Ok(()) => String::from_utf8_lossy(&out).into_owned(),
                    Err(e) => {
                        eprintln!("berthd: {e}");
                        std::process::exit(1);
                    }
                }
            }
            ManPage::BerthToml => berth::config::reference::man_page(),
        };
        print!("{text}");
        return;
    }
    if let Some(Command::PodInit) = &cli.command {
        berth::runtime::pod_init::run();
    }
    if let Some(Command::NamespaceHolder) = &cli.command {
        berth::runtime::userns::run_namespace_holder();
    }
    if let Some(Command::PinNamespaces {
        net,
        ipc,
        uts,
        pid,
        user,
        uid_map,
        gid_map,
        cgroups,
        hostname,
        sysctls,
    }) = &cli.command
    {
        use berth::runtime::pin::parse_range;
        let user = match (
            user,
            uid_map.as_deref().map(parse_range),
            gid_map.as_deref().map(parse_range),
        ) {
            (None, _, _) => None,
            (Some(path), Some(Some(uids)), Some(Some(gids))) => {
                Some((path.clone(), berth::runtime::userns::PodIds { uids, gids }))
            }
            _ => {
                eprintln!("pin-namespaces: --uid-map and --gid-map take CONTAINER:HOST:LENGTH");
                std::process::exit(2);
            }
        };
        let req = berth::runtime::pin::PinRequest {
            net: net.clone(),
            ipc: ipc.clone(),
            uts: uts.clone(),
            pid: pid.clone(),
            user,
            cgroups: cgroups.clone(),
            hostname: hostname.clone(),
            sysctls: sysctls
                .iter()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (kv.clone(), String::new()),
                })
                .collect(),
        };
        if let Err(e) = berth::runtime::pin::run_pin_child(&req) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::Config { what }) = &cli.command {
        match what {
            ConfigCommand::Default => print!("{}", Config::default_toml()),
            ConfigCommand::Reference => print!("{}", berth::config::reference::reference()),
            ConfigCommand::Show => match effective_config(&cli) {
                Ok(cfg) => print!("{}", toml::to_string_pretty(&cfg).unwrap_or_default()),
                Err(e) => {
                    eprintln!("berthd: {e:#}");
                    std::process::exit(1);
                }
            },
        }
        return;
    }
    if let Err(e) = run(&cli) {
        eprintln!("berthd: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let cfg = effective_config(cli)?;
    berth::util::limit_malloc_arenas();
    berth::logging::init(&cfg.log_level)?;
    berth::util::raise_nofile_limit();
    // reqwest is built without a TLS provider of its own: install ring's once, process-wide.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()?;
    runtime.block_on(berth::daemon::run(cfg))
}
