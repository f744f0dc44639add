//! The embedded node agent: a small kubelet that runs static pods from manifest files through CRI.
//!
//! It talks to the runtime only through the CRI API over a socket (berthd's own by default), so
//! it could drive any CRI runtime, and berthd works the same with it off (`--no-agent`).

pub mod cluster;
pub mod config;
pub mod devices;
pub mod dir_watch;
pub mod eviction;
pub mod gc;
pub mod grpc_socket;
pub mod log_rotation;
pub mod metrics;
pub mod node;
pub mod node_server;
pub mod plugin_registry;
pub mod pod_resources;
pub mod pods;
pub mod probes;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod sources;
pub mod volumes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::client::CriClient;
use config::AgentConfig;
use node::status::NodeIdentity;
use pods::backoff::BackoffPolicy;
use pods::registry::PodRegistry;

/// The Kubernetes release whose kubelet behaviour the agent implements (what its Node reports
/// as `kubeletVersion`, with Berth's version as build metadata).
pub const KUBERNETES_VERSION: &str = "1.33.0";

/// The Node's `kubeletVersion`: `v<Kubernetes>+berth.<Berth>`, e.g. `v1.33.0+berth.0.1.0`.
pub fn kubelet_version() -> String {
    format!("v{KUBERNETES_VERSION}+berth.{}", env!("CARGO_PKG_VERSION"))
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The CRI socket did not answer.
    #[error("agent: connecting to the CRI socket {path}: {error}")]
    Connect { path: PathBuf, error: String },
    /// The status endpoint could not listen.
    #[error("agent: listening on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    /// The control socket could not be bound.
    #[error("agent: control socket: {0}")]
    ControlSocket(#[from] crate::socket_access::SocketAccessError),
}

/// The agent's control socket (node actions) under berthd's state directory.
pub fn control_socket_path(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("agent/agent.sock")
}

/// What every part of the agent shares.
pub struct AgentContext {
    /// CRI client.
    pub client: CriClient,
    /// Root of the pods' log directories.
    pub pod_log_dir: PathBuf,
    /// cgroup root of the pods (by QoS class below it).
    pub cgroup_root: String,
    /// Root of the pods' own directories (`<uid>/volumes/...`).
    pub pods_dir: PathBuf,
    /// This node.
    pub node: NodeIdentity,
    /// Runtime name from CRI Version (the `<name>://` of container IDs).
    pub runtime_name: String,
    /// Restart and pull back-off.
    pub backoff: BackoffPolicy,
    /// Time between two syncs of a pod.
    pub sync_period: Duration,
    /// Time between two reads of the API objects behind a pod's volumes.
    pub volume_refresh: Duration,
    /// Pods and manifest errors, for the status endpoint.
    pub pods: PodRegistry,
    /// The shared relist of sandboxes and containers.
    pub relist: Arc<runtime::relist::Relist>,
    /// Pods to end before their manifest does (eviction, node shutdown).
    pub terminations: pods::terminate::Terminations,
    /// The node's pressure conditions, for admission.
    pub pressure: pods::terminate::Pressure,
    /// The effective agent configuration.
    pub config: Arc<AgentConfig>,
    /// The eviction manager's latest observations and evictions.
    pub eviction: Arc<eviction::Shared>,
    /// Garbage collection counters.
    pub gc: gc::Counters,
    /// The node's swap and the configured swap behaviour (for container configs).
    pub swap: runtime::resources::NodeSwap,
    /// The API server the node belongs to (None: pods from files only).
    pub cluster: Option<Arc<cluster::Cluster>>,
    /// Where events go (None without an API server).
    pub events: Option<cluster::events::Recorder>,
    /// The node's device plugins and the devices pods hold.
    pub devices: Arc<devices::DeviceManager>,
}

/// Starts the agent against the CRI socket `socket`: the manifest source with its pod workers,
/// the node status loop and the status endpoint, and with `cluster` the node's part in it.
/// Returns once the endpoint listens.
pub async fn start(
    cfg: &AgentConfig,
    socket: &std::path::Path,
    state_dir: &std::path::Path,
    root: &std::path::Path,
    cluster: Option<Arc<cluster::Cluster>>,
) -> Result<(), AgentError> {
    // A stale address from the previous run must not be read as this run's.
    let _ = std::fs::remove_file(state_dir.join("agent/endpoint"));
    let client = CriClient::connect(socket)
        .await
        .map_err(|e| AgentError::Connect {
            path: socket.to_path_buf(),
            error: format!("{e:#}"),
        })?;
    let runtime_name = match client
        .runtime()
        .version(k8s_cri::v1::VersionRequest {
            version: String::new(),
        })
        .await
    {
        Ok(v) => v.into_inner().runtime_name,
        Err(e) => {
            tracing::warn!(error = %e.message(), "agent: CRI Version failed");
            "cri".into()
        }
    };
    let node = NodeIdentity::detect(cfg.node_name.as_deref(), cfg.node_ip.as_deref());
    let ctx = Arc::new(AgentContext {
        client,
        pod_log_dir: cfg.pod_log_dir.clone(),
        pods_dir: root.join("agent/pods"),
        cgroup_root: cfg.cgroup_root.clone(),
        node,
        runtime_name,
        backoff: BackoffPolicy {
            base: Duration::from_secs_f64(cfg.backoff_base_secs),
            max: Duration::from_secs_f64(cfg.backoff_max_secs),
            reset_after: Duration::from_secs_f64(cfg.backoff_reset_secs),
        },
        sync_period: Duration::from_millis(cfg.sync_period_ms),
        volume_refresh: Duration::from_secs_f64(cfg.volume_refresh_secs),
        pods: PodRegistry::default(),
        relist: Default::default(),
        terminations: Default::default(),
        pressure: Default::default(),
        config: Arc::new(cfg.clone()),
        eviction: Default::default(),
        gc: Default::default(),
        swap: runtime::resources::detect_node_swap(runtime::resources::SwapBehavior::from_name(
            &cfg.memory_swap_behavior,
        )),
        cluster: cluster.clone(),
        events: cluster.clone().map(cluster::events::Recorder::start),
        devices: Arc::new(devices::DeviceManager::new(
            &cfg.device_plugin_dir,
            &root.join("agent/device-allocations.json"),
        )),
    });
    let registry_watched = !cfg.plugin_registry_dir.as_os_str().is_empty();
    if !cfg.device_plugin_dir.as_os_str().is_empty() {
        tokio::spawn(devices::registration::serve(
            ctx.devices.clone(),
            registry_watched,
        ));
    }
    if !cfg.pod_resources_dir.as_os_str().is_empty() {
        tokio::spawn(pod_resources::serve(
            cfg.pod_resources_dir.clone(),
            ctx.clone(),
        ));
    }
    if registry_watched {
        tokio::spawn(plugin_registry::run(
            cfg.plugin_registry_dir.clone(),
            ctx.devices.clone(),
        ));
    }
    tokio::spawn(ctx.relist.clone().run(
        ctx.client.clone(),
        Duration::from_millis(cfg.sync_period_ms),
    ));
    let node_status = node::status::NodeStatus::new(ctx.clone(), cfg, state_dir, root);
    // The read-only TCP endpoint only when an address is configured (off by default).
    let listener = if cfg.address.is_empty() {
        None
    } else {
        Some(
            tokio::net::TcpListener::bind(&cfg.address)
                .await
                .map_err(|error| AgentError::Listen {
                    address: cfg.address.clone(),
                    error,
                })?,
        )
    };
    let local = listener.as_ref().and_then(|l| l.local_addr().ok());
    // The Node's daemonEndpoints name the node server, or the read-only endpoint without one.
    let server_port = match node_server::start(ctx.clone(), cfg, root).await {
        Ok(port) => port,
        Err(e) => {
            tracing::error!(error = %e, "node server not started");
            None
        }
    };
    node_status.set_port(server_port.or(local.map(|a| a.port())).unwrap_or_default());
    // Where the endpoint really listens (with port 0 in the address, the kernel chose it).
    if let Some(addr) = local {
        let file = state_dir.join("agent/endpoint");
        // Written aside and renamed over it: a reader polling the file never sees it half-written.
        let tmp = state_dir.join("agent/.endpoint.tmp");
        let written = std::fs::create_dir_all(state_dir.join("agent"))
            .and_then(|()| std::fs::write(&tmp, format!("{addr}\n")))
            .and_then(|()| std::fs::rename(&tmp, &file));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(file = %file.display(), error = %e, "agent: writing the endpoint address");
        }
    }
    tracing::info!(address = %local.map(|a| a.to_string()).unwrap_or_else(|| "off".into()), manifests = %cfg.manifest_dir.display(), node = %ctx.node.name, "node agent started");
    let shutdown_manager = shutdown::ShutdownManager::new(ctx.clone());
    // The control socket admits whom the CRI socket admits.
    let control_socket = control_socket_path(state_dir);
    let _ = std::fs::remove_file(&control_socket);
    let control =
        crate::socket_access::bind(&control_socket, crate::socket_access::group_of(socket))?;
    let endpoint = Arc::new(server::Endpoint {
        ctx: ctx.clone(),
        node: node_status.clone(),
        shutdown: shutdown_manager.clone(),
        metrics: metrics::registry(ctx.clone()),
        control_socket,
    });
    if let Some(listener) = listener {
        tokio::spawn(server::serve(listener, endpoint.clone()));
    }
    tokio::spawn(server::serve_control(control, endpoint));
    let shutdown_groups = shutdown::groups(cfg);
    if !shutdown_groups.is_empty() {
        let grace = Duration::from_secs(
            shutdown_groups
                .iter()
                .map(|g| g.grace_secs.max(0) as u64)
                .sum(),
        );
        shutdown::logind::spawn(
            shutdown_manager,
            grace,
            cfg.logind_config_dir.clone(),
            tokio::runtime::Handle::current(),
        );
    }
    match &cluster {
        Some(cluster) => {
            let (cluster, status) = (cluster.clone(), node_status.clone());
            let lease = Duration::from_secs_f64(cfg.node_lease_duration_secs);
            let create = cfg.register_node;
            let cert_dir = cfg.cert_dir_in(root);
            if let Some(kubeconfig) = cfg.kubeconfig.clone()
                && cluster::bootstrap::uses_rotated_credentials(&kubeconfig, &cert_dir)
            {
                tokio::spawn(cluster::bootstrap::rotate(
                    cluster.clone(),
                    kubeconfig,
                    cert_dir,
                    cfg.bootstrap_kubeconfig.clone(),
                ));
            }
            tokio::spawn(async move {
                node::register::register(cluster.clone(), status.clone(), create).await;
                status.attach(cluster.clone());
                tokio::spawn(node::watch::run(cluster.clone(), status.clone()));
                node::lease::run(cluster, lease, status.heartbeat_counter()).await;
            });
        }
        None => {
            tokio::spawn(node_status.clone().heartbeat());
        }
    }
    tokio::spawn(node_status.clone().run());
    tokio::spawn(eviction::run(ctx.clone()));
    tokio::spawn(gc::run(ctx.clone()));
    tokio::spawn(log_rotation::run(ctx.clone()));
    let pods = pods::manager::PodManager::new(ctx.clone(), cluster.clone(), node_status.clone());
    if let Some(cluster) = &cluster {
        tokio::spawn(sources::api::run(cluster.clone(), pods.clone()));
        tokio::spawn(pods::mirror::run(cluster.clone(), pods.clone()));
        tokio::spawn(pods::status_manager::run(
            cluster.clone(),
            ctx.clone(),
            pods.clone(),
        ));
    }
    tokio::spawn(sources::files::run(
        ctx,
        pods,
        cfg.manifest_dir.clone(),
        Duration::from_millis(cfg.manifest_rescan_ms),
    ));
    Ok(())
}

/// With a bootstrap kubeconfig and no kubeconfig yet: the TLS bootstrap, then the cluster it
/// joined (None when there is nothing to bootstrap).
async fn join_by_bootstrap(
    cfg: &AgentConfig,
    root: &std::path::Path,
) -> Result<Option<Arc<cluster::Cluster>>, Box<dyn std::error::Error + Send + Sync>> {
    let (Some(kubeconfig), Some(bootstrap)) = (&cfg.kubeconfig, &cfg.bootstrap_kubeconfig) else {
        return Ok(None);
    };
    if kubeconfig.exists() {
        return Ok(None);
    }
    let name = node::status::node_name(cfg.node_name.as_deref());
    cluster::bootstrap::bootstrap(bootstrap, kubeconfig, &cfg.cert_dir_in(root), &name).await?;
    Ok(Some(Arc::new(
        cluster::Cluster::connect(kubeconfig, &name).await?,
    )))
}

/// Starts the agent in the background once the CRI socket at `socket` accepts connections
/// (berthd calls this just before it starts serving), joining `cluster` when given. A failure is
/// logged; CRI keeps serving.
pub fn spawn_when_ready(
    cfg: AgentConfig,
    socket: PathBuf,
    state_dir: PathBuf,
    root: PathBuf,
    cluster: Option<Arc<cluster::Cluster>>,
) {
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::net::UnixStream::connect(&socket).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                tracing::error!(socket = %socket.display(), "agent: the CRI socket never answered; agent not started");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cluster = match cluster {
            Some(c) => Some(c),
            None => match join_by_bootstrap(&cfg, &root).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "node agent not started");
                    return;
                }
            },
        };
        if let Err(e) = start(&cfg, &socket, &state_dir, &root, cluster).await {
            tracing::error!(error = %e, "node agent not started");
        }
    });
}
