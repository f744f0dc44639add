//! CreateContainer's preparation: checks the sandbox and image, mounts the rootfs from a
//! snapshot of the image, generates and writes the OCI bundle; undoes all of it on failure.
//!
//! The container process itself is made by `berth-shim`, started by [`super::container`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_cri::v1 as cri;

use super::sandbox::{SandboxError, SandboxManager, SandboxState};
use super::spec::{self, SandboxPaths, SpecError, SpecInput};
use super::userns;
use crate::image::ImageManager;

#[path = "container_volumes.rs"]
pub mod volumes;

/// Why CreateContainer failed; each maps to one gRPC code in `cri/`.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Bad request.
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown sandbox or image.
    #[error("{0}")]
    NotFound(String),
    /// The sandbox is not ready.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Host trouble.
    #[error("{0}")]
    Internal(String),
}

impl CreateError {
    /// CreateContainer's error for a sandbox it cannot use: unknown, or a bad id.
    pub fn from_sandbox(e: SandboxError) -> Self {
        match e {
            SandboxError::NotFound(id) => {
                Self::NotFound(format!("CreateContainer: pod sandbox {id} not found"))
            }
            e => Self::InvalidArgument(format!("CreateContainer: {e}")),
        }
    }
}

/// What CreateContainer found before making anything: the PID namespace of a target container,
/// the CDI devices' edits.
#[derive(Clone, Copy)]
struct Resolved<'a> {
    target_pid_ns: &'a Option<PathBuf>,
    cdi: Option<&'a super::cdi::Injection>,
    extras: &'a CreateExtras,
}

/// What a CRI v0.34+ CreateContainer carries beyond k8s-cri's ContainerConfig.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateExtras {
    /// `stop_signal`: a CRI `Signal` value (0: the image's StopSignal or SIGTERM).
    pub stop_signal: i32,
    /// `mounts[i].image_sub_path`, by mount index (missing or empty: the image's root).
    pub image_sub_paths: Vec<String>,
}

/// Prepares containers.
pub struct ContainerCreator {
    images: ImageManager,
    sandboxes: Arc<SandboxManager>,
    root: PathBuf,
    cdi_spec_dirs: Vec<PathBuf>,
}

/// Everything a prepared container holds on the host, removed by [`Prepared::undo`].
#[derive(Debug, Default)]
pub struct Prepared {
    /// Container id.
    pub id: String,
    /// Snapshot key of the rootfs.
    pub snapshot: Option<String>,
    /// Where the rootfs is mounted.
    pub rootfs_mounted: Option<PathBuf>,
    /// The bundle directory (config.json, rootfs/).
    pub bundle: Option<PathBuf>,
    /// The user the process runs as (reported in ContainerStatus).
    pub user: Option<spec::EffectiveUser>,
    /// Image id.
    pub image_id: String,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Host directories created for CRI mounts whose host path was missing (removed again
    /// only by a failed create; a removed container leaves them, as the kubelet expects).
    pub created_host_dirs: Vec<PathBuf>,
    /// The image's `StopSignal`, as its config writes it (empty: none).
    pub image_stop_signal: String,
}

impl ContainerCreator {
    /// A creator writing bundles under `<root>/containers`, with CDI devices from the spec
    /// files of `cdi_spec_dirs`.
    pub fn new(
        images: ImageManager,
        sandboxes: Arc<SandboxManager>,
        root: &Path,
        cdi_spec_dirs: Vec<PathBuf>,
    ) -> Self {
        Self {
            images,
            sandboxes,
            root: root.to_owned(),
            cdi_spec_dirs,
        }
    }

    /// Deletes bundles a removal moved aside (`<root>/containers/rm-<id>`) and did not get to
    /// delete before berthd stopped, and detaches idmapped layer mounts a crash left while a
    /// user-namespaced container's rootfs was being mounted. Blocking.
    pub fn remove_leftovers(&self) {
        if let Ok(entries) = std::fs::read_dir(self.root.join(IDMAP_DIR)) {
            for entry in entries.flatten() {
                let path = entry.path();
                tracing::info!(path = %path.display(), "detaching idmapped layers left by a crash");
                let _ = rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH);
                let _ = std::fs::remove_dir(&path);
            }
        }
        let dir = self.root.join("containers");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(DOOMED_PREFIX)
            {
                let path = entry.path();
                tracing::info!(path = %path.display(), "deleting the bundle of a removed container");
                delete_dirs(vec![path]);
            }
        }
    }

    /// Removes bundles (with their mounts) and container snapshots that name no container in
    /// `known`: what a berthd killed while preparing a container left. Blocking.
    pub fn remove_unrecorded(
        &self,
        known: &std::collections::HashSet<String>,
    ) -> super::unrecorded::Swept {
        let mut swept = super::unrecorded::sweep_dirs(
            &self.root.join("containers"),
            known,
            &[DOOMED_PREFIX],
            "container bundle",
        );
        swept.snapshots = super::unrecorded::sweep_snapshots(&self.images, known);
        swept
    }

    /// Checks the request and prepares the bundle; on error nothing is left behind.
    /// `id` is the new container's (already reserved with its name); `target_pid_ns` is the
    /// PID namespace of the container PID mode TARGET names. Blocking (mounts, files): the
    /// caller runs it off the async workers.
    pub fn create(
        &self,
        id: &str,
        req: &cri::CreateContainerRequest,
        target_pid_ns: Option<PathBuf>,
        extras: &CreateExtras,
    ) -> Result<Prepared, CreateError> {
        let sandbox = self
            .sandboxes
            .get(&req.pod_sandbox_id)
            .map_err(CreateError::from_sandbox)?;
        if sandbox.state != SandboxState::Ready {
            return Err(CreateError::FailedPrecondition(format!(
                "CreateContainer: pod sandbox {} is not ready (stopped)",
                sandbox.id
            )));
        }
        let config = req.config.as_ref().ok_or_else(|| {
            CreateError::InvalidArgument("CreateContainer: config is missing".into())
        })?;
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or_default();
        if name.is_empty() {
            return Err(CreateError::InvalidArgument(
                "CreateContainer: config.metadata.name is empty".into(),
            ));
        }
        let image_ref = config
            .image
            .as_ref()
            .map(|i| i.image.as_str())
            .unwrap_or_default();
        if image_ref.is_empty() {
            return Err(CreateError::InvalidArgument(format!(
                "CreateContainer {name}: config.image is empty"
            )));
        }
        let image = self
            .images
            .status(image_ref)
            .map_err(|e| CreateError::InvalidArgument(format!("CreateContainer {name}: {e}")))?
            .ok_or_else(|| {
                CreateError::NotFound(format!(
                    "CreateContainer {name}: image {image_ref} not found"
                ))
            })?;
        // Resolved before anything is made: an unknown device leaves nothing behind.
        let cdi = super::cdi::resolve(config, &self.cdi_spec_dirs).map_err(|e| match e {
            e @ super::cdi::CdiError::Resolve(_) => {
                CreateError::InvalidArgument(format!("CreateContainer {name}: {e}"))
            }
            e => CreateError::FailedPrecondition(format!("CreateContainer {name}: {e}")),
        })?;
        let id = id.to_string();
        let mut prepared = Prepared {
            id: id.clone(),
            image_id: image.record.id.clone(),
            sandbox_id: sandbox.id.clone(),
            ..Default::default()
        };
        match self.prepare(
            &sandbox,
            req,
            config,
            &image.record,
            &mut prepared,
            &Resolved {
                target_pid_ns: &target_pid_ns,
                cdi: cdi.as_ref(),
                extras,
            },
        ) {
            Ok(()) => Ok(prepared),
            Err(e) => {
                prepared.undo(&self.images);
                Err(e)
            }
        }
    }

    fn prepare(
        &self,
        sandbox: &super::sandbox::SandboxRecord,
        req: &cri::CreateContainerRequest,
        config: &cri::ContainerConfig,
        image: &crate::store::ImageRecord,
        prepared: &mut Prepared,
        resolved: &Resolved<'_>,
    ) -> Result<(), CreateError> {
        let Resolved {
            target_pid_ns,
            cdi,
            extras,
        } = *resolved;
        let id = &prepared.id.clone();
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            CreateError::Internal(format!("CreateContainer {id}: {what}: {e}"))
        };
        let pod_userns = pod_user_namespace(sandbox, config)?;
        // Root's alone (the rootfs holds the image's setuid files), or the pod root's when
        // the container's process walks to its rootfs from inside the pod's user namespace.
        let bundle = self.root.join("containers").join(id);
        prepared.bundle = Some(bundle.clone());
        super::dir_modes::ensure_owned(
            &bundle,
            pod_userns.as_ref().map(|(_, ids)| ids.root_on_host()),
        )
        .and_then(|()| std::fs::create_dir_all(bundle.join("rootfs")))
        .map_err(|e| internal("creating the bundle", &e))?;
        let snapshots = self.images.snapshotter();
        let key = format!("container-{id}");
        let parent = image.chain_ids.last().map(String::as_str);
        let mounts = snapshots
            .prepare(&key, parent, Default::default())
            .map_err(|e| internal("preparing the rootfs snapshot", &e))?;
        prepared.snapshot = Some(key);
        let rootfs = bundle.join("rootfs");
        match &pod_userns {
            None => {
                for m in &mounts {
                    m.mount(&rootfs)
                        .map_err(|e| internal("mounting the rootfs", &e))?;
                    prepared.rootfs_mounted = Some(rootfs.clone());
                }
            }
            Some((fd, ids)) => {
                userns::check_reachable(&rootfs, ids.root_on_host().0).map_err(|e| {
                    CreateError::FailedPrecondition(format!("CreateContainer: {e}"))
                })?;
                let scratch = self.root.join("idmap").join(&id[..12.min(id.len())]);
                prepared.rootfs_mounted = Some(rootfs.clone());
                userns::mount_rootfs(
                    &mounts,
                    snapshots.snapshots_dir(),
                    fd,
                    ids,
                    &rootfs,
                    &scratch,
                )
                .map_err(|e| internal("mounting the rootfs", &e))?;
            }
        }
        prepared.created_host_dirs = volumes::create_missing_host_paths(config)?;
        volumes::ensure_host_propagation(config)?;
        let image_volumes = volumes::prepare_image_volumes(
            &self.images,
            id,
            &bundle,
            config,
            &extras.image_sub_paths,
        )?;
        let termination = volumes::prepare_termination_log(&bundle, config)?;
        let image_config = self
            .images
            .config_json(image)
            .map(|v| spec::parse_image_config(&v))
            .unwrap_or_default();
        prepared.image_stop_signal = image_config.stop_signal.clone();
        let sandbox_config = sandbox.config();
        let paths = SandboxPaths {
            hosts: Some(sandbox.file("hosts")),
            resolv_conf: Some(sandbox.file("resolv.conf")),
            hostname: Some(sandbox.file("hostname")),
            shm: sandbox.shm.clone(),
            net_ns: sandbox.net_ns.clone(),
            ipc_ns: sandbox.ipc_ns.clone(),
            uts_ns: sandbox.uts_ns.clone(),
            pid_ns: sandbox.pid_ns.clone().filter(|p| p.exists()),
            target_pid_ns: target_pid_ns.clone(),
            user_ns: sandbox.user_ns.clone().zip(sandbox.user_ids),
        };
        let own_oom = std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let host_caps = spec::host_capabilities();
        let config = &effective_namespaces(config, &paths);
        let input = SpecInput {
            container_id: id,
            sandbox_id: &req.pod_sandbox_id,
            config,
            sandbox: &sandbox_config,
            image: &image_config,
            rootfs: &rootfs,
            sandbox_paths: &paths,
            cgroup_parent: &sandbox.cgroup_parent,
            cgroup_driver: super::cgroup_driver::current(),
            runtime_oom_score_adj: own_oom,
            termination_message: termination
                .as_ref()
                .map(|(host, dest)| (host.as_path(), dest.as_path())),
            image_volumes: &image_volumes,
            host_capabilities: host_caps.as_ref(),
            hugetlb: super::cgroups::host_has_hugetlb(),
            apparmor: super::apparmor::host(),
            selinux: spec::host_has_selinux(),
        };
        let name = config.metadata.as_ref().map_or("", |m| m.name.as_str());
        let (mut oci, user) = spec::generate(&input).map_err(|e| match e {
            e @ SpecError::InvalidArgument { .. } => {
                CreateError::InvalidArgument(format!("CreateContainer {name}: {e}"))
            }
            e @ SpecError::SandboxMissing(_) => {
                CreateError::FailedPrecondition(format!("CreateContainer: {e}"))
            }
            e @ SpecError::Unsupported(_) => {
                CreateError::FailedPrecondition(format!("CreateContainer {name}: {e}"))
            }
            e => internal("generating the OCI spec", &e),
        })?;
        if let Some(cdi) = cdi {
            cdi.apply(&mut oci).map_err(|e| {
                CreateError::FailedPrecondition(format!("CreateContainer {name}: {e}"))
            })?;
        }
        if let Some((fd, ids)) = &pod_userns {
            check_user_mapped(&user, ids)?;
            if let Some((host, _)) = &termination {
                let (uid, gid) = ids.root_on_host();
                std::os::unix::fs::chown(host, Some(uid), Some(gid))
                    .map_err(|e| internal("giving the termination log to the pod's root", &e))?;
            }
            let mut mounts = oci.mounts().clone().unwrap_or_default();
            let mut own = vec![sandbox.dir.as_path()];
            own.extend(termination.as_ref().map(|(host, _)| host.as_path()));
            userns::stage_binds(&mut mounts, &bundle, &own, fd)
                .map_err(|e| internal("idmapping bind mounts", &e))?;
            oci.set_mounts(Some(mounts));
        }
        oci.save(bundle.join("config.json"))
            .map_err(|e| internal("writing config.json", &e))?;
        prepared.user = Some(user);
        Ok(())
    }
}

/// The pod's user namespace (opened) and its mappings when the pod has its own; a container
/// that asks for another user namespace than its pod's is refused.
fn pod_user_namespace(
    sandbox: &super::sandbox::SandboxRecord,
    config: &cri::ContainerConfig,
) -> Result<Option<(std::os::fd::OwnedFd, userns::PodIds)>, CreateError> {
    let asked = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref());
    if let Some(asked) = asked {
        let wanted = userns::from_cri(Some(asked))
            .map_err(|e| CreateError::InvalidArgument(format!("CreateContainer: {e}")))?;
        if wanted != sandbox.user_ids {
            return Err(CreateError::InvalidArgument(format!(
                "CreateContainer: the container's user namespace options differ from those of its pod sandbox {}",
                sandbox.id
            )));
        }
    }
    match (&sandbox.user_ns, sandbox.user_ids) {
        (Some(path), Some(ids)) => {
            let fd = userns::open(path).map_err(|e| {
                CreateError::FailedPrecondition(format!(
                    "CreateContainer: pod sandbox {}: {e}",
                    sandbox.id
                ))
            })?;
            Ok(Some((fd, ids)))
        }
        _ => Ok(None),
    }
}

/// The container's user and groups must exist in its pod's user namespace.
fn check_user_mapped(user: &spec::EffectiveUser, ids: &userns::PodIds) -> Result<(), CreateError> {
    let unmapped = |what: &str, id: u32| {
        CreateError::InvalidArgument(format!(
            "CreateContainer: {what} {id} is not mapped in the pod's user namespace (container ids 0-{})",
            ids.uids.length.min(ids.gids.length).saturating_sub(1)
        ))
    };
    if ids.uids.to_host(user.uid).is_none() {
        return Err(unmapped("user", user.uid));
    }
    if ids.gids.to_host(user.gid).is_none() {
        return Err(unmapped("group", user.gid));
    }
    if let Some(g) = user
        .supplemental_groups
        .iter()
        .find(|g| ids.gids.to_host(**g).is_none())
    {
        return Err(unmapped("supplemental group", *g));
    }
    Ok(())
}

/// POD namespace modes follow the sandbox: a pod on the host's network or IPC makes its
/// containers' POD mode the host's. POD PID mode joins the pod's shared PID namespace when
/// the sandbox made one (it asked for POD PID mode too, as the kubelet always does);
/// otherwise the container gets its own.
fn effective_namespaces(
    config: &cri::ContainerConfig,
    paths: &SandboxPaths,
) -> cri::ContainerConfig {
    let mut config = config.clone();
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    let ns = sc.namespace_options.get_or_insert_with(Default::default);
    let pod = cri::NamespaceMode::Pod as i32;
    if ns.network == pod && paths.net_ns.is_none() {
        ns.network = cri::NamespaceMode::Node as i32;
    }
    if ns.ipc == pod && paths.ipc_ns.is_none() {
        ns.ipc = cri::NamespaceMode::Node as i32;
    }
    if ns.pid == pod && paths.pid_ns.is_none() {
        tracing::warn!("the pod has no shared PID namespace: the container gets its own");
        ns.pid = cri::NamespaceMode::Container as i32;
    }
    config
}

/// Unmounts a container's rootfs; not mounted (EINVAL) or not there at all is fine.
pub(super) fn unmount_rootfs(rootfs: &std::path::Path) -> Result<(), berth_snapshotter::Error> {
    match berth_snapshotter::unmount(rootfs) {
        Err(berth_snapshotter::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound
                || source.raw_os_error() == Some(libc::EINVAL) =>
        {
            tracing::debug!(rootfs = %rootfs.display(), "rootfs was not mounted");
            Ok(())
        }
        other => other,
    }
}

/// Where a user-namespaced container's image layers are attached, idmapped, while its rootfs
/// overlay is mounted (`<root>/idmap/<id prefix>`).
const IDMAP_DIR: &str = "idmap";

/// Prefix of a removed container's bundle, moved aside until it is deleted.
const DOOMED_PREFIX: &str = "rm-";

/// Deletes directories [`Prepared::detach`] moved aside; what fails is logged.
pub fn delete_dirs(dirs: Vec<PathBuf>) {
    for dir in dirs {
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %dir.display(), error = %e, "deleting a removed container's files");
        }
    }
}

impl Prepared {
    /// Unmounts the rootfs and image volumes, removes the snapshots and the bundle. Idempotent:
    /// what is already gone is skipped (logged at debug), only a real failure warns.
    pub fn undo(&mut self, images: &ImageManager) {
        delete_dirs(self.detach(images));
    }

    /// [`Prepared::undo`] up to deleting directories: the snapshot's record goes, its directory
    /// and the bundle are moved aside, and their new paths are returned for [`delete_dirs`]
    /// (which the snapshotter's and the creator's start-up clean-up also do, should berthd stop
    /// first).
    pub fn detach(&mut self, images: &ImageManager) -> Vec<PathBuf> {
        let mut doomed = Vec::new();
        if let Some(bundle) = &self.bundle
            && !self.id.is_empty()
        {
            userns::release_binds(bundle);
            volumes::undo_image_volumes(images, &self.id, bundle);
        }
        if let Some(rootfs) = self.rootfs_mounted.take()
            && let Err(e) = unmount_rootfs(&rootfs)
        {
            tracing::warn!(rootfs = %rootfs.display(), error = %e, "unmounting rootfs");
        }
        if let Some(key) = self.snapshot.take() {
            match images.snapshotter().detach(&key) {
                Ok(dir) => doomed.extend(dir),
                Err(berth_snapshotter::Error::NotFound(_)) => {
                    tracing::debug!(snapshot = %key, "container snapshot already removed");
                }
                Err(e) => {
                    tracing::warn!(snapshot = %key, error = %e, "removing container snapshot")
                }
            }
        }
        if let Some(bundle) = self.bundle.take() {
            let aside = bundle.file_name().map(|name| {
                bundle.with_file_name(format!("{DOOMED_PREFIX}{}", name.to_string_lossy()))
            });
            match aside.map(|aside| std::fs::rename(&bundle, &aside).map(|()| aside)) {
                Some(Ok(aside)) => doomed.push(aside),
                Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    tracing::debug!(bundle = %bundle.display(), "bundle already removed");
                }
                // Not movable (or no name): deleted where it is.
                _ => doomed.push(bundle),
            }
        }
        // Deepest first; only while empty (the container may have written into them).
        for dir in self.created_host_dirs.drain(..).rev() {
            let _ = std::fs::remove_dir(&dir);
        }
        doomed
    }
}
