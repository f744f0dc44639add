//! Containers: records, the shim that runs each one, and their life cycle.
//!
//! Restart invariants: a record in state `Creating` belongs to a CreateContainer that did not
//! finish: its shim (if any) is deleted and its rootfs, snapshot and bundle removed. Containers
//! whose shim is gone are reported from their exit file (written by the shim when the
//! container exited, even while berthd was down).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::container_create::{ContainerCreator, CreateError, Prepared};
use super::names::{self, NameRegistry, Reservation};
use super::shim_client::{ShimClient, ShimError, api};
use crate::image::ImageManager;
use crate::store::{CONTAINERS, Store};

/// Deadline of quick shim calls (state, kill, start).
const SHIM_CALL: Duration = Duration::from_secs(5);

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
}

impl ContainerRecord {
    /// The decoded config.
    pub fn config(&self) -> cri::ContainerConfig {
        hex::decode(&self.config_hex)
            .ok()
            .and_then(|b| cri::ContainerConfig::decode(b.as_slice()).ok())
            .unwrap_or_default()
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
    /// Host trouble.
    #[error("{0}")]
    Internal(String),
}

impl From<ShimError> for ContainerError {
    fn from(e: ShimError) -> Self {
        match e {
            ShimError::DeadlineExceeded { .. } => ContainerError::DeadlineExceeded(e.to_string()),
            e => ContainerError::Internal(e.to_string()),
        }
    }
}

/// The exit file the shim writes.
#[derive(Debug, Deserialize)]
struct ExitFile {
    exit_code: i32,
    #[serde(default)]
    exited_at: String,
    #[serde(default)]
    reason: String,
}

/// Runs and tracks containers.
pub struct ContainerManager {
    store: Store,
    images: ImageManager,
    creator: Arc<ContainerCreator>,
    sandboxes: Arc<super::sandbox::SandboxManager>,
    state_dir: PathBuf,
    shim: PathBuf,
    names: NameRegistry,
    lock: tokio::sync::Mutex<()>,
}

/// Parses RFC 3339 `YYYY-MM-DDTHH:MM:SS[.frac]Z` into Unix nanoseconds (UTC only).
fn parse_rfc3339_utc(s: &str) -> Option<i64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let nanos: i64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    // Days from civil (proleptic Gregorian), after Howard Hinnant's well-known method.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000) + nanos)
}

impl ContainerManager {
    /// Loads containers and repairs what a crash left (see the module doc).
    pub async fn open(
        store: Store,
        images: ImageManager,
        creator: Arc<ContainerCreator>,
        sandboxes: Arc<super::sandbox::SandboxManager>,
        state_dir: &std::path::Path,
        shim: PathBuf,
    ) -> Result<Arc<Self>, ContainerError> {
        let manager = Arc::new(Self {
            store,
            images,
            creator,
            sandboxes,
            state_dir: state_dir.to_owned(),
            shim,
            names: NameRegistry::new(),
            lock: tokio::sync::Mutex::new(()),
        });
        for rec in manager.records()? {
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
        }
        Ok(manager)
    }

    fn records(&self) -> Result<Vec<ContainerRecord>, ContainerError> {
        self.store
            .list_records(CONTAINERS)
            .map_err(|e| ContainerError::Internal(e.to_string()))
    }

    fn save(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        self.store
            .put_record(CONTAINERS, &rec.id, rec)
            .map_err(|e| ContainerError::Internal(format!("saving container {}: {e}", rec.id)))
    }

    fn delete(&self, id: &str) -> Result<(), ContainerError> {
        self.store
            .delete_record(CONTAINERS, id)
            .map_err(|e| ContainerError::Internal(format!("deleting container {id}: {e}")))
    }

    /// The container `id` (or a unique prefix).
    pub fn get(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        if id.is_empty() {
            return Err(ContainerError::NotFound("(empty id)".into()));
        }
        self.store
            .find_record(CONTAINERS, id, |r: &ContainerRecord| r.id.as_str())
            .map_err(|e| ContainerError::Internal(e.to_string()))?
            .ok_or_else(|| ContainerError::NotFound(id.to_string()))
    }

    /// CreateContainer: the first call's id for a retried request.
    pub async fn create(
        &self,
        req: &cri::CreateContainerRequest,
    ) -> Result<String, ContainerError> {
        let config = req.config.as_ref().ok_or_else(|| {
            CreateError::InvalidArgument("CreateContainer: config is missing".into())
        })?;
        let meta = config.metadata.clone().unwrap_or_default();
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
        let fingerprint = names::fingerprint(req);
        // The name first: a retry while the first call still prepares waits for its result
        // instead of preparing a second bundle.
        let new_id = crate::util::random_hex(32);
        let ticket = match self.names.reserve(&name, fingerprint, &new_id).await {
            Reservation::Existing(id) => return Ok(id),
            Reservation::Conflict { id } => return Err(ContainerError::NameInUse { name, id }),
            Reservation::New(t) => t,
        };
        // On any error below the ticket is dropped, which frees the name again.
        let target_pid_ns = self.target_pid_namespace(config).await?;
        let mut prepared = self.creator.create(&new_id, req, target_pid_ns).await?;
        let sandbox = match self.sandboxes.get(&req.pod_sandbox_id) {
            Ok(s) => s,
            Err(e) => {
                prepared.undo(&self.images);
                return Err(ContainerError::Internal(format!(
                    "CreateContainer: sandbox vanished: {e}"
                )));
            }
        };
        let log_dir = sandbox.config().log_directory;
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
        let rec = ContainerRecord {
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
            bundle,
            uid: user.uid,
            gid: user.gid,
            groups: user.supplemental_groups.clone(),
        };
        // No lock: nobody knows the new id before this call returns.
        let mut rec = rec;
        let made = async {
            self.save(&rec)?;
            self.spawn_shim(&rec, config).await?;
            rec.state = ContainerState::Created;
            self.save(&rec)
        }
        .await;
        match made {
            Ok(()) => {
                ticket.created();
                tracing::info!(container = %rec.id, "container created");
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
    async fn target_pid_namespace(
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
        let target = match self.get(&opts.target_id) {
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
        let state = ShimClient::new(&target.socket).state(SHIM_CALL).await;
        match state {
            Ok(s) if s.status == api::Status::Running as i32 && s.pid != 0 => {
                Ok(Some(PathBuf::from(format!("/proc/{}/ns/pid", s.pid))))
            }
            _ => Err(CreateError::FailedPrecondition(format!(
                "CreateContainer: PID namespace target container {} is not running",
                target.id
            ))
            .into()),
        }
    }

    async fn spawn_shim(
        &self,
        rec: &ContainerRecord,
        config: &cri::ContainerConfig,
    ) -> Result<(), ContainerError> {
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
        Ok(())
    }

    /// StartContainer.
    pub async fn start(&self, id: &str) -> Result<(), ContainerError> {
        let mut rec = self.get(id)?;
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
            .await?;
        rec.state = ContainerState::Running;
        rec.started_at = started_at;
        self.save(&rec)?;
        Ok(())
    }

    /// Brings a record up to date with its shim (or its exit file when the shim is gone).
    pub async fn refresh(&self, mut rec: ContainerRecord) -> ContainerRecord {
        if rec.state != ContainerState::Running && rec.state != ContainerState::Created {
            return rec;
        }
        let exit = match ShimClient::new(&rec.socket)
            .state(Duration::from_secs(2))
            .await
        {
            Ok(s) if s.status == api::Status::Stopped as i32 => s.exit.map(|e| ExitInfo {
                exit_code: e.exit_code,
                finished_at: parse_rfc3339_utc(&e.exited_at)
                    .unwrap_or_else(crate::util::unix_nanos_now),
                reason: e.reason,
            }),
            Ok(_) => None,
            Err(ShimError::Unavailable { .. }) => Some(self.exit_from_file(&rec)),
            Err(e) => {
                tracing::warn!(container = %rec.id, error = %e, "shim did not answer; reporting the last known state");
                None
            }
        };
        if let Some(exit) = exit {
            rec.state = ContainerState::Exited;
            rec.exit = Some(exit);
            // Saved only while the record exists: a concurrent remove must not be undone.
            let _guard = self.lock.lock().await;
            match self.get(&rec.id) {
                Ok(_) => {
                    if let Err(e) = self.save(&rec) {
                        tracing::warn!(container = %rec.id, error = %e, "saving exit");
                    }
                }
                Err(ContainerError::NotFound(_)) => {}
                Err(e) => tracing::warn!(container = %rec.id, error = %e, "saving exit"),
            }
        }
        rec
    }

    fn exit_from_file(&self, rec: &ContainerRecord) -> ExitInfo {
        match std::fs::read(&rec.exit_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<ExitFile>(&b).ok())
        {
            Some(f) => ExitInfo {
                exit_code: f.exit_code,
                finished_at: parse_rfc3339_utc(&f.exited_at)
                    .unwrap_or_else(crate::util::unix_nanos_now),
                reason: f.reason,
            },
            None => ExitInfo {
                exit_code: 255,
                finished_at: crate::util::unix_nanos_now(),
                reason: "Unknown".into(),
            },
        }
    }

    /// StopContainer: the stop signal, then SIGKILL after `timeout`; unknown or exited is fine.
    pub async fn stop(&self, id: &str, timeout: i64) -> Result<(), ContainerError> {
        let rec = match self.get(id) {
            Ok(r) => self.refresh(r).await,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        if rec.state != ContainerState::Running && rec.state != ContainerState::Created {
            return Ok(());
        }
        let shim = ShimClient::new(&rec.socket);
        let wait = |ms: u64| api::request::Request::Wait(api::WaitRequest { timeout_ms: ms });
        if timeout > 0 {
            shim.call(
                api::request::Request::Kill(api::KillRequest {
                    signal: libc::SIGTERM as u32,
                    all: false,
                }),
                SHIM_CALL,
            )
            .await?;
            let ms = (timeout as u64).saturating_mul(1000);
            if let Ok(api::response::Result::Wait(w)) = shim
                .call(wait(ms), Duration::from_millis(ms) + SHIM_CALL)
                .await
                && w.exited
            {
                self.refresh(rec).await;
                return Ok(());
            }
        }
        shim.call(
            api::request::Request::Kill(api::KillRequest {
                signal: libc::SIGKILL as u32,
                all: true,
            }),
            SHIM_CALL,
        )
        .await?;
        shim.call(wait(10_000), Duration::from_secs(15)).await?;
        self.refresh(rec).await;
        Ok(())
    }

    /// RemoveContainer: kills it if running, deletes everything; unknown is fine.
    pub async fn remove(&self, id: &str) -> Result<(), ContainerError> {
        let rec = match self.get(id) {
            Ok(r) => r,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        // The shim call may be slow (a hung shim): only the record change holds the lock.
        self.teardown(&rec).await;
        let _guard = self.lock.lock().await;
        self.delete(&rec.id)?;
        self.names.release(&rec.name, &rec.id);
        Ok(())
    }

    /// Removes the shim (kill + delete), the rootfs mount, the snapshot and the bundle.
    async fn teardown(&self, rec: &ContainerRecord) {
        self.release_shim(rec).await;
        let mut prepared = Prepared {
            id: rec.id.clone(),
            snapshot: (!rec.snapshot.is_empty()).then(|| rec.snapshot.clone()),
            rootfs_mounted: Some(rec.bundle.join("rootfs")),
            bundle: Some(rec.bundle.clone()),
            ..Default::default()
        };
        prepared.undo(&self.images);
    }

    /// Deletes the container through its shim (or, with no shim to answer, kills what runs in
    /// its cgroup and removes the cgroup), and removes the shim's socket.
    async fn release_shim(&self, rec: &ContainerRecord) {
        let socket = rec.socket.clone();
        // Delete through the shim; a gone shim is fine.
        let deleted = ShimClient::new(&socket)
            .call(
                api::request::Request::Delete(api::DeleteRequest {}),
                Duration::from_secs(10),
            )
            .await;
        if deleted.is_err() {
            // No shim to do it (crashed, or never started): whatever runs in the container's
            // cgroup is killed and the cgroup removed here.
            if let Some(cgroup) = bundle_cgroup(&rec.bundle)
                && let Ok(layout) = super::cgroups::Layout::detect()
            {
                super::cgroups::kill_and_remove(&layout, &cgroup);
            }
        }
        let _ = std::fs::remove_file(&socket);
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
        let rec = self.refresh(self.get(id)?).await;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "ExecSync: container {} is not running",
                rec.id
            )));
        }
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
        match ShimClient::new(&rec.socket).call(request, deadline).await? {
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
        let rec = self.refresh(self.get(id)?).await;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "ReopenContainerLog: container {} is not running",
                rec.id
            )));
        }
        ShimClient::new(&rec.socket)
            .call(
                api::request::Request::ReopenLog(api::ReopenLogRequest {}),
                SHIM_CALL,
            )
            .await?;
        Ok(())
    }

    /// Ids of the containers of sandbox `sandbox_id` (exact id).
    pub fn in_sandbox(&self, sandbox_id: &str) -> Result<Vec<String>, ContainerError> {
        Ok(self
            .records()?
            .into_iter()
            .filter(|r| r.sandbox_id == sandbox_id)
            .map(|r| r.id)
            .collect())
    }

    /// ContainerStatus.
    pub async fn status(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        let rec = self.get(id)?;
        Ok(self.refresh(rec).await)
    }

    /// ListContainers (each refreshed with a short deadline; a hung shim does not block).
    pub async fn list(
        &self,
        filter: Option<&cri::ContainerFilter>,
    ) -> Result<Vec<ContainerRecord>, ContainerError> {
        let mut wanted = Vec::new();
        for rec in self.records()? {
            if rec.state == ContainerState::Creating {
                continue;
            }
            if let Some(f) = filter {
                if !f.id.is_empty() && !rec.id.starts_with(&f.id) {
                    continue;
                }
                if !f.pod_sandbox_id.is_empty() && !rec.sandbox_id.starts_with(&f.pod_sandbox_id) {
                    continue;
                }
                let labels: HashMap<String, String> = rec.config().labels;
                if !f
                    .label_selector
                    .iter()
                    .all(|(k, v)| labels.get(k) == Some(v))
                {
                    continue;
                }
            }
            wanted.push(rec);
        }
        // Shims are asked at once: one slow or hung shim costs one deadline, not one each.
        let refreshed =
            futures_util::future::join_all(wanted.into_iter().map(|r| self.refresh(r))).await;
        Ok(refreshed
            .into_iter()
            .filter(|rec| {
                filter
                    .and_then(|f| f.state.as_ref())
                    .is_none_or(|state| cri_state(rec.state) == state.state)
            })
            .collect())
    }

    /// Every stored container as last saved (stats must not wait on shims).
    pub(crate) fn stored(&self) -> Result<Vec<ContainerRecord>, ContainerError> {
        self.records()
    }

    /// Saves a record changed in `container_update.rs`.
    pub(crate) fn save_record(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        self.save(rec)
    }

    /// Serialises with create and remove (for `container_update.rs`).
    pub(crate) async fn lock_records(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }
}

/// `linux.cgroupsPath` of the OCI spec in `bundle`.
fn bundle_cgroup(bundle: &std::path::Path) -> Option<String> {
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    let path = spec["linux"]["cgroupsPath"].as_str()?;
    // Only a cgroup Berth named for a container (never a pod's or the root).
    let leaf = path.rsplit('/').next().unwrap_or_default();
    leaf.starts_with("berth-").then(|| path.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_to_unix_nanos() {
        assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_utc("1970-01-01T00:00:01.5Z"),
            Some(1_500_000_000)
        );
        assert_eq!(
            parse_rfc3339_utc("2026-11-29T12:00:00.000000001Z"),
            Some(1_795_953_600_000_000_001)
        );
        assert_eq!(parse_rfc3339_utc("garbage"), None);
    }

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
