//! Generation of a container's OCI runtime spec (config.json) from a CRI CreateContainer request.
//!
//! Everything is built explicitly: oci-spec's `Spec::default()` adds inheritable and ambient
//! capabilities, a cgroup namespace and no seccomp, none of which Berth wants.
//!
//! Not covered here, on purpose:
//! - Image volumes (`Volumes` in the image config) get no mount: the path stays part of the
//!   container's writable rootfs (containerd's `ignore` mode). They are still parsed. (CRI
//!   mounts of an image, `Mount.image`, are bound read-only from the host directory the
//!   caller mounted for them: [`SpecInput::image_volumes`].)
//! - rlimits: none are set; the container inherits the shim's.
//! - SELinux labels are not applied: on a host without SELinux `selinux_options` is ignored
//!   (as containerd and CRI-O ignore it there); where SELinux is enabled it is refused.
//! - Missing CRI mount host paths are not created here: the caller creates them (as directories)
//!   before it starts the container, so a failed create leaves nothing behind.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDevice,
    LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxHugepageLimitBuilder, LinuxIdMappingBuilder, LinuxMemoryBuilder, LinuxNamespace,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder, LinuxSeccomp, Mount,
    MountBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::spec_seccomp;
pub use super::spec_user::EffectiveUser;
use super::spec_user::{UserRequest, resolve_user};

/// Environment PATH used when neither the image nor the request sets one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// containerd's default capability set.
pub const DEFAULT_CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// Every capability oci-spec knows, granted to privileged containers.
pub const ALL_CAPABILITIES: &[Capability] = &[
    Capability::AuditControl,
    Capability::AuditRead,
    Capability::AuditWrite,
    Capability::BlockSuspend,
    Capability::Bpf,
    Capability::CheckpointRestore,
    Capability::Chown,
    Capability::DacOverride,
    Capability::DacReadSearch,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::IpcLock,
    Capability::IpcOwner,
    Capability::Kill,
    Capability::Lease,
    Capability::LinuxImmutable,
    Capability::MacAdmin,
    Capability::MacOverride,
    Capability::Mknod,
    Capability::NetAdmin,
    Capability::NetBindService,
    Capability::NetBroadcast,
    Capability::NetRaw,
    Capability::Perfmon,
    Capability::Setgid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::Setuid,
    Capability::SysAdmin,
    Capability::SysBoot,
    Capability::SysChroot,
    Capability::SysModule,
    Capability::SysNice,
    Capability::SysPacct,
    Capability::SysPtrace,
    Capability::SysRawio,
    Capability::SysResource,
    Capability::SysTime,
    Capability::SysTtyConfig,
    Capability::Syslog,
    Capability::WakeAlarm,
];

/// Paths masked (bind of /dev/null or an empty ro tmpfs) in unprivileged containers.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths made read-only in unprivileged containers.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Annotation keys containerd sets and tools (crictl, cAdvisor, NRI plugins) read.
pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const ANNOTATION_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Why a spec could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The request is wrong: maps to gRPC InvalidArgument. `field` names the CRI field.
    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// The sandbox lacks something the request needs (e.g. a pinned namespace):
    /// maps to FailedPrecondition.
    #[error("sandbox has no {0}")]
    SandboxMissing(&'static str),
    /// The host cannot give what the request asks for (a security profile it does not have):
    /// maps to FailedPrecondition.
    #[error("{0}")]
    Unsupported(String),
    /// Reading the rootfs or a host device failed.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// oci-spec refused to build a value (a bug here rather than bad input).
    #[error("building the OCI spec: {0}")]
    Oci(#[from] oci_spec::OciSpecError),
}

impl SpecError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// True if the error is the caller's fault (gRPC InvalidArgument).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, SpecError::InvalidArgument { .. })
    }
}

/// The parts of an OCI image config that shape a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `KEY=VALUE` entries in image order.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    pub stop_signal: String,
    /// Declared volumes; Berth mounts nothing for them (see the module doc).
    pub volumes: Vec<String>,
}

/// Files and namespaces the sandbox provides. `None` for a namespace means the host's one
/// (NODE mode), or that the sandbox has none of that kind.
#[derive(Clone, Debug, Default)]
pub struct SandboxPaths {
    pub hosts: Option<PathBuf>,
    pub resolv_conf: Option<PathBuf>,
    pub hostname: Option<PathBuf>,
    /// Directory bind-mounted at /dev/shm; `None` → a private 64 MiB tmpfs.
    pub shm: Option<PathBuf>,
    pub net_ns: Option<PathBuf>,
    pub ipc_ns: Option<PathBuf>,
    pub uts_ns: Option<PathBuf>,
    /// The pod's shared PID namespace (PID mode POD).
    pub pid_ns: Option<PathBuf>,
    /// PID namespace of the target container (PID mode TARGET).
    pub target_pid_ns: Option<PathBuf>,
    /// The pod's own user namespace and its id mappings (user namespace mode POD).
    pub user_ns: Option<(PathBuf, super::userns::PodIds)>,
}

/// Everything `generate` needs.
pub struct SpecInput<'a> {
    pub container_id: &'a str,
    pub sandbox_id: &'a str,
    pub config: &'a cri::ContainerConfig,
    pub sandbox: &'a cri::PodSandboxConfig,
    pub image: &'a ImageConfig,
    /// The container's mounted rootfs (its /etc/passwd and /etc/group are read).
    pub rootfs: &'a Path,
    pub sandbox_paths: &'a SandboxPaths,
    /// The pod's cgroup path, e.g. /kubepods/burstable/pod<uid> (see
    /// [`super::cgroup_driver::CgroupDriver::pod_cgroup`]).
    pub cgroup_parent: &'a str,
    /// How the container's cgroup is named and made.
    pub cgroup_driver: super::cgroup_driver::CgroupDriver,
    /// berthd's own oom_score_adj: never generate a lower one.
    pub runtime_oom_score_adj: i32,
    /// (host file, container path) of the termination message file, created by the caller.
    /// Skipped when a CRI mount already targets that container path.
    pub termination_message: Option<(&'a Path, &'a Path)>,
    /// Host directories of image volumes, by index in `config.mounts`: each is the image's
    /// read-only rootfs (or its sub path), mounted by the caller.
    pub image_volumes: &'a HashMap<usize, PathBuf>,
    /// Capabilities the runtime itself may grant (its bounding set); `None`: every known one.
    /// "ALL" and privileged mean these, and a requested capability outside them is dropped.
    pub host_capabilities: Option<&'a HashSet<Capability>>,
    /// Whether the host has the hugetlb cgroup controller (see
    /// [`super::cgroups::hugepage_limits_for_host`]).
    pub hugetlb: bool,
    /// The host's AppArmor: the profile the container asks for is checked against it.
    pub apparmor: &'a super::apparmor::Host,
    /// Whether SELinux is enabled on the host ([`host_has_selinux`]).
    pub selinux: bool,
}

/// Reads the fields Berth uses from an OCI image config blob (`{"config": {...}}`).
pub fn parse_image_config(config_json: &serde_json::Value) -> ImageConfig {
    let c = config_json
        .get("config")
        .filter(|v| v.is_object())
        .unwrap_or(config_json);
    let strings = |key: &str| -> Vec<String> {
        c.get(key)
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let string = |key: &str| -> String {
        c.get(key)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let mut volumes: Vec<String> = c
        .get("Volumes")
        .and_then(|v| v.as_object())
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    volumes.sort();
    ImageConfig {
        entrypoint: strings("Entrypoint"),
        cmd: strings("Cmd"),
        env: strings("Env"),
        working_dir: string("WorkingDir"),
        user: string("User"),
        stop_signal: string("StopSignal"),
        volumes,
    }
}

/// Generates the OCI spec of a container, and the user it will run as.
pub fn generate(input: &SpecInput<'_>) -> Result<(Spec, EffectiveUser), SpecError> {
    let config = input.config;
    let linux = config.linux.clone().unwrap_or_default();
    let sc = linux.security_context.clone().unwrap_or_default();
    let ns_opts = sc.namespace_options.clone().unwrap_or_default();
    let privileged = sc.privileged;

    let args = process_args(config, input.image)?;
    let user = resolve_user(
        input.rootfs,
        &UserRequest {
            run_as_user: sc.run_as_user.map(|v| v.value),
            run_as_username: &sc.run_as_username,
            run_as_group: sc.run_as_group.map(|v| v.value),
            image_user: &input.image.user,
            supplemental_groups: &sc.supplemental_groups,
            strict: sc.supplemental_groups_policy == cri::SupplementalGroupsPolicy::Strict as i32,
            image_name: config.image.as_ref().map_or("", |i| i.image.as_str()),
        },
    )?;

    let caps = capabilities(&sc, input.host_capabilities)?;
    let cap_set: HashSet<Capability> = caps.iter().copied().collect();
    let resources = linux.resources.clone().unwrap_or_default();
    let oom_score_adj = oom_score_adj(resources.oom_score_adj, input.runtime_oom_score_adj)?;

    let process = ProcessBuilder::default()
        .terminal(config.tty)
        .args(args)
        .env(environment(input))
        .cwd(working_dir(config, input.image)?)
        .user(
            UserBuilder::default()
                .uid(user.uid)
                .gid(user.gid)
                .additional_gids(user.supplemental_groups.clone())
                .build()?,
        )
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(cap_set.clone())
                .effective(cap_set.clone())
                .permitted(cap_set.clone())
                .inheritable(HashSet::new())
                .ambient(HashSet::new())
                .build()?,
        )
        .oom_score_adj(oom_score_adj)
        .build()?;
    let apparmor_profile = input.apparmor.profile_for(&sc)?;
    if let Some(o) = sc.selinux_options.as_ref().filter(|_| input.selinux)
        && [&o.user, &o.role, &o.r#type, &o.level]
            .iter()
            .any(|f| !f.is_empty())
    {
        return Err(SpecError::Unsupported(format!(
            "selinux_options (user {:?}, role {:?}, type {:?}, level {:?}): SELinux is enabled on this host and Berth does not apply SELinux labels",
            o.user, o.role, o.r#type, o.level
        )));
    }
    // The builders fill unset fields from oci-spec's `Default` impls (rlimits NOFILE=1024,
    // no_new_privileges true, hostname "youki", ...): clear those explicitly.
    let mut process = process;
    process.set_rlimits(None);
    process.set_apparmor_profile(apparmor_profile);
    // Unset rather than `false`: libcontainer loads a seccomp filter before it drops
    // capabilities only when no_new_privileges is absent (without it, loading a filter needs
    // CAP_SYS_ADMIN, which most containers no longer hold at that point).
    process.set_no_new_privileges(sc.no_new_privs.then_some(true));

    // A private cgroup namespace on pure cgroup v2 hosts (as containerd and CRI-O give one):
    // /sys/fs/cgroup then shows the container's own cgroup as its root. Privileged containers
    // and cgroup v1 (or hybrid) hosts keep the host's.
    let private_cgroup = !privileged && host_is_cgroup_v2();
    let namespaces = namespaces(&ns_opts, input.sandbox_paths, private_cgroup)?;
    let has_uts = namespaces
        .iter()
        .any(|n| n.typ() == LinuxNamespaceType::Uts);
    let ipc_private = ns_opts.ipc == cri::NamespaceMode::Container as i32;

    let (mounts, rootfs_propagation) = mounts(input, privileged, sc.readonly_rootfs, ipc_private)?;
    let (devices, device_rules) = devices(config, privileged)?;

    let mut linux_builder = LinuxBuilder::default()
        .namespaces(namespaces)
        .cgroups_path(PathBuf::from(
            input
                .cgroup_driver
                .container_cgroups_path(input.cgroup_parent, input.container_id),
        ))
        .resources(resources_spec(&resources, device_rules, input.hugetlb)?)
        .devices(devices)
        .sysctl(
            input
                .sandbox
                .linux
                .as_ref()
                .map(|l| l.sysctls.clone())
                .unwrap_or_default(),
        );
    if !privileged {
        linux_builder = linux_builder
            .masked_paths(merge_paths(DEFAULT_MASKED_PATHS, &sc.masked_paths))
            .readonly_paths(merge_paths(DEFAULT_READONLY_PATHS, &sc.readonly_paths));
        if let Some(seccomp) = seccomp(&sc, &cap_set)? {
            linux_builder = linux_builder.seccomp(seccomp);
        }
    } else {
        linux_builder = linux_builder
            .masked_paths(Vec::new())
            .readonly_paths(Vec::new());
    }
    if let Some(p) = rootfs_propagation {
        linux_builder = linux_builder.rootfs_propagation(p);
    }
    if let Some((_, ids)) = &input.sandbox_paths.user_ns {
        // The namespace is joined by path; the mappings say what it maps.
        let map = |r: &super::userns::IdRange| {
            LinuxIdMappingBuilder::default()
                .container_id(r.container_id)
                .host_id(r.host_id)
                .size(r.length)
                .build()
        };
        linux_builder = linux_builder
            .uid_mappings(vec![map(&ids.uids)?])
            .gid_mappings(vec![map(&ids.gids)?]);
    }

    let spec_builder = SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(input.rootfs)
                .readonly(sc.readonly_rootfs)
                .build()?,
        )
        .mounts(mounts)
        .process(process)
        .annotations(annotations(input))
        .linux(linux_builder.build()?);
    let mut spec = spec_builder.build()?;
    spec.set_hostname(
        (has_uts && !input.sandbox.hostname.is_empty()).then(|| input.sandbox.hostname.clone()),
    );
    Ok((spec, user))
}

/// Kubernetes' rule: `command` replaces the image Entrypoint and drops its Cmd; `args` alone
/// replace the Cmd and keep the Entrypoint.
fn process_args(
    config: &cri::ContainerConfig,
    image: &ImageConfig,
) -> Result<Vec<String>, SpecError> {
    let mut command = config.command.clone();
    let mut args = config.args.clone();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd.clone();
        }
        if !(image.entrypoint.len() == 1 && image.entrypoint[0].is_empty()) {
            command = image.entrypoint.clone();
        }
    }
    command.extend(args);
    if command.is_empty() {
        return Err(SpecError::invalid(
            "command",
            "no command specified and the image has no Entrypoint or Cmd",
        ));
    }
    Ok(command)
}

/// PATH and HOSTNAME defaults, then the image's env, then the request's; a later key wins in place.
fn environment(input: &SpecInput<'_>) -> Vec<String> {
    let mut env: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
    if !input.sandbox.hostname.is_empty() {
        env.push(("HOSTNAME".into(), input.sandbox.hostname.clone()));
    }
    let mut set = |k: &str, v: &str| {
        if k.is_empty() {
            return;
        }
        match env.iter_mut().find(|(key, _)| key == k) {
            Some(entry) => entry.1 = v.to_string(),
            None => env.push((k.to_string(), v.to_string())),
        }
    };
    for e in &input.image.env {
        let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
        set(k, v);
    }
    for kv in &input.config.envs {
        set(&kv.key, &kv.value);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn working_dir(config: &cri::ContainerConfig, image: &ImageConfig) -> Result<PathBuf, SpecError> {
    if !config.working_dir.is_empty() {
        let p = PathBuf::from(&config.working_dir);
        if !p.is_absolute() {
            return Err(SpecError::invalid(
                "working_dir",
                format!("{:?} is not an absolute path", config.working_dir),
            ));
        }
        return Ok(p);
    }
    if !image.working_dir.is_empty() {
        return Ok(Path::new("/").join(&image.working_dir));
    }
    Ok(PathBuf::from("/"))
}

fn parse_capability(name: &str, field: &str) -> Result<Capability, SpecError> {
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| SpecError::invalid(field, format!("unknown capability {name:?}")))
}

/// Capability numbers (linux/capability.h) of the capabilities oci-spec knows.
const CAPABILITY_BITS: &[(u32, Capability)] = &[
    (0, Capability::Chown),
    (1, Capability::DacOverride),
    (2, Capability::DacReadSearch),
    (3, Capability::Fowner),
    (4, Capability::Fsetid),
    (5, Capability::Kill),
    (6, Capability::Setgid),
    (7, Capability::Setuid),
    (8, Capability::Setpcap),
    (9, Capability::LinuxImmutable),
    (10, Capability::NetBindService),
    (11, Capability::NetBroadcast),
    (12, Capability::NetAdmin),
    (13, Capability::NetRaw),
    (14, Capability::IpcLock),
    (15, Capability::IpcOwner),
    (16, Capability::SysModule),
    (17, Capability::SysRawio),
    (18, Capability::SysChroot),
    (19, Capability::SysPtrace),
    (20, Capability::SysPacct),
    (21, Capability::SysAdmin),
    (22, Capability::SysBoot),
    (23, Capability::SysNice),
    (24, Capability::SysResource),
    (25, Capability::SysTime),
    (26, Capability::SysTtyConfig),
    (27, Capability::Mknod),
    (28, Capability::Lease),
    (29, Capability::AuditWrite),
    (30, Capability::AuditControl),
    (31, Capability::Setfcap),
    (32, Capability::MacOverride),
    (33, Capability::MacAdmin),
    (34, Capability::Syslog),
    (35, Capability::WakeAlarm),
    (36, Capability::BlockSuspend),
    (37, Capability::AuditRead),
    (38, Capability::Perfmon),
    (39, Capability::Bpf),
    (40, Capability::CheckpointRestore),
];

/// The capabilities of a `CapBnd:` hex mask from /proc/<pid>/status.
pub fn capabilities_from_mask(mask: u64) -> HashSet<Capability> {
    CAPABILITY_BITS
        .iter()
        .filter(|(bit, _)| mask & (1u64 << bit) != 0)
        .map(|(_, c)| *c)
        .collect()
}

/// This process's bounding set (what the containers it starts can hold at most); `None` if
/// /proc/self/status cannot be read.
pub fn host_capabilities() -> Option<HashSet<Capability>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))?
        .trim();
    u64::from_str_radix(hex, 16)
        .ok()
        .map(capabilities_from_mask)
}

/// The bounding/effective/permitted set: containerd's defaults, then add (ALL), drop (ALL).
/// "ALL" and privileged mean every capability the host allows; a named capability outside the
/// host's bounding set is dropped with a warning (the kernel would refuse the whole set).
fn capabilities(
    sc: &cri::LinuxContainerSecurityContext,
    host: Option<&HashSet<Capability>>,
) -> Result<Vec<Capability>, SpecError> {
    let all = || -> Vec<Capability> {
        ALL_CAPABILITIES
            .iter()
            .copied()
            .filter(|c| host.is_none_or(|h| h.contains(c)))
            .collect()
    };
    if sc.privileged {
        return Ok(all());
    }
    let empty = cri::Capability::default();
    let req = sc.capabilities.as_ref().unwrap_or(&empty);
    if !req.add_ambient_capabilities.is_empty() {
        tracing::warn!(
            caps = ?req.add_ambient_capabilities,
            "ambient capabilities are not supported; ignored"
        );
    }
    let is_all = |s: &String| s.eq_ignore_ascii_case("ALL");
    let mut caps: Vec<Capability> = if req.add_capabilities.iter().any(is_all) {
        all()
    } else {
        DEFAULT_CAPABILITIES.to_vec()
    };
    if req.drop_capabilities.iter().any(is_all) {
        caps.clear();
    }
    for name in req.add_capabilities.iter().filter(|s| !is_all(s)) {
        let cap = parse_capability(name, "capabilities.add_capabilities")?;
        if host.is_some_and(|h| !h.contains(&cap)) {
            tracing::warn!(capability = %name, "not in the runtime's bounding set; not granted");
            continue;
        }
        if !caps.contains(&cap) {
            caps.push(cap);
        }
    }
    for name in req.drop_capabilities.iter().filter(|s| !is_all(s)) {
        let cap = parse_capability(name, "capabilities.drop_capabilities")?;
        caps.retain(|c| *c != cap);
    }
    Ok(caps)
}

fn oom_score_adj(requested: i64, runtime: i32) -> Result<i32, SpecError> {
    if !(-1000..=1000).contains(&requested) {
        return Err(SpecError::invalid(
            "resources.oom_score_adj",
            format!("{requested} is outside [-1000, 1000]"),
        ));
    }
    let requested = requested as i32;
    if requested < runtime {
        tracing::warn!(
            requested,
            runtime,
            "oom_score_adj below berthd's own cannot be set; clamped"
        );
        return Ok(runtime);
    }
    Ok(requested)
}

fn ns(typ: LinuxNamespaceType, path: Option<&Path>) -> Result<LinuxNamespace, SpecError> {
    let b = LinuxNamespaceBuilder::default().typ(typ);
    Ok(match path {
        Some(p) => b.path(p).build()?,
        None => b.build()?,
    })
}

/// Whether SELinux is enabled on the host (its filesystem is mounted).
pub fn host_has_selinux() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| Path::new("/sys/fs/selinux/enforce").exists())
}

/// Whether `/sys/fs/cgroup` is itself the cgroup v2 hierarchy (a pure v2 host), as
/// libcontainer decides which cgroup filesystem to mount in the container. A hybrid host, with
/// cgroup2 at `/sys/fs/cgroup/unified`, is not.
pub fn host_is_cgroup_v2() -> bool {
    const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;
    static V2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V2.get_or_init(|| {
        rustix::fs::statfs("/sys/fs/cgroup")
            .is_ok_and(|st| u64::try_from(st.f_type).is_ok_and(|t| t == CGROUP2_SUPER_MAGIC))
    })
}

/// Mount ns always new; a new cgroup ns when `private_cgroup`, else the host's;
/// network/pid/ipc per NamespaceOption (NODE → host's, POD → the sandbox's pinned one,
/// CONTAINER → new; network has no CONTAINER mode and joins the pod's); UTS follows network.
fn namespaces(
    opts: &cri::NamespaceOption,
    paths: &SandboxPaths,
    private_cgroup: bool,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    use cri::NamespaceMode as M;
    let mut out = vec![ns(LinuxNamespaceType::Mount, None)?];
    // The user namespace first: the others are the pod's, owned by it.
    if let Some((path, _)) = &paths.user_ns {
        out.push(ns(LinuxNamespaceType::User, Some(path))?);
    }
    let join = |typ, mode: i32, path: &Option<PathBuf>, what: &'static str| {
        if mode == M::Node as i32 {
            Ok(None)
        } else if mode == M::Container as i32 && typ != LinuxNamespaceType::Network {
            ns(typ, None).map(Some)
        } else {
            match path {
                Some(p) => ns(typ, Some(p)).map(Some),
                None => Err(SpecError::SandboxMissing(what)),
            }
        }
    };
    if let Some(n) = join(
        LinuxNamespaceType::Network,
        opts.network,
        &paths.net_ns,
        "network namespace",
    )? {
        out.push(n);
    }
    if let Some(n) = join(
        LinuxNamespaceType::Ipc,
        opts.ipc,
        &paths.ipc_ns,
        "IPC namespace",
    )? {
        out.push(n);
    }
    // CRI has no UTS option: a host-network pod uses the host's UTS namespace.
    if let Some(n) = join(
        LinuxNamespaceType::Uts,
        if opts.network == M::Node as i32 {
            M::Node as i32
        } else {
            M::Pod as i32
        },
        &paths.uts_ns,
        "UTS namespace",
    )? {
        out.push(n);
    }
    let pid = if opts.pid == M::Target as i32 {
        match &paths.target_pid_ns {
            Some(p) => Some(ns(LinuxNamespaceType::Pid, Some(p))?),
            None => {
                return Err(SpecError::invalid(
                    "namespace_options.target_id",
                    format!("no PID namespace known for target {:?}", opts.target_id),
                ));
            }
        }
    } else {
        join(
            LinuxNamespaceType::Pid,
            opts.pid,
            &paths.pid_ns,
            "PID namespace",
        )?
    };
    if let Some(n) = pid {
        out.push(n);
    }
    if private_cgroup {
        out.push(ns(LinuxNamespaceType::Cgroup, None)?);
    }
    Ok(out)
}

fn merge_paths(defaults: &[&str], extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = defaults.iter().map(|s| (*s).to_string()).collect();
    for p in extra {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

fn seccomp(
    sc: &cri::LinuxContainerSecurityContext,
    caps: &HashSet<Capability>,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    use cri::security_profile::ProfileType;
    if let Some(profile) = &sc.seccomp {
        return match ProfileType::try_from(profile.profile_type) {
            Ok(ProfileType::RuntimeDefault) => spec_seccomp::runtime_default(caps).map(Some),
            Ok(ProfileType::Unconfined) => Ok(None),
            Ok(ProfileType::Localhost) => {
                spec_seccomp::load_localhost(&profile.localhost_ref, "seccomp.localhost_ref")
                    .map(Some)
            }
            Err(_) => Err(SpecError::invalid(
                "seccomp.profile_type",
                format!("unknown profile type {}", profile.profile_type),
            )),
        };
    }
    #[allow(deprecated)]
    let legacy = sc.seccomp_profile_path.as_str();
    match legacy {
        "" | "unconfined" => Ok(None),
        "runtime/default" | "docker/default" => spec_seccomp::runtime_default(caps).map(Some),
        other => match other.strip_prefix("localhost/") {
            Some(path) => spec_seccomp::load_localhost(path, "seccomp_profile_path").map(Some),
            None => Err(SpecError::invalid(
                "seccomp_profile_path",
                format!("unknown seccomp profile {other:?}"),
            )),
        },
    }
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
        .build()?)
}

fn bind(dest: &Path, source: &Path, options: Vec<String>) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(dest)
        .typ("bind")
        .source(source)
        .options(options)
        .build()?)
}

/// Lexically normalised absolute path (no `.`, `..` resolved, no trailing slash).
fn clean_abs(p: &str) -> Option<PathBuf> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    Some(out)
}

type Mounts = (Vec<Mount>, Option<String>);

/// An image volume (a CRI mount with `image` set) is read-only, has no host path, and takes
/// no propagation other than private.
pub fn check_image_volume(m: &cri::Mount, field: &dyn Fn(&str) -> String) -> Result<(), SpecError> {
    if !m.host_path.is_empty() {
        return Err(SpecError::invalid(
            field("host_path"),
            "an image volume mount takes no host_path",
        ));
    }
    if !m.readonly {
        return Err(SpecError::invalid(
            field("readonly"),
            "image volume mounts are read-only: readonly must be true",
        ));
    }
    if m.propagation != cri::MountPropagation::PropagationPrivate as i32 {
        return Err(SpecError::invalid(
            field("propagation"),
            "image volume mounts take private propagation only",
        ));
    }
    Ok(())
}

/// Default mounts, sandbox files, the termination message file and the CRI mounts, in that
/// order (CRI mounts sorted parents first). A default mount at or under a CRI mount's
/// destination is dropped. Also returns the rootfs propagation the CRI mounts need.
fn mounts(
    input: &SpecInput<'_>,
    privileged: bool,
    readonly_rootfs: bool,
    ipc_private: bool,
) -> Result<Mounts, SpecError> {
    use cri::MountPropagation as P;
    let mut cri_mounts: Vec<(PathBuf, Mount)> = Vec::new();
    let mut propagation: Option<String> = None;
    for (i, m) in input.config.mounts.iter().enumerate() {
        let field = |f: &str| format!("mounts[{i}].{f}");
        let dest = clean_abs(&m.container_path).ok_or_else(|| {
            SpecError::invalid(
                field("container_path"),
                format!("{:?} is not an absolute path", m.container_path),
            )
        })?;
        if m.image.as_ref().is_some_and(|i| !i.image.is_empty()) {
            check_image_volume(m, &field)?;
            let source = input.image_volumes.get(&i).ok_or_else(|| {
                SpecError::invalid(field("image"), "image volume was not prepared")
            })?;
            let options = vec!["rbind".into(), "rprivate".into(), "ro".into()];
            cri_mounts.push((dest.clone(), bind(&dest, source, options)?));
            continue;
        }
        if !Path::new(&m.host_path).is_absolute() {
            return Err(SpecError::invalid(
                field("host_path"),
                format!("{:?} is not an absolute path", m.host_path),
            ));
        }
        let mode = match P::try_from(m.propagation) {
            Ok(P::PropagationPrivate) => "rprivate",
            Ok(P::PropagationHostToContainer) => {
                if propagation.is_none() {
                    propagation = Some("slave".into());
                }
                "rslave"
            }
            Ok(P::PropagationBidirectional) => {
                propagation = Some("shared".into());
                "rshared"
            }
            Err(_) => {
                return Err(SpecError::invalid(
                    field("propagation"),
                    format!("unknown propagation {}", m.propagation),
                ));
            }
        };
        let mut options = vec!["rbind".to_string(), mode.to_string()];
        if m.recursive_read_only {
            if !m.readonly {
                return Err(SpecError::invalid(
                    field("recursive_read_only"),
                    "requires readonly",
                ));
            }
            if mode != "rprivate" {
                return Err(SpecError::invalid(
                    field("recursive_read_only"),
                    "requires private propagation",
                ));
            }
            // "rro": the runtime applies MOUNT_ATTR_RDONLY with AT_RECURSIVE (mount_setattr)
            // so submounts of the host path are read-only too.
            options.push("rro".into());
        }
        options.push(if m.readonly { "ro" } else { "rw" }.into());
        let mount = bind(&dest, Path::new(&m.host_path), options)?;
        cri_mounts.push((dest, mount));
    }
    cri_mounts.sort_by_key(|(d, _)| d.components().count());
    let covered = |dest: &str| {
        let d = Path::new(dest);
        cri_mounts.iter().any(|(c, _)| d.starts_with(c))
    };

    let sys_mode = if privileged { "rw" } else { "ro" };
    let mut out = Vec::new();
    let defaults = [
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        // A sysfs is mounted for the network namespace the process is in, which its user
        // namespace must own: a pod with its own user namespace on the host's network gets
        // the host's /sys bound instead, read-only unless privileged.
        if input.sandbox_paths.user_ns.is_some() && input.sandbox_paths.net_ns.is_none() {
            bind(
                Path::new("/sys"),
                Path::new("/sys"),
                ["rbind", "nosuid", "noexec", "nodev", sys_mode]
                    .map(String::from)
                    .to_vec(),
            )?
        } else {
            mount(
                "/sys",
                "sysfs",
                "sysfs",
                &["nosuid", "noexec", "nodev", sys_mode],
            )?
        },
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", sys_mode],
        )?,
    ];
    for m in defaults {
        if !covered(&m.destination().to_string_lossy()) {
            out.push(m);
        }
    }
    if !covered("/dev/shm") {
        match (&input.sandbox_paths.shm, ipc_private) {
            (Some(shm), false) => out.push(bind(
                Path::new("/dev/shm"),
                shm,
                vec!["rbind".into(), "rprivate".into(), "rw".into()],
            )?),
            _ => out.push(mount(
                "/dev/shm",
                "tmpfs",
                "shm",
                &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            )?),
        }
    }
    let file_mode = if readonly_rootfs { "ro" } else { "rw" };
    for (dest, src) in [
        ("/etc/hosts", &input.sandbox_paths.hosts),
        ("/etc/resolv.conf", &input.sandbox_paths.resolv_conf),
        ("/etc/hostname", &input.sandbox_paths.hostname),
    ] {
        if let Some(src) = src
            && !covered(dest)
        {
            out.push(bind(
                Path::new(dest),
                src,
                vec!["rbind".into(), "rprivate".into(), file_mode.into()],
            )?);
        }
    }
    if let Some((host, dest)) = input.termination_message {
        let dest_s = dest.to_string_lossy();
        let clean = clean_abs(&dest_s).ok_or_else(|| {
            SpecError::invalid(
                "termination_message_path",
                format!("{dest_s:?} is not an absolute path"),
            )
        })?;
        if !cri_mounts.iter().any(|(d, _)| *d == clean) {
            out.push(bind(
                &clean,
                host,
                vec!["rbind".into(), "rprivate".into(), "rw".into()],
            )?);
        }
    }
    out.extend(cri_mounts.into_iter().map(|(_, m)| m));
    Ok((out, propagation))
}

/// Type, major, minor, permission bits, uid and gid of a device node.
pub(crate) type DeviceInfo = (LinuxDeviceType, i64, i64, u32, u32, u32);

pub(crate) fn device_type_and_numbers(path: &Path) -> std::io::Result<Option<DeviceInfo>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path)?;
    let ft = meta.file_type();
    let typ = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else {
        return Ok(None);
    };
    let rdev = meta.rdev();
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff);
    Ok(Some((
        typ,
        major as i64,
        minor as i64,
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
    )))
}

fn device_node(dest: &Path, host: &Path) -> Result<Option<LinuxDevice>, SpecError> {
    let info = device_type_and_numbers(host).map_err(|source| SpecError::Io {
        path: host.to_path_buf(),
        source,
    })?;
    let Some((typ, major, minor, mode, uid, gid)) = info else {
        return Ok(None);
    };
    Ok(Some(
        LinuxDeviceBuilder::default()
            .path(dest)
            .typ(typ)
            .major(major)
            .minor(minor)
            .file_mode(mode)
            .uid(uid)
            .gid(gid)
            .build()?,
    ))
}

pub(crate) fn allow_rule(
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> Result<LinuxDeviceCgroup, SpecError> {
    let mut b = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .access(access);
    if let Some(t) = typ {
        b = b.typ(t);
    }
    if let Some(m) = major {
        b = b.major(m);
    }
    if let Some(m) = minor {
        b = b.minor(m);
    }
    Ok(b.build()?)
}

/// Device nodes to create and the device-cgroup rules: deny all, allow the standard
/// pseudo-devices, then each requested device with its permissions (all for privileged).
fn devices(
    config: &cri::ContainerConfig,
    privileged: bool,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), SpecError> {
    let c = Some(LinuxDeviceType::C);
    let mut rules = vec![
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()?,
    ];
    for (major, minor) in [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)] {
        rules.push(allow_rule(c, Some(major), Some(minor), "rwm")?);
    }
    rules.push(allow_rule(c, Some(136), None, "rwm")?);
    let mut nodes = Vec::new();
    if privileged {
        rules.push(allow_rule(Some(LinuxDeviceType::A), None, None, "rwm")?);
        host_devices(Path::new("/dev"), Path::new("/dev"), &mut nodes, 0)?;
    }
    for (i, d) in config.devices.iter().enumerate() {
        let perms = if d.permissions.is_empty() {
            "rwm"
        } else {
            d.permissions.as_str()
        };
        if !perms.chars().all(|ch| matches!(ch, 'r' | 'w' | 'm')) {
            return Err(SpecError::invalid(
                format!("devices[{i}].permissions"),
                format!("{perms:?} is not a subset of \"rwm\""),
            ));
        }
        let dest = clean_abs(if d.container_path.is_empty() {
            &d.host_path
        } else {
            &d.container_path
        })
        .ok_or_else(|| {
            SpecError::invalid(
                format!("devices[{i}].container_path"),
                format!("{:?} is not an absolute path", d.container_path),
            )
        })?;
        let host = Path::new(&d.host_path);
        let field = format!("devices[{i}].host_path");
        let is_dir = std::fs::metadata(host)
            .map_err(|e| SpecError::invalid(field.clone(), format!("{}: {e}", d.host_path)))?
            .is_dir();
        let found = if is_dir {
            // A directory of devices (e.g. /dev/snd): every node under it.
            let mut found = Vec::new();
            host_devices(host, &dest, &mut found, 0)?;
            found
        } else {
            match device_node(&dest, host) {
                Ok(Some(node)) => vec![node],
                Ok(None) => Vec::new(),
                Err(e) => return Err(SpecError::invalid(field, e.to_string())),
            }
        };
        if found.is_empty() {
            return Err(SpecError::invalid(
                field,
                format!("{} is not a device or a directory of devices", d.host_path),
            ));
        }
        for node in found {
            rules.push(allow_rule(
                Some(node.typ()),
                Some(node.major()),
                Some(node.minor()),
                perms,
            )?);
            nodes.retain(|n: &LinuxDevice| n.path() != node.path());
            nodes.push(node);
        }
    }
    Ok((nodes, rules))
}

/// Every device node under `host_dir`, created at the same relative path under `dest_dir`.
/// At the top of /dev the pts, shm, mqueue and fd trees are skipped, as are /dev/console,
/// symlinks and unreadable entries.
fn host_devices(
    host_dir: &Path,
    dest_dir: &Path,
    out: &mut Vec<LinuxDevice>,
    depth: usize,
) -> Result<(), SpecError> {
    if depth > 8 {
        return Ok(());
    }
    let Ok(entries) = std::fs::read_dir(host_dir) else {
        return Ok(());
    };
    let at_dev_root = depth == 0 && host_dir == Path::new("/dev");
    for entry in entries.flatten() {
        let path = entry.path();
        let dest = dest_dir.join(entry.file_name());
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            let name = entry.file_name();
            if at_dev_root && matches!(name.to_str(), Some("pts" | "shm" | "mqueue" | "fd")) {
                continue;
            }
            host_devices(&path, &dest, out, depth + 1)?;
        } else if !ft.is_symlink()
            && path != Path::new("/dev/console")
            && let Ok(Some(node)) = device_node(&dest, &path)
        {
            out.push(node);
        }
    }
    Ok(())
}

fn resources_spec(
    r: &cri::LinuxContainerResources,
    devices: Vec<LinuxDeviceCgroup>,
    hugetlb: bool,
) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let mut cpu = LinuxCpuBuilder::default();
    let mut any_cpu = false;
    if r.cpu_shares < 0 {
        return Err(SpecError::invalid(
            "resources.cpu_shares",
            format!("{} is negative", r.cpu_shares),
        ));
    }
    if r.cpu_shares > 0 {
        cpu = cpu.shares(r.cpu_shares as u64);
        any_cpu = true;
    }
    if r.cpu_period != 0 {
        if !(1_000..=1_000_000).contains(&r.cpu_period) {
            return Err(SpecError::invalid(
                "resources.cpu_period",
                format!("{} is outside [1000, 1000000] µs", r.cpu_period),
            ));
        }
        cpu = cpu.period(r.cpu_period as u64);
        any_cpu = true;
    }
    if r.cpu_quota != 0 {
        if r.cpu_quota != -1 && r.cpu_quota < 1_000 {
            return Err(SpecError::invalid(
                "resources.cpu_quota",
                format!("{} is below 1000 µs (and not -1)", r.cpu_quota),
            ));
        }
        cpu = cpu.quota(r.cpu_quota);
        any_cpu = true;
    }
    for (field, value) in [
        ("resources.cpuset_cpus", &r.cpuset_cpus),
        ("resources.cpuset_mems", &r.cpuset_mems),
    ] {
        if !value
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == '-')
        {
            return Err(SpecError::invalid(
                field,
                format!("{value:?} is not a CPU/node list"),
            ));
        }
    }
    if !r.cpuset_cpus.is_empty() {
        cpu = cpu.cpus(r.cpuset_cpus.clone());
        any_cpu = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu = cpu.mems(r.cpuset_mems.clone());
        any_cpu = true;
    }

    let mut mem = LinuxMemoryBuilder::default();
    let mut any_mem = false;
    if r.memory_limit_in_bytes < 0 {
        return Err(SpecError::invalid(
            "resources.memory_limit_in_bytes",
            format!("{} is negative", r.memory_limit_in_bytes),
        ));
    }
    if r.memory_limit_in_bytes > 0 {
        mem = mem.limit(r.memory_limit_in_bytes);
        any_mem = true;
    }
    if let Some(bound) = super::container_update::swap_bound_from_unified(
        r.memory_limit_in_bytes,
        r.memory_swap_limit_in_bytes,
        &r.unified,
    ) {
        mem = mem.swap(bound);
        any_mem = true;
    }
    match r.memory_swap_limit_in_bytes {
        // Memory plus swap is bounded only with memory bounded: without a memory limit the
        // setting is dropped, as containerd does (libcontainer refuses swap without a limit
        // on cgroup v2, and v1 takes a memsw limit only at or above the memory limit).
        0 => {}
        _ if r.memory_limit_in_bytes == 0 => {}
        -1 => {
            mem = mem.swap(-1);
            any_mem = true;
        }
        s if s < 0 => {
            return Err(SpecError::invalid(
                "resources.memory_swap_limit_in_bytes",
                format!("{s} is negative (and not -1)"),
            ));
        }
        s => {
            if r.memory_limit_in_bytes > 0 && s < r.memory_limit_in_bytes {
                return Err(SpecError::invalid(
                    "resources.memory_swap_limit_in_bytes",
                    format!(
                        "{s} is below memory_limit_in_bytes {} (it counts memory plus swap)",
                        r.memory_limit_in_bytes
                    ),
                ));
            }
            mem = mem.swap(s);
            any_mem = true;
        }
    }

    let limits = super::cgroups::hugepage_limits_for_host(&r.hugepage_limits, hugetlb)
        .map_err(|(field, why)| SpecError::invalid(format!("resources.{field}"), why))?;
    let mut hugepages = Vec::new();
    for (i, h) in limits.iter().enumerate() {
        if h.page_size.is_empty() {
            return Err(SpecError::invalid(
                format!("resources.hugepage_limits[{i}].page_size"),
                "empty",
            ));
        }
        let limit = i64::try_from(h.limit).map_err(|_| {
            SpecError::invalid(
                format!("resources.hugepage_limits[{i}].limit"),
                format!("{} is too large", h.limit),
            )
        })?;
        hugepages.push(
            LinuxHugepageLimitBuilder::default()
                .page_size(h.page_size.clone())
                .limit(limit)
                .build()?,
        );
    }

    let mut b = LinuxResourcesBuilder::default().devices(devices);
    if any_cpu {
        b = b.cpu(cpu.build()?);
    }
    if any_mem {
        b = b.memory(mem.build()?);
    }
    if !hugepages.is_empty() {
        b = b.hugepage_limits(hugepages);
    }
    if !r.unified.is_empty() {
        // The same check as UpdateContainerResources: libcontainer joins each key to the
        // container's cgroup directory and writes the value there.
        super::container_update::check_unified(&r.unified)
            .map_err(|e| SpecError::invalid(format!("resources.unified[{:?}]", e.key), e.reason))?;
        b = b.unified(r.unified.clone());
    }
    Ok(b.build()?)
}

fn annotations(input: &SpecInput<'_>) -> HashMap<String, String> {
    let mut a = HashMap::new();
    a.insert(ANNOTATION_CONTAINER_TYPE.into(), "container".into());
    a.insert(ANNOTATION_SANDBOX_ID.into(), input.sandbox_id.into());
    if let Some(m) = &input.config.metadata {
        a.insert(ANNOTATION_CONTAINER_NAME.into(), m.name.clone());
    }
    if let Some(img) = &input.config.image {
        a.insert(ANNOTATION_IMAGE_NAME.into(), img.image.clone());
    }
    if let Some(m) = &input.sandbox.metadata {
        a.insert(ANNOTATION_SANDBOX_NAME.into(), m.name.clone());
        a.insert(ANNOTATION_SANDBOX_NAMESPACE.into(), m.namespace.clone());
        a.insert(ANNOTATION_SANDBOX_UID.into(), m.uid.clone());
    }
    a
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "spec_tests.rs"]
mod tests;
