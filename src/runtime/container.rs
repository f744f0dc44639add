//! Containers: records, the shim that runs each one, and their life cycle.
//!
//! berthd knows each container's state itself: the records live in memory (written through to
//! the store on every change), and exits arrive as events from pidfds on the shim and the
//! container's init (`container_exit.rs`). List and status calls read that state and never call
//! a shim; the shim is asked only for what only it can do (start, kill, exec, attach, reopen
//! the log, update, delete).
//!
//! Restart invariants: a record in state `Creating` belongs to a CreateContainer that did not
//! finish: its shim (if any) is deleted and its rootfs, snapshot and bundle removed. Created
//! and running containers are watched again through their recorded processes; one whose init
//! or shim ended while berthd was down is recorded as exited from its exit file (written by
//! the shim when the container exited), and the STOPPED event is sent (see `events.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_cri::v1 as cri;
use prost::Message;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, debug_span};

use super::container_create::{ContainerCreator, CreateError, CreateExtras, Prepared};
use super::decoded::{Decoded, Encoded};
use super::events::{ContainerEvent, EventBus, EventKind};
use super::names::{self, NameRegistry, Reservation};
use super::process::HostProcess;
use super::shim_client::{ShimClient, ShimError, api};
use crate::image::ImageManager;
use crate::store::{CONTAINERS, RecordTable, Store};

/// Deadline of quick shim calls (state, kill, start).
pub(super) const SHIM_CALL: Duration = Duration::from_secs(5);

/// Life-cycle state of a container.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ContainerState {
    /// CreateContainer in progress (or crashed half-way).
    Creating,
    /// The shim created it; not started.
    Created,
    /// Started.
    Running,
    /// Its process exited.
    Exited,
}

/// How a container ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    pub exit_code: i32,
    /// Unix nanoseconds.
    pub finished_at: i64,
    pub reason: String,
    /// Why the exit is not the shim's own account (its shim died, or never said).
    #[serde(default)]
    pub message: String,
}

/// A container as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub exit: Option<ExitInfo>,
    /// ContainerConfig, protobuf-encoded, as hex.
    pub config_hex: String,
    pub fingerprint_hex: String,
    pub image_ref: String,
    pub image_id: String,
    pub bundle: PathBuf,
    pub snapshot: String,
    pub log_path: PathBuf,
    pub socket: PathBuf,
    pub exit_file: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The shim serving this container (None in records of berthd 0.1 before pids were kept).
    #[serde(default)]
    pub shim_process: Option<HostProcess>,
    /// The container's init process, from create on.
    #[serde(default)]
    pub init_process: Option<HostProcess>,
    /// Exited, and its shim deleted and rootfs unmounted already (see `container_exit.rs`):
    /// removing it only deletes files and the record.
    #[serde(default)]
    pub retired: bool,
    /// The signal StopContainer sends first (see [`super::stop_signal`]).
    #[serde(default = "default_stop_signal")]
    pub stop_signal: i32,
    /// Each mount's `image_sub_path`, by mount index (a field the stored config's type lacks);
    /// empty when no mount has one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_sub_paths: Vec<String>,
    /// `config_hex` decoded, once.
    #[serde(skip)]
    pub decoded: Decoded<cri::ContainerConfig>,
    /// The record's ListContainers item, encoded once.
    #[serde(skip)]
    pub list_item: Encoded,
}

fn default_stop_signal() -> i32 {
    super::stop_signal::DEFAULT
}

impl ContainerRecord {
    /// The decoded config (decoded once per record in memory).
    pub fn config_ref(&self) -> &cri::ContainerConfig {
        self.decoded.get(&self.config_hex)
    }

    /// The decoded config, owned.
    pub fn config(&self) -> cri::ContainerConfig {
        self.config_ref().clone()
    }

    /// Created or running: a shim serves it and its process may run.
    pub fn is_active(&self) -> bool {
        matches!(
            self.state,
            ContainerState::Created | ContainerState::Running
        )
    }
}

/// Why a container operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// From the create checks.
    #[error(transparent)]
    Create(#[from] CreateError),
    /// No such container.
    #[error("container {0} not found")]
    NotFound(String),
    /// Wrong state for the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The name is held by another container.
    #[error("container name {name} is already in use by container {id}")]
    NameInUse { name: String, id: String },
    /// The shim did not answer in time.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The shim is gone.
    #[error("{0}")]
    Unavailable(String),
    /// Host trouble.
    #[error("{0}")]
    Internal(String),
}

impl ContainerError {
    /// A failed call to the shim of container `id`, naming the container.
    pub fn shim(id: &str, e: ShimError) -> Self {
        let msg = format!("container {id}: {e}");
        match e {
            ShimError::DeadlineExceeded { .. } => ContainerError::DeadlineExceeded(msg),
            ShimError::Unavailable { .. } => ContainerError::Unavailable(msg),
            _ => ContainerError::Internal(msg),
        }
    }
}

/// Runs and tracks containers.
pub struct ContainerManager {
    /// This manager, for the tasks it spawns.
    me: Weak<ContainerManager>,
    table: RecordTable<ContainerRecord>,
    /// Per container: the exit watcher and the lock that orders its state changes.
    live: std::sync::Mutex<HashMap<String, super::container_exit::Live>>,
    events: Arc<EventBus>,
    images: ImageManager,
    creator: Arc<ContainerCreator>,
    sandboxes: Arc<super::sandbox::SandboxManager>,
    state_dir: PathBuf,
    shim: PathBuf,
    names: NameRegistry,
    lock: tokio::sync::Mutex<()>,
}

impl ContainerManager {
    /// Loads containers and repairs what a crash left (see the module doc); watches the
    /// created and running ones again.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        store: Store,
        images: ImageManager,
        creator: Arc<ContainerCreator>,
        sandboxes: Arc<super::sandbox::SandboxManager>,
        events: Arc<EventBus>,
        state_dir: &std::path::Path,
        shim: PathBuf,
    ) -> Result<Arc<Self>, ContainerError> {
        let table = RecordTable::load(store, CONTAINERS, |r: &ContainerRecord| r.id.as_str())
            .map_err(|e| ContainerError::Internal(e.to_string()))?;
        let manager = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            table,
            live: Default::default(),
            events,
            images,
            creator,
            sandboxes,
            state_dir: state_dir.to_owned(),
            shim,
            names: NameRegistry::new(),
            lock: tokio::sync::Mutex::new(()),
        });
        for rec in manager.table.all() {
            if rec.state == ContainerState::Creating {
                tracing::info!(container = %rec.id, "rolling back a container that was half created");
                manager.teardown(&rec).await;
                manager.delete(&rec.id)?;
                continue;
            }
            manager.names.restore(
                &rec.name,
                &rec.id,
                names::fingerprint_from_hex(&rec.fingerprint_hex),
            );
            if rec.is_active() {
                manager.recover(&rec);
            }
        }
        let known = manager.table.all().iter().map(|r| r.id.clone()).collect();
        let swept = manager.creator.remove_unrecorded(&known);
        if swept != Default::default() {
            tracing::info!(
                bundles = swept.dirs,
                mounts = swept.mounts,
                snapshots = swept.snapshots,
                "removed what no container record names"
            );
        }
        Ok(manager)
    }

    /// The event bus this manager sends container events on.
    pub fn events(&self) -> &Arc<EventBus> {
        &self.events
    }

    pub(super) fn weak(&self) -> Weak<Self> {
        self.me.clone()
    }

    pub(super) fn table(&self) -> &RecordTable<ContainerRecord> {
        &self.table
    }

    pub(super) fn live(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, super::container_exit::Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn save(&self, rec: &ContainerRecord) -> Result<Arc<ContainerRecord>, ContainerError> {
        self.table
            .put(&rec.id, rec.clone())
            .map_err(|e| ContainerError::Internal(format!("saving container {}: {e}", rec.id)))
    }

    fn delete(&self, id: &str) -> Result<(), ContainerError> {
        self.table
            .remove(id)
            .map_err(|e| ContainerError::Internal(format!("deleting container {id}: {e}")))
    }

    /// The containers of sandbox `sandbox_id` as they are now, with `this` in place of its
    /// stored record (or left out once deleted).
    fn pod_of(
        &self,
        sandbox_id: &str,
        this: Option<(&Arc<ContainerRecord>, EventKind)>,
    ) -> Vec<Arc<ContainerRecord>> {
        let mut pod: Vec<_> = self
            .table
            .all()
            .into_iter()
            .filter(|r| r.sandbox_id == sandbox_id && r.state != ContainerState::Creating)
            .filter(|r| this.is_none_or(|(t, _)| t.id != r.id))
            .collect();
        if let Some((t, kind)) = this
            && kind != EventKind::Deleted
        {
            pod.push(t.clone());
        }
        pod
    }

    /// Sends a `kind` event for `rec` with its pod's containers as they are now.
    pub(super) fn emit(&self, kind: EventKind, rec: Arc<ContainerRecord>, recovered: bool) {
        let event = ContainerEvent {
            kind,
            at: crate::util::unix_nanos_now(),
            id: rec.id.clone(),
            sandbox_id: rec.sandbox_id.clone(),
            pod: self.pod_of(&rec.sandbox_id, Some((&rec, kind))),
        };
        if recovered {
            self.events.emit_recovered(event);
        } else {
            self.events.emit(event);
        }
    }

    /// Sends a `kind` event about pod sandbox `sandbox_id` itself (its id as the container id,
    /// as containerd reports its sandbox containers), with the pod's containers.
    pub fn emit_sandbox(&self, kind: EventKind, sandbox_id: &str) {
        self.events.emit(ContainerEvent {
            kind,
            at: crate::util::unix_nanos_now(),
            id: sandbox_id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            pod: self.pod_of(sandbox_id, None),
        });
    }

    /// The container `id` (or a unique prefix).
    pub fn get(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        self.find(id).map(|r| ContainerRecord::clone(&r))
    }

    /// The container `id` (or a unique prefix), shared.
    pub fn find(&self, id: &str) -> Result<Arc<ContainerRecord>, ContainerError> {
        if id.is_empty() {
            return Err(ContainerError::NotFound("(empty id)".into()));
        }
        self.table
            .find(id)
            .ok_or_else(|| ContainerError::NotFound(id.to_string()))
    }

    /// CreateContainer: the first call's id for a retried request.
    /// `extras`: what a CRI v0.34+ request carries beyond k8s-cri's message.
    pub async fn create(
        &self,
        req: Arc<cri::CreateContainerRequest>,
        extras: CreateExtras,
    ) -> Result<String, ContainerError> {
        let config = req.config.as_ref().ok_or_else(|| {
            CreateError::InvalidArgument("CreateContainer: config is missing".into())
        })?;
        let meta = config.metadata.clone().unwrap_or_default();
        let requested_stop_signal =
            super::stop_signal::from_cri(extras.stop_signal).map_err(|e| {
                CreateError::InvalidArgument(format!("CreateContainer {}: {e}", meta.name))
            })?;
        check_log_path(&meta.name, &config.log_path)?;
        let sandbox_name = req
            .sandbox_config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| format!("{}_{}_{}", m.name, m.namespace, m.uid))
            .unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}",
            meta.name, sandbox_name, req.pod_sandbox_id, meta.attempt
        );
        let fingerprint = names::fingerprint(&*req);
        let image_sub_paths = if extras.image_sub_paths.iter().all(String::is_empty) {
            Vec::new()
        } else {
            extras.image_sub_paths.clone()
        };
        // The name first: a retry while the first call still prepares waits for its result
        // instead of preparing a second bundle.
        let new_id = crate::util::random_hex(32);
        let ticket = match self.names.reserve(&name, fingerprint, &new_id).await {
            Reservation::Existing(id) => return Ok(id),
            Reservation::Conflict { id } => return Err(ContainerError::NameInUse { name, id }),
            Reservation::New(t) => t,
        };
        // On any error below the ticket is dropped, which frees the name again.
        // The pod is neither stopped nor removed until this container is recorded with its shim,
        // so a stop or removal that follows sees it.
        let (sandbox, _member) = self
            .sandboxes
            .admit(&req.pod_sandbox_id)
            .await
            .map_err(CreateError::from_sandbox)?;
        let target_pid_ns = self.target_pid_namespace(config)?;
        // The init joins its cgroups a few milliseconds from now, in the shim.
        super::cgroup_attach::prime();
        // Mounting the rootfs and writing the bundle block: off the async workers, so pods
        // created together do not hold up every other call.
        let (creator, shared_req, span) = (
            self.creator.clone(),
            req.clone(),
            debug_span!("prepare_container", container = %new_id),
        );
        let id_for_prep = new_id.clone();
        let mut prepared = tokio::task::spawn_blocking(move || {
            span.in_scope(|| creator.create(&id_for_prep, &shared_req, target_pid_ns, &extras))
        })
        .await
        .map_err(|e| ContainerError::Internal(format!("CreateContainer {new_id}: {e}")))??;
        let log_dir = sandbox.config_ref().log_directory.clone();
        let log_path = match (log_dir.is_empty(), config.log_path.is_empty()) {
            (false, false) => PathBuf::from(&log_dir).join(&config.log_path),
            _ => prepared
                .bundle
                .clone()
                .unwrap_or_default()
                .join("container.log"),
        };
        let bundle = prepared.bundle.clone().unwrap_or_default();
        let user = prepared.user.clone().unwrap_or_default();
        let mut rec = ContainerRecord {
            id: prepared.id.clone(),
            name,
            sandbox_id: prepared.sandbox_id.clone(),
            state: ContainerState::Creating,
            created_at: crate::util::unix_nanos_now(),
            started_at: 0,
            exit: None,
            config_hex: hex::encode(config.encode_to_vec()),
            fingerprint_hex: hex::encode(fingerprint),
            image_ref: config
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_id: prepared.image_id.clone(),
            snapshot: prepared.snapshot.clone().unwrap_or_default(),
            log_path,
            // Unix socket paths are limited to 108 bytes: a prefix of the id is unique enough.
            socket: self.state_dir.join("shims").join(format!(
                "{}.sock",
                &prepared.id[..24.min(prepared.id.len())]
            )),
            exit_file: bundle.join("exit.json"),
            image_sub_paths,
            stop_signal: super::stop_signal::resolve(
                requested_stop_signal,
                &prepared.image_stop_signal,
            ),
            bundle,
            uid: user.uid,
            gid: user.gid,
            groups: user.supplemental_groups.clone(),
            shim_process: None,
            init_process: None,
            retired: false,
            decoded: Decoded::default(),
            list_item: Encoded::default(),
        };
        // No lock: nobody knows the new id before this call returns.
        let made = async {
            self.save(&rec)?;
            let spawned = self
                .spawn_shim(&rec, config)
                .instrument(debug_span!("shim_create"))
                .await;
            // The container's process has made its own mounts of any idmapped bind sources.
            super::userns::release_binds(&rec.bundle);
            let (shim_pid, init_pid) = spawned?;
            if super::cgroup_driver::current() == super::cgroup_driver::CgroupDriver::Systemd
                && let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref())
            {
                let layout = super::cgroups::Layout::detect()
                    .map_err(|e| ContainerError::Internal(format!("reading cgroup mounts: {e}")))?;
                super::container_update::write_created_resources(&layout, &rec.id, &rec.bundle, r)?;
                super::container_update::set_created_unit_properties(&rec.id, &rec.bundle).await?;
            }
            rec.shim_process =
                Some(HostProcess::of(shim_pid).unwrap_or(HostProcess::ended(shim_pid)));
            rec.init_process =
                Some(HostProcess::of(init_pid).unwrap_or(HostProcess::ended(init_pid)));
            rec.state = ContainerState::Created;
            self.save(&rec)
        }
        .await;
        match made {
            Ok(saved) => {
                ticket.created();
                tracing::info!(container = %rec.id, "container created");
                // CREATED goes out first: an init that dies at once is STOPPED after it.
                self.emit(EventKind::Created, saved.clone(), false);
                self.watch(&saved);
                Ok(rec.id)
            }
            Err(e) => {
                // Whatever step failed, nothing stays: shim, rootfs, snapshot, bundle, record;
                // each undone once, by what the preparation recorded it made.
                self.release_shim(&rec).await;
                prepared.undo(&self.images);
                let _ = self.delete(&rec.id);
                Err(e)
            }
        }
    }

    /// For PID mode TARGET: the PID namespace of the running target container.
    fn target_pid_namespace(
        &self,
        config: &cri::ContainerConfig,
    ) -> Result<Option<PathBuf>, ContainerError> {
        let Some(opts) = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .filter(|o| o.pid == cri::NamespaceMode::Target as i32)
        else {
            return Ok(None);
        };
        let target = match self.find(&opts.target_id) {
            Ok(t) => t,
            Err(ContainerError::NotFound(_)) => {
                return Err(CreateError::NotFound(format!(
                    "CreateContainer: PID namespace target container {:?} not found",
                    opts.target_id
                ))
                .into());
            }
            Err(e) => return Err(e),
        };
        match target.init_process {
            Some(init) if target.state == ContainerState::Running && init.is_running() => {
                Ok(Some(PathBuf::from(format!("/proc/{}/ns/pid", init.pid))))
            }
            _ => Err(CreateError::FailedPrecondition(format!(
                "CreateContainer: PID namespace target container {} is not running",
                target.id
            ))
            .into()),
        }
    }

    /// Runs the shim's create step; returns the shim's pid and the container init's.
    async fn spawn_shim(
        &self,
        rec: &ContainerRecord,
        config: &cri::ContainerConfig,
    ) -> Result<(i32, i32), ContainerError> {
        if let Some(dir) = rec.socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                ContainerError::Internal(format!("creating {}: {e}", dir.display()))
            })?;
        }
        if let Some(dir) = rec.log_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                ContainerError::Internal(format!("creating {}: {e}", dir.display()))
            })?;
        }
        let mut cmd = tokio::process::Command::new(&self.shim);
        cmd.arg("--id")
            .arg(&rec.id)
            .arg("--bundle")
            .arg(&rec.bundle)
            .arg("--socket")
            .arg(&rec.socket)
            .arg("--log-path")
            .arg(&rec.log_path)
            .arg("--exit-file")
            .arg(&rec.exit_file)
            .arg("--state-root")
            .arg(self.state_dir.join("containers"));
        if config.tty {
            cmd.arg("--tty");
        }
        if super::cgroup_driver::current() == super::cgroup_driver::CgroupDriver::Systemd {
            cmd.arg("--systemd-cgroup");
        }
        if config.stdin {
            cmd.arg("--stdin");
        }
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.kill_on_drop(true).output())
            .await
            .map_err(|_| {
                ContainerError::DeadlineExceeded(format!(
                    "berth-shim for {} did not report within 60 s",
                    rec.id
                ))
            })?
            .map_err(|e| {
                ContainerError::Internal(format!("starting {}: {e}", self.shim.display()))
            })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            tracing::debug!(id = %rec.id, stderr = %stderr.trim(), "berth-shim failed");
            return Err(ContainerError::Internal(format!(
                "creating container {}: {}",
                rec.id,
                shim_failure(&stderr)
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut pids = stdout.split_whitespace().map(str::parse::<i32>);
        match (pids.next(), pids.next()) {
            (Some(Ok(shim)), Some(Ok(init))) => Ok((shim, init)),
            _ => Err(ContainerError::Internal(format!(
                "creating container {}: berth-shim printed {:?}, not its pid and the init's",
                rec.id,
                stdout.trim()
            ))),
        }
    }

    /// StartContainer.
    pub async fn start(&self, id: &str) -> Result<(), ContainerError> {
        let rec = self.find(id)?;
        // Ordered with the exit watcher: STARTED always goes out before STOPPED.
        let transition = self.transition_lock(&rec.id);
        let _turn = transition.lock().await;
        let rec = self.find(&rec.id)?;
        if rec.state != ContainerState::Created {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is {:?}, not created",
                rec.id, rec.state
            )));
        }
        // Taken before the call: a short-lived process may exit before the call returns.
        let started_at = crate::util::unix_nanos_now();
        ShimClient::new(&rec.socket)
            .call(
                api::request::Request::Start(api::StartRequest {}),
                SHIM_CALL,
            )
            .await
            .map_err(|e| ContainerError::shim(&rec.id, e))?;
        let started = self
            .table
            .update(&rec.id, |r| {
                let created = r.state == ContainerState::Created;
                if created {
                    r.state = ContainerState::Running;
                    r.started_at = started_at;
                }
                created
            })
            .map_err(|e| ContainerError::Internal(format!("saving container {}: {e}", rec.id)))?;
        if let Some(rec) = started {
            self.emit(EventKind::Started, rec, false);
        }
        Ok(())
    }

    /// StopContainer: the stop signal, then SIGKILL after `timeout`; unknown or exited is fine.
    pub async fn stop(&self, id: &str, timeout: i64) -> Result<(), ContainerError> {
        let rec = match self.find(id) {
            Ok(r) => r,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        if !rec.is_active() {
            return Ok(());
        }
        match self
            .signal_and_wait(&rec, timeout)
            .instrument(debug_span!("signal_and_wait"))
            .await
        {
            // The container exited meanwhile (its shim retires and goes away after an exit):
            // stopped is what was asked for.
            Err(_) if self.find(&rec.id).map_or(true, |r| !r.is_active()) => {}
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        self.wait_retired(&rec.id)
            .instrument(debug_span!("wait_retired"))
            .await;
        Ok(())
    }

    /// The stop signal, a wait of `timeout` seconds, then SIGKILL to the whole container.
    async fn signal_and_wait(
        &self,
        rec: &ContainerRecord,
        timeout: i64,
    ) -> Result<(), ContainerError> {
        let shim = ShimClient::new(&rec.socket);
        let wait = |ms: u64| api::request::Request::Wait(api::WaitRequest { timeout_ms: ms });
        let kill = |signal: i32, all: bool| {
            shim.call(
                api::request::Request::Kill(api::KillRequest {
                    signal: signal as u32,
                    all,
                }),
                SHIM_CALL,
            )
        };
        if timeout > 0 {
            if let Err(e) = kill(rec.stop_signal, false).await {
                return self.exited_before_kill(rec, &shim, e).await;
            }
            let ms = (timeout as u64).saturating_mul(1000);
            if let Ok(api::response::Result::Wait(w)) = shim
                .call(wait(ms), Duration::from_millis(ms) + SHIM_CALL)
                .await
                && w.exited
            {
                self.record_exit(&rec.id, super::container_exit::from_status(w.exit), false)
                    .await;
                return Ok(());
            }
        }
        if let Err(e) = kill(libc::SIGKILL, true).await {
            return self.exited_before_kill(rec, &shim, e).await;
        }
        match shim
            .call(wait(10_000), Duration::from_secs(15))
            .await
            .map_err(|e| ContainerError::shim(&rec.id, e))?
        {
            api::response::Result::Wait(w) if w.exited => {
                self.record_exit(&rec.id, super::container_exit::from_status(w.exit), false)
                    .await;
                Ok(())
            }
            _ => Err(ContainerError::DeadlineExceeded(format!(
                "container {}: still running 10 s after SIGKILL",
                rec.id
            ))),
        }
    }

    /// A kill the shim refused: when the container's process had already exited on its own
    /// (reaped by the shim, its exit not yet recorded here), its exit is recorded now and the
    /// stop succeeds, so that the container reads exited as soon as StopContainer returns.
    async fn exited_before_kill(
        &self,
        rec: &ContainerRecord,
        shim: &ShimClient,
        refused: ShimError,
    ) -> Result<(), ContainerError> {
        let now = api::request::Request::Wait(api::WaitRequest { timeout_ms: 1 });
        match shim.call(now, SHIM_CALL).await {
            Ok(api::response::Result::Wait(w)) if w.exited => {
                self.record_exit(&rec.id, super::container_exit::from_status(w.exit), false)
                    .await;
                Ok(())
            }
            _ => Err(ContainerError::shim(&rec.id, refused)),
        }
    }

    /// RemoveContainer: kills it if running, deletes everything; unknown is fine.
    pub async fn remove(&self, id: &str) -> Result<(), ContainerError> {
        let rec = match self.find(id) {
            Ok(r) => r,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        // The watcher goes first: the shim exits on Delete, which is no crash.
        self.unwatch(&rec.id);
        // The shim call may be slow (a hung shim): only the record change holds the lock.
        let exit = if rec.retired {
            None
        } else {
            self.release_shim(&rec).await
        };
        let mut last = ContainerRecord::clone(&rec);
        if rec.is_active() {
            last.state = ContainerState::Exited;
            last.exit = Some(exit.unwrap_or_else(|| self.exit_from_file(&rec)));
            self.emit(EventKind::Stopped, Arc::new(last.clone()), false);
        }
        // The directories are deleted after the call returns (a container's rootfs may hold
        // many files); until then they are out of the way under names no container has.
        let doomed = self.prepared_of(&rec).detach(&self.images);
        if !doomed.is_empty() {
            tokio::task::spawn_blocking(move || super::container_create::delete_dirs(doomed));
        }
        {
            let _guard = self.lock.lock().await;
            self.delete(&rec.id)?;
            self.names.release(&rec.name, &rec.id);
        }
        self.emit(EventKind::Deleted, Arc::new(last), false);
        Ok(())
    }

    /// Removes the shim (kill + delete), the rootfs mount, the snapshot and the bundle.
    async fn teardown(&self, rec: &ContainerRecord) {
        self.release_shim(rec).await;
        self.undo_files(rec);
    }

    /// Removes the rootfs mount, the snapshot and the bundle.
    fn undo_files(&self, rec: &ContainerRecord) {
        self.prepared_of(rec).undo(&self.images);
    }

    /// What a container's preparation made, as its record tells.
    fn prepared_of(&self, rec: &ContainerRecord) -> Prepared {
        Prepared {
            id: rec.id.clone(),
            snapshot: (!rec.snapshot.is_empty()).then(|| rec.snapshot.clone()),
            rootfs_mounted: Some(rec.bundle.join("rootfs")),
            bundle: Some(rec.bundle.clone()),
            ..Default::default()
        }
    }

    /// Deletes the container through its shim (or, with no shim to answer, kills what runs in
    /// its cgroup and removes the cgroup), and removes the shim's socket. Returns the exit the
    /// shim reported, if it did.
    pub(super) async fn release_shim(&self, rec: &ContainerRecord) -> Option<ExitInfo> {
        let socket = rec.socket.clone();
        // Delete through the shim; a gone shim is fine.
        let deleted = ShimClient::new(&socket)
            .call(
                api::request::Request::Delete(api::DeleteRequest {}),
                Duration::from_secs(10),
            )
            .await;
        let exit = match deleted {
            Ok(api::response::Result::Delete(d)) => d.exit.map(super::container_exit::exit_info),
            Ok(_) => None,
            Err(_) => {
                // No shim to do it (crashed, or never started): whatever runs in the
                // container's cgroup is killed and the cgroup removed here.
                self.kill_cgroup(rec);
                None
            }
        };
        let _ = std::fs::remove_file(&socket);
        exit
    }

    /// Kills whatever runs in the container's cgroup and removes the cgroup.
    pub(super) fn kill_cgroup(&self, rec: &ContainerRecord) {
        if let Some(cgroup) = bundle_cgroup(&rec.bundle)
            && let Ok(layout) = super::cgroups::Layout::detect()
        {
            match &layout {
                // A scope: systemd stops it once empty (and its cgroup with it).
                super::cgroups::Layout::V2(root)
                    if super::cgroup_driver::current()
                        == super::cgroup_driver::CgroupDriver::Systemd =>
                {
                    super::cgroups::kill_all_processes(&layout, &cgroup);
                    super::systemd_units::stop_if_unused(root, &cgroup);
                }
                _ => super::cgroups::kill_and_remove(&layout, &cgroup),
            }
        }
    }

    /// ExecSync: runs `cmd` in the running container; a timeout of 0 waits without limit.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout_secs: i64,
    ) -> Result<api::ExecSyncResponse, ContainerError> {
        if cmd.is_empty() {
            return Err(CreateError::InvalidArgument("ExecSync: cmd is empty".into()).into());
        }
        let rec = self.running(id, "ExecSync")?;
        // The process joins the container's cgroups in the shim.
        super::cgroup_attach::prime();
        let timeout_ms = u64::try_from(timeout_secs.max(0))
            .unwrap_or(0)
            .saturating_mul(1000);
        let deadline = if timeout_ms == 0 {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::from_millis(timeout_ms) + SHIM_CALL
        };
        let request = api::request::Request::ExecSync(api::ExecSyncRequest {
            args: cmd.to_vec(),
            timeout_ms,
            ..Default::default()
        });
        match ShimClient::new(&rec.socket)
            .call(request, deadline)
            .await
            .map_err(|e| ContainerError::shim(&rec.id, e))?
        {
            api::response::Result::ExecSync(r) if r.timed_out => {
                Err(ContainerError::DeadlineExceeded(format!(
                    "ExecSync in container {}: command {cmd:?} timed out after {timeout_secs} s",
                    rec.id
                )))
            }
            api::response::Result::ExecSync(r) => Ok(r),
            other => Err(ContainerError::Internal(format!(
                "ExecSync: unexpected shim answer {other:?}"
            ))),
        }
    }

    /// ReopenContainerLog: the shim reopens the log file (after rotation).
    pub async fn reopen_log(&self, id: &str) -> Result<(), ContainerError> {
        let rec = self.running(id, "ReopenContainerLog")?;
        ShimClient::new(&rec.socket)
            .call(
                api::request::Request::ReopenLog(api::ReopenLogRequest {}),
                SHIM_CALL,
            )
            .await
            .map_err(|e| ContainerError::shim(&rec.id, e))?;
        Ok(())
    }

    /// The container `id` if it is running (for ExecSync, Exec, Attach and log reopening).
    pub fn running(&self, id: &str, call: &str) -> Result<Arc<ContainerRecord>, ContainerError> {
        let rec = self.find(id)?;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "{call}: container {} is not running",
                rec.id
            )));
        }
        Ok(rec)
    }

    /// Ids of the containers of sandbox `sandbox_id` (exact id).
    pub fn in_sandbox(&self, sandbox_id: &str) -> Result<Vec<String>, ContainerError> {
        Ok(self
            .table
            .all()
            .into_iter()
            .filter(|r| r.sandbox_id == sandbox_id)
            .map(|r| r.id.clone())
            .collect())
    }

    /// ContainerStatus: the state berthd holds.
    pub fn status(&self, id: &str) -> Result<Arc<ContainerRecord>, ContainerError> {
        self.find(id)
    }

    /// ListContainers, from the state berthd holds.
    pub fn list(&self, filter: Option<&cri::ContainerFilter>) -> Vec<Arc<ContainerRecord>> {
        let one;
        let candidates = match filter.map(|f| f.id.as_str()) {
            // An exact id is one lookup.
            Some(id) if !id.is_empty() => {
                one = self.table.find(id).into_iter().collect::<Vec<_>>();
                one
            }
            _ => self.table.all(),
        };
        candidates
            .into_iter()
            .filter(|rec| rec.state != ContainerState::Creating)
            .filter(|rec| filter.is_none_or(|f| container_matches(rec, f)))
            .collect()
    }

    /// Every stored container (stats).
    pub(crate) fn stored(&self) -> Result<Vec<ContainerRecord>, ContainerError> {
        Ok(self
            .table
            .all()
            .into_iter()
            .map(|r| ContainerRecord::clone(&r))
            .collect())
    }

    /// Saves a record changed in `container_update.rs`.
    pub(crate) fn save_record(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        self.save(rec).map(drop)
    }

    /// Serialises with create and remove (for `container_update.rs`).
    pub(crate) async fn lock_records(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }
}

/// Whether `rec` passes a ListContainers filter.
fn container_matches(rec: &ContainerRecord, f: &cri::ContainerFilter) -> bool {
    if !f.id.is_empty() && !rec.id.starts_with(&f.id) {
        return false;
    }
    if !f.pod_sandbox_id.is_empty() && !rec.sandbox_id.starts_with(&f.pod_sandbox_id) {
        return false;
    }
    if f.state
        .as_ref()
        .is_some_and(|s| cri_state(rec.state) != s.state)
    {
        return false;
    }
    let labels = &rec.config_ref().labels;
    f.label_selector
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// `linux.cgroupsPath` of the OCI spec in `bundle`.
fn bundle_cgroup(bundle: &std::path::Path) -> Option<String> {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    let path = super::container_update::cgroups_path(&spec)?;
    // Only a cgroup Berth named for a container (never a pod's or the root).
    let leaf = path.rsplit('/').next().unwrap_or_default();
    leaf.starts_with("berth-").then_some(path)
}

/// The shim's own account of a failed create: its last `berth-shim: ` line. The log lines of
/// libcontainer before it (cgroup warnings, timestamps) go to berthd's debug log, not into the
/// error a client sees; a stderr without such a line is given whole.
fn shim_failure(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("berth-shim: "))
        .map(str::trim)
        .unwrap_or_else(|| stderr.trim())
}

/// The CRI state of a container.
pub fn cri_state(s: ContainerState) -> i32 {
    match s {
        ContainerState::Creating | ContainerState::Created => {
            cri::ContainerState::ContainerCreated as i32
        }
        ContainerState::Running => cri::ContainerState::ContainerRunning as i32,
        ContainerState::Exited => cri::ContainerState::ContainerExited as i32,
    }
}

/// A container's `log_path` is relative to its pod's log directory, and must stay there: an
/// absolute path or a `..` would have the shim create and append to any file of the host.
fn check_log_path(name: &str, log_path: &str) -> Result<(), CreateError> {
    let path = std::path::Path::new(log_path);
    if path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(CreateError::InvalidArgument(format!(
            "CreateContainer {name}: log_path {log_path:?} must be relative to the pod's log directory, without \"..\""
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn log_paths_stay_in_the_pods_log_directory() {
        assert!(check_log_path("c", "c/0.log").is_ok());
        assert!(check_log_path("c", "c.log").is_ok());
        for bad in ["/etc/passwd", "../../etc/cron.d/x", "c/../../x"] {
            assert!(check_log_path("c", bad).is_err(), "{bad}");
        }
    }
    use super::*;

    #[test]
    fn the_shims_own_line_is_the_error() {
        let stderr = "2026-11-30T02:34:13Z  WARN libcgroups::v1::manager: cgroup hugetlb not supported\n\
            2026-11-30T02:34:13Z ERROR libcontainer: failed to run container process\n\
            berth-shim: create container abc (bundle /b): failed to create container: executable '/x' not found in $PATH\n";
        assert_eq!(
            shim_failure(stderr),
            "create container abc (bundle /b): failed to create container: executable '/x' not found in $PATH"
        );
        assert_eq!(
            shim_failure("  something else broke \n"),
            "something else broke"
        );
        assert_eq!(shim_failure(""), "");
    }
}
