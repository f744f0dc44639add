//! berthd's main job: open the stores, serve CRI, shut down cleanly on SIGTERM/SIGINT.

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::cri::{self, ImageApi, RuntimeApi};
use crate::image::ImageManager;
use crate::net::{NetManager, NetOptions};
use crate::runtime::container::ContainerManager;
use crate::runtime::container_create::ContainerCreator;
use crate::runtime::sandbox::SandboxManager;
use crate::store::Store;

/// Runs the daemon until a termination signal arrives.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let config = Arc::new(config);
    if config.agent.enabled && config.agent.fail_swap_on {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if let Some(active) = crate::agent::node::swap::active_swap(&swaps) {
            anyhow::bail!(
                "swap is on ({active}) and agent.fail_swap_on is true: turn swap off (swapoff -a), \
                 set agent.fail_swap_on = false, or run with --no-agent"
            );
        }
    }
    // A node that cannot authenticate is refused at once, not found out later in a log.
    // A node still to be bootstrapped joins once its certificate is issued (the agent waits).
    let cluster = match &config.agent.kubeconfig {
        Some(kubeconfig) if config.agent.bootstrap_kubeconfig.is_some() && !kubeconfig.exists() => {
            None
        }
        Some(kubeconfig) if config.agent.enabled => {
            let name = crate::agent::node::status::node_name(config.agent.node_name.as_deref());
            Some(Arc::new(
                crate::agent::cluster::Cluster::connect(kubeconfig, &name).await?,
            ))
        }
        _ => None,
    };
    let layout = crate::runtime::cgroups::Layout::detect().context("reading cgroup mounts")?;
    let driver =
        crate::runtime::cgroup_driver::CgroupDriver::resolve(config.runtime.cgroup_driver, &layout)
            .map_err(anyhow::Error::msg)?;
    crate::runtime::cgroup_driver::set(driver);
    tracing::info!(driver = driver.name(), "cgroup driver");
    let lock = cri::server::lock_root(&config.root)?;
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("creating state dir {}", config.state_dir.display()))?;
    let store = Store::open(&config.db_path())?;
    let images = ImageManager::open(&config, store.clone()).context("opening image store")?;
    crate::runtime::dir_modes::secure_layout(&config.root, &config.state_dir)
        .context("setting the modes of Berth's directories")?;
    crate::image::import_dir::spawn(images.clone(), config.import_dir(), config.import_state());
    // Pods with their own user namespace need idmapped mounts of both directories.
    let (root, state) = (config.root.clone(), config.state_dir.clone());
    tokio::task::spawn_blocking(move || {
        crate::runtime::userns::detect_support(&[root.as_path(), state.as_path()])
    })
    .await
    .context("checking for idmapped mounts")?;
    tokio::task::spawn_blocking(crate::runtime::apparmor::setup)
        .await
        .context("setting up AppArmor")?;
    let net = NetManager::new(NetOptions {
        conf_dir: config.cni.conf_dir.clone(),
        bin_dirs: config.cni.bin_dirs.clone(),
        plugin_timeout: std::time::Duration::from_secs_f64(config.cni.plugin_timeout_secs),
        cache_dir: config.cni_cache_dir(),
    });
    crate::net::watch::spawn(&net);
    let sandboxes = SandboxManager::open(store.clone(), &config.state_dir, Some(net.clone()))
        .context("loading pod sandboxes")?;
    // Networks of sandboxes that a crash left half made or half removed: DEL in the background.
    let live: std::collections::HashSet<String> = sandboxes
        .list()
        .map_err(|e| anyhow::anyhow!("listing pod sandboxes: {e}"))?
        .into_iter()
        .map(|r| r.id.clone())
        .collect();
    let orphans = net.orphans(&live);
    if !orphans.is_empty() {
        let net = net.clone();
        tokio::spawn(async move {
            net.release(orphans).await;
        });
    }
    let creator = Arc::new(ContainerCreator::new(
        images.clone(),
        sandboxes.clone(),
        &config.root,
        config.runtime.cdi_spec_dirs.clone(),
    ));
    {
        let creator = creator.clone();
        tokio::task::spawn_blocking(move || creator.remove_leftovers());
    }
    let shim = std::env::current_exe()
        .context("finding berthd's own path")?
        .with_file_name("berth-shim");
    let containers = ContainerManager::open(
        store.clone(),
        images.clone(),
        creator,
        sandboxes.clone(),
        Arc::new(crate::runtime::events::EventBus::new()),
        &config.state_dir,
        shim,
    )
    .await
    .map_err(|e| anyhow::anyhow!("loading containers: {e}"))?;
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot watch SIGTERM");
                    std::future::pending::<()>().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        crate::sd_notify::notify("STOPPING=1");
    };
    let stream =
        crate::stream::StreamServer::start(&config.stream, containers.clone(), sandboxes.clone())
            .await?;
    if config.agent.enabled {
        crate::agent::spawn_when_ready(
            config.agent.clone(),
            config.socket.clone(),
            config.state_dir.clone(),
            config.root.clone(),
            cluster,
        );
    }
    if !config.metrics.address.is_empty() {
        let state = crate::metrics::state_collector::StateCollector::new(
            containers.clone(),
            sandboxes.clone(),
            images.clone(),
        );
        let registry = crate::metrics::prometheus::runtime_registry(vec![Box::new(state)]);
        let bound = crate::metrics::endpoint::serve(&config.metrics.address, registry).await?;
        std::fs::write(config.state_dir.join("metrics-endpoint"), bound.to_string())
            .context("writing the metrics endpoint's address")?;
    }
    cri::serve(
        lock,
        &config.socket,
        crate::socket_access::resolve_group(&config.socket_group)?,
        RuntimeApi::new(images.clone(), sandboxes.clone(), containers).with_stream_server(stream),
        ImageApi::new(images),
        shutdown,
    )
    .await?;
    tracing::info!("stopped");
    Ok(())
}
