//! The pod network API the runtime uses: attach (ADD) a sandbox's netns, detach it (DEL, from
//! the cache), CHECK it, and report NetworkReady.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1 as cri;
use serde_json::Value;

use super::cache::{Cache, CacheError, Entry};
use super::capabilities;
use super::config::{self, ConfError, Lookup, NetworkConfig};
use super::invoke::{Invocation, Invoker, Op, PluginError, plugin_stdin};
use super::result;

/// Where the manager finds its configuration and plugins.
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// CNI conf dir (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Plugin dirs, searched in order.
    pub bin_dirs: Vec<PathBuf>,
    /// Deadline of one plugin call.
    pub plugin_timeout: Duration,
    /// Directory of the per-sandbox attachment records.
    pub cache_dir: PathBuf,
}

/// Why a pod network operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A plugin failed, hung or answered garbage.
    #[error("pod network {network:?} ({file}): {error}")]
    Plugin {
        network: String,
        file: String,
        error: PluginError,
    },
    /// The pod asks for something invalid (a bad bandwidth annotation).
    #[error("pod network: {0}")]
    InvalidArgument(String),
    /// The attachment record could not be kept.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The cached config no longer parses.
    #[error("pod network: cached config: {0}")]
    Config(#[from] ConfError),
}

/// NetworkReady, as Status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkStatus {
    pub ready: bool,
    /// Machine-readable reason when not ready.
    pub reason: String,
    /// What is missing, for people.
    pub message: String,
}

/// Time spent in one ADD: in total and inside plugin processes (the rest is Berth's).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddTiming {
    pub total: Duration,
    pub plugins: Duration,
}

/// The outcome of attaching a pod.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The pod's IPs (IPv4 first).
    pub ips: Vec<IpAddr>,
    pub timing: AddTiming,
}

/// Conf dir contents as last seen: names, sizes and mtimes.
type Signature = Vec<(PathBuf, u64, Option<SystemTime>)>;

struct Loaded {
    signature: Option<Signature>,
    lookup: Result<Arc<NetworkConfig>, String>,
}

/// CNI networking for pods.
pub struct NetManager {
    opts: NetOptions,
    invoker: Invoker,
    cache: Cache,
    loaded: Mutex<Loaded>,
    pod_cidr: RwLock<String>,
}

/// The interface name inside every pod.
pub const IFNAME: &str = "eth0";

fn signature(dir: &Path) -> Signature {
    config::candidates(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let meta = std::fs::metadata(&p).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            let mtime = meta.and_then(|m| m.modified().ok());
            (p, len, mtime)
        })
        .collect()
}

impl NetManager {
    /// A manager; the conf dir is read now and whenever it changes.
    pub fn new(opts: NetOptions) -> Arc<Self> {
        let invoker = Invoker {
            bin_dirs: opts.bin_dirs.clone(),
            timeout: opts.plugin_timeout,
        };
        let cache = Cache::new(&opts.cache_dir);
        let manager = Arc::new(Self {
            opts,
            invoker,
            cache,
            loaded: Mutex::new(Loaded {
                signature: None,
                lookup: Err("not loaded yet".into()),
            }),
            pod_cidr: RwLock::new(String::new()),
        });
        let _ = manager.current();
        manager
    }

    /// The options it runs with.
    pub fn options(&self) -> &NetOptions {
        &self.opts
    }

    /// The network config in force, re-read when the conf dir changed.
    pub fn current(&self) -> Result<Arc<NetworkConfig>, String> {
        let sig = signature(&self.opts.conf_dir);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.signature.as_ref() != Some(&sig) {
            loaded.lookup = match config::find(&self.opts.conf_dir) {
                Lookup::Found { config, skipped } => {
                    for s in &skipped {
                        tracing::warn!(error = %s, "skipping invalid CNI config");
                    }
                    tracing::info!(network = %config.name, file = %config.source.display(), version = %config.cni_version, plugins = config.plugins.len(), "CNI config loaded");
                    Ok(Arc::new(config))
                }
                Lookup::Missing(why) => {
                    tracing::info!(reason = %why, "no CNI config");
                    Err(why)
                }
            };
            loaded.signature = Some(sig);
        }
        loaded.lookup.clone()
    }

    /// NetworkReady: a valid config whose plugins are all installed.
    pub fn status(&self) -> NetworkStatus {
        match self.current() {
            Err(why) => NetworkStatus {
                ready: false,
                reason: "NoNetworkConfig".into(),
                message: format!("CNI network not ready: {why}"),
            },
            Ok(conf) => {
                for i in 0..conf.plugins.len() {
                    if let Err(e) = self.invoker.find(conf.plugin_type(i)) {
                        return NetworkStatus {
                            ready: false,
                            reason: "NetworkPluginMissing".into(),
                            message: format!(
                                "CNI network {:?} ({}): {e}",
                                conf.name,
                                conf.source.display()
                            ),
                        };
                    }
                }
                NetworkStatus {
                    ready: true,
                    reason: String::new(),
                    message: String::new(),
                }
            }
        }
    }

    /// Keeps the node's pod CIDR (UpdateRuntimeConfig), offered as the `ipRanges` capability.
    pub fn set_pod_cidr(&self, cidr: &str) {
        let mut c = self.pod_cidr.write().unwrap_or_else(|p| p.into_inner());
        if *c != cidr {
            tracing::info!(pod_cidr = %cidr, "pod CIDR updated");
            *c = cidr.to_string();
        }
    }

    /// The pod CIDR last set.
    pub fn pod_cidr(&self) -> String {
        self.pod_cidr
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// ADD: attaches the pod's netns to the network. None when no network config exists (the
    /// pod then has loopback only; NetworkReady says why). On failure, DEL is sent to the
    /// plugins that ran, so nothing stays allocated.
    pub async fn setup(
        &self,
        sandbox_id: &str,
        netns: &Path,
        pod: &cri::PodSandboxConfig,
    ) -> Result<Option<Attached>, NetError> {
        let started = Instant::now();
        let conf = match self.current() {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!(sandbox = %sandbox_id, reason = %why, "no CNI network: the pod gets loopback only");
                return Ok(None);
            }
        };
        let runtime_config = capabilities::runtime_config(pod, &self.pod_cidr())
            .map_err(NetError::InvalidArgument)?;
        let mut entry = Entry {
            sandbox_id: sandbox_id.to_string(),
            config: conf.to_json(),
            source: conf.source.clone(),
            ifname: IFNAME.to_string(),
            netns: netns.to_owned(),
            args: capabilities::cni_args(pod, sandbox_id),
            runtime_config,
            result: None,
        };
        // Recorded before ADD: a berthd crash half-way still leaves what DEL needs.
        self.cache.save(&entry, false)?;
        let netns_str = netns.to_string_lossy();
        let inv = Invocation {
            op: Op::Add,
            container_id: sandbox_id,
            netns: &netns_str,
            ifname: IFNAME,
            args: &entry.args,
        };
        let mut plugin_time = Duration::ZERO;
        let mut prev: Option<Value> = None;
        for i in 0..conf.plugins.len() {
            let stdin = plugin_stdin(&conf, i, prev.as_ref(), &entry.runtime_config);
            match self.invoker.exec(conf.plugin_type(i), &stdin, &inv).await {
                Ok(out) => {
                    plugin_time += out.elapsed;
                    prev = out.result;
                }
                Err(error) => {
                    tracing::warn!(sandbox = %sandbox_id, error = %error, "CNI ADD failed: sending DEL for what was added");
                    match self.del(&conf, &entry, i + 1, prev.as_ref()).await {
                        Ok(()) => {
                            let _ = self.cache.remove(sandbox_id);
                        }
                        Err(e) => {
                            tracing::warn!(sandbox = %sandbox_id, error = %e, "DEL after a failed ADD failed (kept for a retry at the next start)");
                        }
                    }
                    return Err(NetError::Plugin {
                        network: conf.name.clone(),
                        file: conf.source.display().to_string(),
                        error,
                    });
                }
            }
        }
        let result = prev.unwrap_or_else(|| Value::Object(Default::default()));
        let ips = result::pod_ips(&result, IFNAME);
        entry.result = Some(result);
        if let Err(e) = self.cache.save(&entry, true) {
            let _ = self
                .del(&conf, &entry, conf.plugins.len(), entry.result.as_ref())
                .await;
            let _ = self.cache.remove(sandbox_id);
            return Err(e.into());
        }
        let timing = AddTiming {
            total: started.elapsed(),
            plugins: plugin_time,
        };
        tracing::info!(
            sandbox = %sandbox_id,
            network = %conf.name,
            ips = ?ips,
            total_us = timing.total.as_micros() as u64,
            plugins_us = timing.plugins.as_micros() as u64,
            berth_overhead_us = timing.total.saturating_sub(timing.plugins).as_micros() as u64,
            "pod network attached"
        );
        Ok(Some(Attached { ips, timing }))
    }

    /// DEL to the first `count` plugins of `conf`, last first.
    async fn del(
        &self,
        conf: &NetworkConfig,
        entry: &Entry,
        count: usize,
        prev: Option<&Value>,
    ) -> Result<(), NetError> {
        // A DEL whose netns is gone gets an empty CNI_NETNS (the spec allows it; the veth went
        // with the namespace).
        let netns = if entry.netns.exists() {
            entry.netns.to_string_lossy().into_owned()
        } else {
            String::new()
        };
        let inv = Invocation {
            op: Op::Del,
            container_id: &entry.sandbox_id,
            netns: &netns,
            ifname: &entry.ifname,
            args: &entry.args,
        };
        // prevResult on DEL exists from 0.4.0 on.
        let prev = prev.filter(|_| config::version_at_least(&conf.cni_version, (0, 4, 0)));
        for i in (0..count.min(conf.plugins.len())).rev() {
            let stdin = plugin_stdin(conf, i, prev, &entry.runtime_config);
            self.invoker
                .exec(conf.plugin_type(i), &stdin, &inv)
                .await
                .map_err(|error| NetError::Plugin {
                    network: conf.name.clone(),
                    file: conf.source.display().to_string(),
                    error,
                })?;
        }
        Ok(())
    }

    /// DEL for sandbox `id` with the config and result recorded at ADD. Nothing recorded (never
    /// attached, or already detached) is success, so a second StopPodSandbox is fine.
    pub async fn teardown(&self, sandbox_id: &str) -> Result<(), NetError> {
        let Some(entry) = self.cache.load(sandbox_id)? else {
            return Ok(());
        };
        let conf = NetworkConfig::from_json(&entry.config, &entry.source)?;
        let started = Instant::now();
        self.del(&conf, &entry, conf.plugins.len(), entry.result.as_ref())
            .await?;
        self.cache.remove(sandbox_id)?;
        tracing::info!(sandbox = %sandbox_id, network = %conf.name, elapsed_us = started.elapsed().as_micros() as u64, "pod network detached");
        Ok(())
    }

    /// CHECK for sandbox `id` (CNI 0.4.0 and later). Ok(false): nothing to check (not
    /// attached, or the version has no CHECK / the config disables it).
    pub async fn check(&self, sandbox_id: &str) -> Result<bool, NetError> {
        let Some(entry) = self.cache.load(sandbox_id)? else {
            return Ok(false);
        };
        let conf = NetworkConfig::from_json(&entry.config, &entry.source)?;
        let Some(result) = entry.result.as_ref().filter(|_| conf.supports_check()) else {
            return Ok(false);
        };
        let netns = entry.netns.to_string_lossy();
        let inv = Invocation {
            op: Op::Check,
            container_id: &entry.sandbox_id,
            netns: &netns,
            ifname: &entry.ifname,
            args: &entry.args,
        };
        for i in 0..conf.plugins.len() {
            let stdin = plugin_stdin(&conf, i, Some(result), &entry.runtime_config);
            self.invoker
                .exec(conf.plugin_type(i), &stdin, &inv)
                .await
                .map_err(|error| NetError::Plugin {
                    network: conf.name.clone(),
                    file: conf.source.display().to_string(),
                    error,
                })?;
        }
        Ok(true)
    }

    /// Recorded attachments whose sandbox is not in `live` (a crash during RunPodSandbox or
    /// RemovePodSandbox). Take this before serving requests, so no new sandbox is among them.
    pub fn orphans(&self, live: &HashSet<String>) -> Vec<String> {
        self.cache
            .ids()
            .into_iter()
            .filter(|id| !live.contains(id))
            .collect()
    }

    /// Sends DEL for each of `ids` (see [`Self::orphans`]); returns how many were released.
    pub async fn release(&self, ids: Vec<String>) -> usize {
        let mut released = 0;
        for id in ids {
            match self.teardown(&id).await {
                Ok(()) => {
                    released += 1;
                    tracing::info!(sandbox = %id, "released the network of a sandbox that no longer exists");
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "releasing an orphaned pod network");
                }
            }
        }
        released
    }
}
