//! Pod sandboxes: their records, namespaces, files, cgroup and life cycle.
//!
//! Restart invariants (see [`SandboxManager::open`]): a record in state `Creating` belongs to a
//! RunPodSandbox that did not finish; everything it may have made (pinned namespaces, shm
//! mount, files, cgroups) is removed with the record. A `Ready` sandbox whose pinned network
//! namespace vanished (a reboot emptied the state dir) is reported `NotReady`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_cri::v1 as cri;
use prost::Message;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, debug_span};

use super::cgroup_driver;
use super::cgroups::{self, Layout};
use super::decoded::{Decoded, Encoded};
use super::names::{self, NameRegistry, Reservation};
use super::pin::{self, PinRequest};
use super::process::HostProcess;
use super::sandbox_files;
use super::sandbox_gate::{SandboxExclusive, SandboxGates, SandboxMember};
use super::systemd_units;
use super::userns::{self, PodIds};
use crate::net::{NetError, NetManager};
use crate::store::{RecordTable, SANDBOXES, Store};

/// Why a sandbox operation failed; each maps to one gRPC code in `cri/`.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Bad request.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such sandbox.
    #[error("pod sandbox {0} not found")]
    NotFound(String),
    /// The host lacks what the request needs.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The name is held by a different sandbox.
    #[error("pod sandbox name {name} is already in use by sandbox {id}")]
    NameInUse { name: String, id: String },
    /// Host trouble.
    #[error("{0}")]
    Internal(String),
}

fn internal(context: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> SandboxError {
    move |e| SandboxError::Internal(format!("{context}: {e}"))
}

/// The leaf cgroup a shared-PID pod's init lives in, below the pod cgroup: cgroup v2 allows no
/// process in a cgroup whose children (the containers) hold controllers.
fn pod_init_cgroup(pod_cgroup: &str) -> String {
    format!("{}/berth-pod-init", pod_cgroup.trim_end_matches('/'))
}

/// Life-cycle state of a sandbox.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum SandboxState {
    /// RunPodSandbox is in progress (or crashed half-way).
    Creating,
    /// Namespaces up.
    Ready,
    /// Stopped (network torn down); files kept until removal.
    NotReady,
}

/// A sandbox as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// `name_namespace_uid_attempt`, the reserved name.
    pub name: String,
    pub state: SandboxState,
    pub created_at: i64,
    pub runtime_handler: String,
    /// The PodSandboxConfig, protobuf-encoded, as hex.
    pub config_hex: String,
    /// Fingerprint of the RunPodSandbox request (for retries), as hex.
    pub fingerprint_hex: String,
    /// Directory of the pod's files.
    pub dir: PathBuf,
    pub net_ns: Option<PathBuf>,
    pub ipc_ns: Option<PathBuf>,
    pub uts_ns: Option<PathBuf>,
    /// The pod's shared PID namespace (PID mode POD), pinned while its init lives.
    #[serde(default)]
    pub pid_ns: Option<PathBuf>,
    /// The init of `pid_ns`.
    #[serde(default)]
    pub pod_init: Option<HostProcess>,
    /// The pod's own user namespace (user namespace mode POD), pinned, and its id mappings.
    #[serde(default)]
    pub user_ns: Option<PathBuf>,
    #[serde(default)]
    pub user_ids: Option<PodIds>,
    /// The pod's /dev/shm (a tmpfs) unless it shares the host's IPC.
    pub shm: Option<PathBuf>,
    pub cgroup_parent: String,
    /// cgroup directories Berth created for the pod (removed with it).
    pub created_cgroups: Vec<PathBuf>,
    /// The pod's IPs from CNI (IPv4 first); empty with loopback only or the host's network.
    #[serde(default)]
    pub pod_ips: Vec<String>,
    /// `config_hex` decoded, once.
    #[serde(skip)]
    pub decoded: Decoded<cri::PodSandboxConfig>,
    /// The record's ListPodSandbox item, encoded once.
    #[serde(skip)]
    pub list_item: Encoded,
}

impl SandboxRecord {
    /// The decoded config.
    pub fn config(&self) -> cri::PodSandboxConfig {
        self.config_ref().clone()
    }

    /// The decoded config (decoded once per record in memory).
    pub fn config_ref(&self) -> &cri::PodSandboxConfig {
        self.decoded.get(&self.config_hex)
    }

    fn pins(&self, net: bool, rest: bool) -> PinRequest {
        PinRequest {
            net: if net { self.net_ns.clone() } else { None },
            ipc: if rest { self.ipc_ns.clone() } else { None },
            uts: if rest { self.uts_ns.clone() } else { None },
            pid: if net { self.pid_ns.clone() } else { None },
            user: if rest {
                self.user_ns.clone().zip(self.user_ids)
            } else {
                None
            },
            ..Default::default()
        }
    }

    /// Path of the pod's hostname, hosts and resolv.conf files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Runs and tracks sandboxes.
pub struct SandboxManager {
    table: RecordTable<SandboxRecord>,
    state_dir: PathBuf,
    exe: PathBuf,
    layout: Layout,
    names: NameRegistry,
    /// Pod networking (None: pods get loopback only).
    net: Option<Arc<NetManager>>,
    /// Serialises state changes (cheap operations).
    lock: tokio::sync::Mutex<()>,
    /// The last CNI CHECK of each pod network, and whether one runs now.
    checks: std::sync::Mutex<HashMap<String, NetworkCheck>>,
    /// Container creations against stops and removals, per sandbox.
    gates: SandboxGates,
}

/// How long a CNI CHECK result is shown before a verbose status starts another.
const CHECK_FRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// The last CNI CHECK of a pod's network.
#[derive(Debug, Clone, Default)]
struct NetworkCheck {
    /// "ok", the plugin's error, or None before the first one finished (or when the plugins
    /// have no CHECK).
    result: Option<String>,
    at: Option<std::time::Instant>,
    running: bool,
}

fn namespace_mode(config: &cri::PodSandboxConfig) -> cri::NamespaceOption {
    config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .unwrap_or_default()
}

impl SandboxManager {
    /// Loads sandboxes and repairs what a crash left (see the module doc). Networks of sandboxes
    /// rolled back here are released by [`NetManager::release`] on the ids the net cache still
    /// holds (the daemon does it in the background).
    pub fn open(
        store: Store,
        state_dir: &Path,
        net: Option<Arc<NetManager>>,
    ) -> Result<Arc<Self>, SandboxError> {
        let exe = std::env::current_exe().map_err(internal("finding berthd's own path"))?;
        let layout = Layout::detect().map_err(internal("reading cgroup mounts"))?;
        let table = RecordTable::load(store, SANDBOXES, |r: &SandboxRecord| r.id.as_str())
            .map_err(|e| SandboxError::Internal(e.to_string()))?;
        let manager = Arc::new(Self {
            table,
            state_dir: state_dir.to_owned(),
            exe,
            layout,
            names: NameRegistry::new(),
            net,
            lock: tokio::sync::Mutex::new(()),
            checks: Default::default(),
            gates: SandboxGates::default(),
        });
        for rec in manager.records()? {
            let mut rec = SandboxRecord::clone(&rec);
            match rec.state {
                SandboxState::Creating => {
                    tracing::info!(sandbox = %rec.id, "rolling back a sandbox that was half created");
                    manager.teardown(&rec);
                    manager.delete(&rec.id)?;
                    continue;
                }
                SandboxState::Ready if rec.net_ns.as_ref().is_some_and(|p| !p.exists()) => {
                    tracing::warn!(sandbox = %rec.id, "network namespace is gone: marking NotReady");
                    rec.state = SandboxState::NotReady;
                    manager.save(&rec)?;
                }
                SandboxState::Ready if rec.pod_init.is_some_and(|i| !i.is_running()) => {
                    tracing::warn!(sandbox = %rec.id, "the pod init died: marking NotReady");
                    pin::unpin(&rec.pins(true, false));
                    rec.state = SandboxState::NotReady;
                    manager.save(&rec)?;
                }
                _ => {}
            }
            manager.names.restore(
                &rec.name,
                &rec.id,
                names::fingerprint_from_hex(&rec.fingerprint_hex),
            );
        }
        let known = manager.records()?.iter().map(|r| r.id.clone()).collect();
        let swept = super::unrecorded::sweep_dirs(
            &manager.state_dir.join("sandboxes"),
            &known,
            &[],
            "pod sandbox directory",
        );
        if swept != Default::default() {
            tracing::info!(
                dirs = swept.dirs,
                mounts = swept.mounts,
                "removed what no sandbox record names"
            );
        }
        Ok(manager)
    }

    fn records(&self) -> Result<Vec<Arc<SandboxRecord>>, SandboxError> {
        Ok(self.table.all())
    }

    fn save(&self, rec: &SandboxRecord) -> Result<(), SandboxError> {
        self.table
            .put(&rec.id, rec.clone())
            .map(drop)
            .map_err(|e| SandboxError::Internal(format!("saving sandbox {}: {e}", rec.id)))
    }

    fn delete(&self, id: &str) -> Result<(), SandboxError> {
        self.table
            .remove(id)
            .map_err(|e| SandboxError::Internal(format!("deleting sandbox {id}: {e}")))
    }

    /// CNI CHECK of a ready pod's network: None when there is nothing to check (host network,
    /// no CNI, not ready, or a plugin version without CHECK), else "ok" or the plugin's error.
    pub async fn check_network(&self, rec: &SandboxRecord) -> Option<String> {
        if rec.state != SandboxState::Ready || rec.net_ns.is_none() {
            return None;
        }
        match self.net.as_ref()?.check(&rec.id).await {
            Ok(true) => Some("ok".into()),
            Ok(false) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// The last CNI CHECK of a ready pod's network, for a verbose status: "ok", the plugin's
    /// error, or "pending" before the first finished; None when there is nothing to check.
    /// A result older than 10 s starts a new CHECK in the background: the status never waits
    /// for the plugins.
    pub fn last_network_check(self: &Arc<Self>, rec: &SandboxRecord) -> Option<String> {
        if rec.state != SandboxState::Ready || rec.net_ns.is_none() || self.net.is_none() {
            return None;
        }
        let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        let entry = checks.entry(rec.id.clone()).or_default();
        let stale = entry.at.is_none_or(|at| at.elapsed() > CHECK_FRESH);
        if stale && !entry.running {
            entry.running = true;
            let (me, rec) = (self.clone(), rec.clone());
            tokio::spawn(async move {
                let result = me.check_network(&rec).await;
                let mut checks = me.checks.lock().unwrap_or_else(|e| e.into_inner());
                // Only while the pod still exists (its removal forgets the entry).
                if let Some(entry) = checks.get_mut(&rec.id) {
                    *entry = NetworkCheck {
                        result,
                        at: Some(std::time::Instant::now()),
                        running: false,
                    };
                }
            });
        }
        match (&entry.result, entry.at) {
            (Some(r), _) => Some(r.clone()),
            (None, None) => Some("pending".into()),
            (None, Some(_)) => None,
        }
    }

    /// The sandbox with id `id` or a unique prefix of it.
    pub fn get(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        self.find(id).map(|r| SandboxRecord::clone(&r))
    }

    /// The sandbox with id `id` or a unique prefix of it, shared.
    pub fn find(&self, id: &str) -> Result<Arc<SandboxRecord>, SandboxError> {
        if id.is_empty() {
            return Err(SandboxError::InvalidArgument(
                "pod sandbox id is empty".into(),
            ));
        }
        self.table
            .find(id)
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))
    }

    /// The sandbox `id` (or a unique prefix), held so that it is neither stopped nor removed
    /// until the returned guard is dropped: a container created meanwhile is seen by the stop or
    /// removal that follows.
    pub async fn admit(&self, id: &str) -> Result<(SandboxRecord, SandboxMember), SandboxError> {
        let full = self.find(id)?.id.clone();
        let member = self.gates.member(&full).await;
        // Looked up again: a removal may have finished while this call waited.
        Ok((self.get(&full)?, member))
    }

    /// Holds the sandbox `id` (or a unique prefix) against container creations, for a stop or
    /// removal; None when there is no such sandbox.
    pub async fn hold(&self, id: &str) -> Option<SandboxExclusive> {
        let full = self.find(id).ok()?.id.clone();
        Some(self.gates.exclusive(&full).await)
    }

    /// Every sandbox (Creating ones included).
    pub fn list(&self) -> Result<Vec<Arc<SandboxRecord>>, SandboxError> {
        self.records()
    }

    /// RunPodSandbox: returns the id (the first call's id for a retried request) and whether
    /// this call made the sandbox.
    pub async fn run(
        &self,
        req: &cri::RunPodSandboxRequest,
    ) -> Result<(String, bool), SandboxError> {
        // The pod init joins the pod's cgroups in a few milliseconds, and the pod's first
        // container's init follows soon after the call returns.
        super::cgroup_attach::prime();
        let config = req.config.as_ref().ok_or_else(|| {
            SandboxError::InvalidArgument("RunPodSandbox: config is missing".into())
        })?;
        let meta = config.metadata.as_ref().ok_or_else(|| {
            SandboxError::InvalidArgument("RunPodSandbox: config.metadata is missing".into())
        })?;
        for (field, value) in [
            ("name", &meta.name),
            ("uid", &meta.uid),
            ("namespace", &meta.namespace),
        ] {
            if value.is_empty() {
                return Err(SandboxError::InvalidArgument(format!(
                    "RunPodSandbox: metadata.{field} is empty"
                )));
            }
        }
        if !matches!(req.runtime_handler.as_str(), "" | "berth" | "runc") {
            return Err(SandboxError::InvalidArgument(format!(
                "RunPodSandbox: unknown runtime handler {:?} (Berth has the default handler only)",
                req.runtime_handler
            )));
        }
        if config.hostname.len() > 64 {
            return Err(SandboxError::InvalidArgument(format!(
                "RunPodSandbox: hostname {:?} is longer than 64 bytes",
                config.hostname
            )));
        }
        let cgroup_parent = config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_default();
        let cgroup_parent = cgroup_driver::current()
            .pod_cgroup(&cgroup_parent)
            .map_err(|e| SandboxError::InvalidArgument(format!("RunPodSandbox: {e}")))?;
        let name = format!(
            "{}_{}_{}_{}",
            meta.name, meta.namespace, meta.uid, meta.attempt
        );
        let fingerprint = names::fingerprint(req);
        let id = crate::util::random_hex(32);
        let ticket = match self.names.reserve(&name, fingerprint, &id).await {
            Reservation::Existing(id) => {
                tracing::info!(sandbox = %id, name = %name, "retried RunPodSandbox: returning the first call's sandbox");
                return Ok((id, false));
            }
            Reservation::Conflict { id } => return Err(SandboxError::NameInUse { name, id }),
            Reservation::New(t) => t,
        };
        let ns = namespace_mode(config);
        let host_net = ns.network == cri::NamespaceMode::Node as i32;
        let host_ipc = ns.ipc == cri::NamespaceMode::Node as i32;
        let pod_pid = ns.pid == cri::NamespaceMode::Pod as i32;
        let user_ids = userns::from_cri(ns.userns_options.as_ref())
            .map_err(|e| SandboxError::InvalidArgument(format!("RunPodSandbox: {e}")))?;
        if user_ids.is_some() && !userns::supported() {
            return Err(SandboxError::FailedPrecondition(
                "RunPodSandbox: pods with their own user namespace need idmapped mounts, which this host does not support (see berthd's log)".into(),
            ));
        }
        // With the host's network the pod's user namespace owns its IPC (and PID) namespaces;
        // the network stays the host's, which the pod's root cannot administer.
        if user_ids.is_some() {
            let host = [
                (host_ipc, "IPC"),
                (ns.pid == cri::NamespaceMode::Node as i32, "PID"),
            ];
            if let Some((_, what)) = host.iter().find(|(on, _)| *on) {
                return Err(SandboxError::InvalidArgument(format!(
                    "RunPodSandbox: a pod with its own user namespace cannot use the host's {what} namespace"
                )));
            }
        }
        let dir = self.state_dir.join("sandboxes").join(&id);
        let mut rec = SandboxRecord {
            id: id.clone(),
            name,
            state: SandboxState::Creating,
            created_at: crate::util::unix_nanos_now(),
            runtime_handler: req.runtime_handler.clone(),
            config_hex: hex::encode(config.encode_to_vec()),
            fingerprint_hex: hex::encode(fingerprint),
            net_ns: (!host_net).then(|| dir.join("netns")),
            ipc_ns: (!host_ipc).then(|| dir.join("ipcns")),
            // The UTS namespace follows the network's, as in Kubernetes.
            uts_ns: (!host_net).then(|| dir.join("utsns")),
            pid_ns: pod_pid.then(|| dir.join("pidns")),
            pod_init: None,
            user_ns: user_ids.map(|_| dir.join("userns")),
            user_ids,
            shm: (!host_ipc).then(|| dir.join("shm")),
            dir,
            cgroup_parent,
            created_cgroups: Vec::new(),
            pod_ips: Vec::new(),
            decoded: Decoded::default(),
            list_item: Encoded::default(),
        };
        // Only the record and the pod cgroup are made under the lock (see `make_cgroups`);
        // the pod's files, namespaces and network are its own, made outside it, so pods
        // started together do not queue behind each other. The record stays `Creating`
        // (hidden from lists, refused by stop/remove) meanwhile.
        let guard = self
            .lock
            .lock()
            .instrument(debug_span!("sandbox_lock"))
            .await;
        let mut built = self
            .check_user_ids(&rec, &meta.uid)
            .and_then(|()| self.make_cgroups(&mut rec))
            .and_then(|()| self.save(&rec));
        drop(guard);
        if built.is_ok() {
            let span = debug_span!("build_sandbox", sandbox = %rec.id);
            built = self
                .build(&mut rec, config, host_net)
                .instrument(span)
                .await;
        }
        if built.is_ok() {
            built = self
                .attach_network(&mut rec, config)
                .instrument(debug_span!("cni_add"))
                .await;
        }
        if built.is_err() {
            self.release_network(&rec).await;
        }
        let _guard = self.lock.lock().await;
        self.adopt_handed_over(&mut rec);
        match built {
            Ok(()) => {
                rec.state = SandboxState::Ready;
                if let Err(e) = self.save(&rec) {
                    self.release_network(&rec).await;
                    self.teardown(&rec);
                    let _ = self.delete(&rec.id);
                    return Err(e);
                }
                ticket.created();
                tracing::info!(sandbox = %rec.id, name = %rec.name, "pod sandbox ready");
                Ok((rec.id, true))
            }
            Err(e) => {
                self.teardown(&rec);
                let _ = self.delete(&rec.id);
                Err(e)
            }
        }
    }

    /// Refuses user-namespace mappings whose host ids another pod's sandbox uses (sandboxes of
    /// the same pod, its earlier attempts, share its ids). Call with the lock held.
    fn check_user_ids(&self, rec: &SandboxRecord, pod_uid: &str) -> Result<(), SandboxError> {
        let Some(ids) = &rec.user_ids else {
            return Ok(());
        };
        for other in self.table.all() {
            let Some(theirs) = &other.user_ids else {
                continue;
            };
            let their_uid = other
                .config_ref()
                .metadata
                .as_ref()
                .map(|m| m.uid.as_str())
                .unwrap_or_default();
            if other.id != rec.id && their_uid != pod_uid && ids.overlaps(theirs) {
                return Err(SandboxError::InvalidArgument(format!(
                    "RunPodSandbox: user namespace host ids {}+{} (uids) / {}+{} (gids) overlap those of pod sandbox {} ({})",
                    ids.uids.host_id,
                    ids.uids.length,
                    ids.gids.host_id,
                    ids.gids.length,
                    other.id,
                    other.name
                )));
            }
        }
        Ok(())
    }

    /// The pod cgroup, and below it the leaf of a shared-PID pod's init (before the init, which
    /// starts inside it; the record saved next names what was made), under the manager's
    /// lock: a pod being removed meanwhile either finds the ancestors this pod shares still
    /// empty and removes them before they are made again, or finds this pod's cgroup below
    /// them and hands them over to it (`hand_over_cgroups`).
    fn make_cgroups(&self, rec: &mut SandboxRecord) -> Result<(), SandboxError> {
        if rec.cgroup_parent.is_empty() {
            return Ok(());
        }
        if let Some(root) = self.systemd_root() {
            // systemd makes the slices (with the first unit started in them); those not there
            // yet are Berth's to stop at removal.
            let mut path = PathBuf::new();
            for part in rec.cgroup_parent.split('/').filter(|p| !p.is_empty()) {
                path.push(part);
                if !root.join(&path).exists() {
                    rec.created_cgroups.push(root.join(&path));
                }
            }
            return Ok(());
        }
        // `ensure` makes every missing ancestor too (and removes them again on failure).
        let deepest = match rec.pid_ns {
            Some(_) => pod_init_cgroup(&rec.cgroup_parent),
            None => rec.cgroup_parent.clone(),
        };
        rec.created_cgroups =
            cgroups::ensure(&self.layout, &deepest).map_err(internal("creating the pod cgroup"))?;
        Ok(())
    }

    /// Takes into `rec` the cgroup directories a removed pod handed over to the stored copy
    /// of this record while it was being built (call with the lock held, before saving).
    fn adopt_handed_over(&self, rec: &mut SandboxRecord) {
        if let Some(stored) = self.table.get(&rec.id) {
            for dir in &stored.created_cgroups {
                if !rec.created_cgroups.contains(dir) {
                    rec.created_cgroups.push(dir.clone());
                }
            }
        }
    }

    /// Makes the pod's files, /dev/shm and namespaces; the caller undoes it on error.
    async fn build(
        &self,
        rec: &mut SandboxRecord,
        config: &cri::PodSandboxConfig,
        host_net: bool,
    ) -> Result<(), SandboxError> {
        // Root's alone (the pod's /dev/shm is below), or its pod root's, whose containers
        // reach the files below by path from inside the pod's user namespace.
        super::dir_modes::ensure_owned(&rec.dir, rec.user_ids.map(|ids| ids.root_on_host()))
            .map_err(internal(format!("creating {}", rec.dir.display())))?;
        // As containerd: the node's name for host-network pods and when the pod names none.
        let hostname = if host_net || config.hostname.is_empty() {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        } else {
            config.hostname.clone()
        };
        let write = |name: &str, content: String| {
            sandbox_files::write_file(&rec.file(name), &content)
                .map_err(internal(format!("writing {}", rec.file(name).display())))
        };
        write("hostname", format!("{hostname}\n"))?;
        write(
            "hosts",
            sandbox_files::hosts(host_net, &hostname).map_err(internal("reading /etc/hosts"))?,
        )?;
        write(
            "resolv.conf",
            sandbox_files::resolv_conf(config.dns_config.as_ref())
                .map_err(internal("reading /etc/resolv.conf"))?,
        )?;
        // A user-namespaced pod's root owns the files Berth makes for it (they are bound into
        // its containers as they are).
        let owner = rec.user_ids.map(|ids| ids.root_on_host());
        if let Some((uid, gid)) = owner {
            for name in ["hostname", "hosts", "resolv.conf"] {
                std::os::unix::fs::chown(rec.file(name), Some(uid), Some(gid))
                    .map_err(internal(format!("giving {name} to the pod's root")))?;
            }
        }
        if let Some(shm) = &rec.shm {
            sandbox_files::mount_shm(shm, owner).map_err(internal("pod /dev/shm"))?;
        }
        let sysctls: Vec<(String, String)> = config
            .linux
            .as_ref()
            .map(|l| {
                let mut v: Vec<_> = l
                    .sysctls
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default();
        let pins = PinRequest {
            net: rec.net_ns.clone(),
            ipc: rec.ipc_ns.clone(),
            uts: rec.uts_ns.clone(),
            pid: rec.pid_ns.clone(),
            user: rec.user_ns.clone().zip(rec.user_ids),
            // Under systemd the init starts where berthd is and moves into its scope below.
            cgroups: if rec.cgroup_parent.is_empty() || self.systemd_root().is_some() {
                Vec::new()
            } else {
                self.layout.dirs(&pod_init_cgroup(&rec.cgroup_parent))
            },
            hostname: rec.uts_ns.as_ref().map(|_| hostname.clone()),
            sysctls,
        };
        if pins.net.is_some()
            || pins.ipc.is_some()
            || pins.uts.is_some()
            || pins.pid.is_some()
            || pins.user.is_some()
        {
            rec.pod_init = pin::pin(&self.exe, &pins)
                .instrument(debug_span!("pin_namespaces"))
                .await
                .map_err(|e| match e {
                    pin::PinError::SysctlInvalid(_) | pin::PinError::SysctlNotAllowed(_) => {
                        SandboxError::InvalidArgument(format!("RunPodSandbox: {e}"))
                    }
                    e => SandboxError::Internal(e.to_string()),
                })?;
            if let (Some(init), Some(root)) = (rec.pod_init, self.systemd_root())
                && !rec.cgroup_parent.is_empty()
            {
                let (pod, id) = (rec.cgroup_parent.clone(), rec.id.clone());
                tokio::task::spawn_blocking(move || {
                    systemd_units::start_pod_init_scope(&root, &pod, &id, init.pid)
                })
                .await
                .map_err(|e| SandboxError::Internal(format!("RunPodSandbox: {e}")))?
                .map_err(|e| SandboxError::Internal(format!("RunPodSandbox: {e}")))?;
            }
            if rec.pod_init.is_some() {
                let _guard = self.lock.lock().await;
                self.adopt_handed_over(rec);
                self.save(rec)?;
            }
        } else if !pins.sysctls.is_empty() {
            return Err(SandboxError::InvalidArgument(format!(
                "RunPodSandbox: sysctl {} needs a pod namespace, but the pod uses the host's",
                pins.sysctls[0].0
            )));
        }
        Ok(())
    }

    /// CNI ADD on the pinned netns (loopback is already up); hostNetwork pods have none.
    async fn attach_network(
        &self,
        rec: &mut SandboxRecord,
        config: &cri::PodSandboxConfig,
    ) -> Result<(), SandboxError> {
        if let (Some(net), Some(netns)) = (&self.net, &rec.net_ns) {
            let attached = net
                .setup(&rec.id, netns, config)
                .await
                .map_err(|e| match e {
                    NetError::InvalidArgument(_) => {
                        SandboxError::InvalidArgument(format!("RunPodSandbox: {e}"))
                    }
                    e => SandboxError::Internal(format!("RunPodSandbox: {e}")),
                })?;
            if let Some(a) = attached {
                rec.pod_ips = a.ips.iter().map(|ip| ip.to_string()).collect();
            }
        }
        Ok(())
    }

    /// The pod network manager, if networking is on.
    pub fn network(&self) -> Option<&Arc<NetManager>> {
        self.net.as_ref()
    }

    /// CNI DEL for the sandbox (a no-op when nothing is attached).
    async fn detach_network(&self, rec: &SandboxRecord) -> Result<(), SandboxError> {
        match &self.net {
            Some(net) => net
                .teardown(&rec.id)
                .await
                .map_err(|e| SandboxError::Internal(format!("pod sandbox {}: {e}", rec.id))),
            None => Ok(()),
        }
    }

    /// [`Self::detach_network`] on an error path: failures are logged (the attachment stays
    /// recorded and is released at the next start).
    async fn release_network(&self, rec: &SandboxRecord) {
        if let Err(e) = self.detach_network(rec).await {
            tracing::warn!(sandbox = %rec.id, error = %e, "releasing the pod network");
        }
    }

    /// Removes everything a sandbox owns on the host (not its record). Idempotent.
    fn teardown(&self, rec: &SandboxRecord) {
        if let Some(init) = &rec.pod_init {
            init.kill();
        }
        pin::unpin(&rec.pins(true, true));
        if let Some(shm) = &rec.shm {
            sandbox_files::unmount_shm(shm);
        }
        if rec.dir.starts_with(self.state_dir.join("sandboxes"))
            && let Err(e) = std::fs::remove_dir_all(&rec.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(sandbox = %rec.id, error = %e, "removing sandbox dir");
        }
        match self.systemd_root() {
            Some(root) => {
                let mut dirs: Vec<&PathBuf> = rec.created_cgroups.iter().collect();
                dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
                for dir in dirs {
                    if let Ok(rel) = dir.strip_prefix(&root) {
                        systemd_units::stop_if_unused(&root, &rel.to_string_lossy());
                    }
                }
            }
            None => cgroups::remove(&rec.created_cgroups),
        }
    }

    /// The cgroup v2 root, when pod cgroups are systemd's units (the systemd driver).
    fn systemd_root(&self) -> Option<PathBuf> {
        match &self.layout {
            Layout::V2(root)
                if cgroup_driver::current() == cgroup_driver::CgroupDriver::Systemd =>
            {
                Some(root.clone())
            }
            _ => None,
        }
    }

    /// The record of `id` for stop/remove: None when unknown; an error while it is still being
    /// created (its RunPodSandbox is running CNI ADD outside the lock).
    fn settled(&self, id: &str) -> Result<Option<SandboxRecord>, SandboxError> {
        match self.get(id) {
            Ok(r) if r.state == SandboxState::Creating => Err(SandboxError::Internal(format!(
                "pod sandbox {} is still being created",
                r.id
            ))),
            Ok(r) => Ok(Some(r)),
            Err(SandboxError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// UpdatePodSandboxResources: records the pod-level `overhead` and `resources` in the
    /// sandbox's config, as the kubelet has just set them on the pod's cgroup (the cgroup is
    /// the kubelet's to resize; Berth keeps its copy of the config true). An unknown sandbox
    /// is NotFound.
    pub async fn update_resources(
        &self,
        id: &str,
        overhead: Option<cri::LinuxContainerResources>,
        resources: Option<cri::LinuxContainerResources>,
    ) -> Result<(), SandboxError> {
        let _guard = self.lock.lock().await;
        let Some(rec) = self.settled(id)? else {
            return Err(SandboxError::NotFound(id.to_string()));
        };
        let mut config = rec.config();
        let linux = config.linux.get_or_insert_with(Default::default);
        linux.overhead = overhead;
        linux.resources = resources;
        let updated = SandboxRecord {
            config_hex: hex::encode(config.encode_to_vec()),
            decoded: Default::default(),
            list_item: Default::default(),
            ..rec
        };
        self.save(&updated)?;
        tracing::info!(sandbox = %updated.id, "pod sandbox resources updated");
        Ok(())
    }

    /// StopPodSandbox: tears down the network; unknown or stopped sandboxes are fine.
    pub async fn stop(&self, id: &str) -> Result<(), SandboxError> {
        // DEL first, outside the lock, while the netns exists (or from the cache if it is
        // gone); a sandbox already detached has nothing recorded, so a second stop is a no-op.
        let Some(rec) = ({
            let _guard = self.lock.lock().await;
            self.settled(id)?
        }) else {
            return Ok(());
        };
        self.detach_network(&rec)
            .instrument(debug_span!("cni_del"))
            .await?;
        let _guard = self.lock.lock().await;
        let Some(mut rec) = self.settled(&rec.id)? else {
            return Ok(());
        };
        if !rec.pod_ips.is_empty() {
            rec.pod_ips.clear();
            self.save(&rec)?;
        }
        if rec.state == SandboxState::Ready {
            // Killing the pod init ends whatever still runs in the pod's PID namespace.
            if let Some(init) = &rec.pod_init {
                init.kill();
            }
            pin::unpin(&rec.pins(true, false));
            rec.state = SandboxState::NotReady;
            self.save(&rec)?;
            tracing::info!(sandbox = %rec.id, "pod sandbox stopped");
        }
        Ok(())
    }

    /// RemovePodSandbox: stops it if needed and removes everything; unknown is fine.
    pub async fn remove(&self, id: &str) -> Result<(), SandboxError> {
        let Some(rec) = ({
            let _guard = self.lock.lock().await;
            self.settled(id)?
        }) else {
            return Ok(());
        };
        self.detach_network(&rec).await?;
        let _guard = self.lock.lock().await;
        let Some(rec) = self.settled(&rec.id)? else {
            return Ok(());
        };
        self.teardown(&rec);
        self.hand_over_cgroups(&rec)?;
        self.delete(&rec.id)?;
        self.gates.forget(&rec.id);
        if let Ok(mut checks) = self.checks.lock() {
            checks.remove(&rec.id);
        }
        self.names.release(&rec.name, &rec.id);
        tracing::info!(sandbox = %rec.id, "pod sandbox removed");
        Ok(())
    }

    /// cgroup directories this pod created that are still in use (ancestors shared with other
    /// pods, e.g. `/kubepods/burstable`) pass to a pod below them, which removes them in turn;
    /// otherwise they would outlive the last pod.
    fn hand_over_cgroups(&self, rec: &SandboxRecord) -> Result<(), SandboxError> {
        let left: Vec<&PathBuf> = rec.created_cgroups.iter().filter(|d| d.exists()).collect();
        if left.is_empty() {
            return Ok(());
        }
        for other in self.records()? {
            let mut other = SandboxRecord::clone(&other);
            if other.id == rec.id || other.cgroup_parent.is_empty() {
                continue;
            }
            let below = self.layout.dirs(&other.cgroup_parent);
            let adopted: Vec<PathBuf> = left
                .iter()
                .filter(|d| below.iter().any(|b| b.starts_with(d)))
                .filter(|d| !other.created_cgroups.contains(d))
                .map(|d| (*d).clone())
                .collect();
            if !adopted.is_empty() {
                other.created_cgroups.extend(adopted);
                self.save(&other)?;
            }
        }
        Ok(())
    }

    /// Labels and state for list filters.
    pub fn matches(rec: &SandboxRecord, filter: &cri::PodSandboxFilter) -> bool {
        if !filter.id.is_empty() && !rec.id.starts_with(&filter.id) {
            return false;
        }
        if let Some(state) = &filter.state {
            let want_ready = state.state == cri::PodSandboxState::SandboxReady as i32;
            if (rec.state == SandboxState::Ready) != want_ready {
                return false;
            }
        }
        let labels = &rec.config_ref().labels;
        filter
            .label_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }
}
