//! Unit tests of OCI spec generation.

use super::*;
use oci_spec::runtime::{LinuxSeccompAction, Process};

fn rootfs(tag: &str) -> crate::util::ScratchDir {
    let dir = crate::util::ScratchDir::new(&format!("spec-{tag}"));
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/group"),
        "root:x:0:\nwheel:x:10:app\napp:x:1000:\n",
    )
    .unwrap();
    dir
}

fn sandbox_paths() -> SandboxPaths {
    SandboxPaths {
        hosts: Some("/run/berth/sb/hosts".into()),
        resolv_conf: Some("/run/berth/sb/resolv.conf".into()),
        hostname: Some("/run/berth/sb/hostname".into()),
        shm: Some("/run/berth/sb/shm".into()),
        net_ns: Some("/run/berth/sb/ns/net".into()),
        ipc_ns: Some("/run/berth/sb/ns/ipc".into()),
        uts_ns: Some("/run/berth/sb/ns/uts".into()),
        pid_ns: Some("/run/berth/sb/ns/pid".into()),
        target_pid_ns: None,
        user_ns: None,
    }
}

fn sandbox() -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web-pod".into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config() -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "docker.io/library/busybox:1.36".into(),
            ..Default::default()
        }),
        linux: Some(cri::LinuxContainerConfig {
            resources: None,
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Pod as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

fn image() -> ImageConfig {
    ImageConfig {
        entrypoint: vec!["/entry".into()],
        cmd: vec!["serve".into(), "--port=80".into()],
        env: vec!["PATH=/img/bin".into(), "A=image".into(), "B=image".into()],
        working_dir: "/srv".into(),
        ..Default::default()
    }
}

struct Fixture {
    config: cri::ContainerConfig,
    sandbox: cri::PodSandboxConfig,
    image: ImageConfig,
    paths: SandboxPaths,
    rootfs: crate::util::ScratchDir,
    runtime_oom: i32,
    termination: Option<(PathBuf, PathBuf)>,
    image_volumes: HashMap<usize, PathBuf>,
    host_caps: Option<HashSet<Capability>>,
    hugetlb: bool,
    apparmor: crate::runtime::apparmor::Host,
    selinux: bool,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        Fixture {
            config: config(),
            sandbox: sandbox(),
            image: image(),
            paths: sandbox_paths(),
            rootfs: rootfs(tag),
            runtime_oom: -999,
            termination: None,
            image_volumes: HashMap::new(),
            host_caps: None,
            hugetlb: true,
            apparmor: crate::runtime::apparmor::Host::disabled(),
            selinux: false,
        }
    }

    fn sc(&mut self) -> &mut cri::LinuxContainerSecurityContext {
        self.config
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
    }

    fn ns(&mut self) -> &mut cri::NamespaceOption {
        self.sc().namespace_options.as_mut().unwrap()
    }

    fn resources(&mut self) -> &mut cri::LinuxContainerResources {
        self.config
            .linux
            .as_mut()
            .unwrap()
            .resources
            .get_or_insert_with(Default::default)
    }

    fn run(&self) -> Result<(Spec, EffectiveUser), SpecError> {
        generate(&SpecInput {
            container_id: "c1",
            sandbox_id: "s1",
            config: &self.config,
            sandbox: &self.sandbox,
            image: &self.image,
            rootfs: &self.rootfs,
            sandbox_paths: &self.paths,
            cgroup_parent: "/kubepods/burstable/poduid-1",
            cgroup_driver: crate::runtime::cgroup_driver::CgroupDriver::Cgroupfs,
            runtime_oom_score_adj: self.runtime_oom,
            termination_message: self
                .termination
                .as_ref()
                .map(|(h, c)| (h.as_path(), c.as_path())),
            image_volumes: &self.image_volumes,
            host_capabilities: self.host_caps.as_ref(),
            hugetlb: self.hugetlb,
            apparmor: &self.apparmor,
            selinux: self.selinux,
        })
    }

    fn spec(&self) -> Spec {
        self.run().unwrap().0
    }
}

fn process(spec: &Spec) -> &Process {
    spec.process().as_ref().unwrap()
}

fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
    spec.linux().as_ref().unwrap()
}

fn mount_at<'s>(spec: &'s Spec, dest: &str) -> Option<&'s Mount> {
    spec.mounts()
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.destination() == Path::new(dest))
}

fn options(m: &Mount) -> Vec<String> {
    m.options().clone().unwrap_or_default()
}

fn invalid(f: &Fixture, needle: &str) {
    let e = f.run().unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
    assert!(e.to_string().contains(needle), "{e} lacks {needle}");
}

#[test]
fn command_and_args_merge_like_kubernetes() {
    let mut f = Fixture::new("args");
    let args = |f: &Fixture| process(&f.spec()).args().clone().unwrap();
    assert_eq!(args(&f), ["/entry", "serve", "--port=80"]);
    f.config.args = vec!["run".into()];
    assert_eq!(args(&f), ["/entry", "run"]);
    f.config.command = vec!["/bin/sh".into()];
    f.config.args = vec![];
    assert_eq!(args(&f), ["/bin/sh"]);
    f.config.args = vec!["-c".into(), "true".into()];
    assert_eq!(args(&f), ["/bin/sh", "-c", "true"]);
    f.config.command.clear();
    f.config.args.clear();
    f.image.entrypoint = vec![String::new()];
    assert_eq!(args(&f), ["serve", "--port=80"]);
    f.image.cmd.clear();
    invalid(&f, "command");
}

#[test]
fn env_image_then_request_request_wins() {
    let mut f = Fixture::new("env");
    f.config.envs = vec![
        cri::KeyValue {
            key: "B".into(),
            value: "request".into(),
        },
        cri::KeyValue {
            key: "C".into(),
            value: "x=y".into(),
        },
    ];
    let env = process(&f.spec()).env().clone().unwrap();
    assert_eq!(
        env,
        [
            "PATH=/img/bin",
            "HOSTNAME=web-pod",
            "A=image",
            "B=request",
            "C=x=y"
        ]
    );
    f.image.env.clear();
    let env = process(&f.spec()).env().clone().unwrap();
    assert_eq!(env[0], format!("PATH={DEFAULT_PATH}"));
}

#[test]
fn working_dir_request_then_image_then_root() {
    let mut f = Fixture::new("cwd");
    assert_eq!(process(&f.spec()).cwd(), Path::new("/srv"));
    f.config.working_dir = "/work".into();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/work"));
    f.config.working_dir.clear();
    f.image.working_dir.clear();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/"));
    f.config.working_dir = "rel".into();
    invalid(&f, "working_dir");
}

#[test]
fn user_resolution_reaches_spec_and_effective_user() {
    let mut f = Fixture::new("user");
    f.image.user = "app".into();
    let (spec, user) = f.run().unwrap();
    assert_eq!((user.uid, user.gid), (1000, 1000));
    assert_eq!(user.supplemental_groups, vec![1000, 10]);
    let u = process(&spec).user();
    assert_eq!((u.uid(), u.gid()), (1000, 1000));
    assert_eq!(u.additional_gids().clone().unwrap(), vec![1000, 10]);

    f.sc().run_as_user = Some(cri::Int64Value { value: 0 });
    f.sc().run_as_group = Some(cri::Int64Value { value: 5 });
    f.sc().supplemental_groups = vec![7000];
    f.sc().supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
    let (_, user) = f.run().unwrap();
    assert_eq!(
        (user.uid, user.gid, user.supplemental_groups),
        (0, 5, vec![5, 7000])
    );

    f.sc().run_as_user = None;
    f.sc().run_as_username = "nosuchuser".into();
    invalid(&f, "run_as_username");
}

#[test]
fn hostname_only_with_a_uts_namespace() {
    let mut f = Fixture::new("hostname");
    assert_eq!(f.spec().hostname().as_deref(), Some("web-pod"));
    f.ns().network = cri::NamespaceMode::Node as i32;
    let spec = f.spec();
    assert_eq!(spec.hostname(), &None);
    let types: Vec<_> = linux(&spec)
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| n.typ())
        .collect();
    assert!(!types.contains(&LinuxNamespaceType::Uts));
    assert!(!types.contains(&LinuxNamespaceType::Network));
}

#[test]
fn default_and_sandbox_mounts() {
    let mut f = Fixture::new("mounts");
    f.termination = Some((
        "/var/lib/kubelet/pods/x/term".into(),
        "/dev/termination-log".into(),
    ));
    let spec = f.spec();
    let proc = mount_at(&spec, "/proc").unwrap();
    assert_eq!(proc.typ().as_deref(), Some("proc"));
    assert_eq!(
        mount_at(&spec, "/dev").unwrap().typ().as_deref(),
        Some("tmpfs")
    );
    assert_eq!(
        mount_at(&spec, "/dev/pts").unwrap().typ().as_deref(),
        Some("devpts")
    );
    assert_eq!(
        mount_at(&spec, "/dev/mqueue").unwrap().typ().as_deref(),
        Some("mqueue")
    );
    assert!(options(mount_at(&spec, "/sys").unwrap()).contains(&"ro".into()));
    assert!(options(mount_at(&spec, "/sys/fs/cgroup").unwrap()).contains(&"ro".into()));
    let shm = mount_at(&spec, "/dev/shm").unwrap();
    assert_eq!(
        shm.source().as_deref(),
        Some(Path::new("/run/berth/sb/shm"))
    );
    assert_eq!(shm.typ().as_deref(), Some("bind"));
    for (dest, src) in [
        ("/etc/hosts", "/run/berth/sb/hosts"),
        ("/etc/resolv.conf", "/run/berth/sb/resolv.conf"),
        ("/etc/hostname", "/run/berth/sb/hostname"),
        ("/dev/termination-log", "/var/lib/kubelet/pods/x/term"),
    ] {
        let m = mount_at(&spec, dest).unwrap();
        assert_eq!(m.source().as_deref(), Some(Path::new(src)));
        assert!(options(m).contains(&"rbind".into()));
    }
    // No sandbox shm, or a private IPC namespace: a private tmpfs.
    f.paths.shm = None;
    let spec = f.spec();
    assert_eq!(
        mount_at(&spec, "/dev/shm").unwrap().typ().as_deref(),
        Some("tmpfs")
    );
    f.paths.shm = Some("/run/berth/sb/shm".into());
    f.ns().ipc = cri::NamespaceMode::Container as i32;
    let spec = f.spec();
    assert_eq!(
        mount_at(&spec, "/dev/shm").unwrap().typ().as_deref(),
        Some("tmpfs")
    );
    // Read-only rootfs: the sandbox files are bound read-only too.
    f.sc().readonly_rootfs = true;
    let spec = f.spec();
    assert!(options(mount_at(&spec, "/etc/hosts").unwrap()).contains(&"ro".into()));
}

#[test]
fn cri_mounts_with_readonly_propagation_and_rro() {
    let mut f = Fixture::new("crimounts");
    f.config.mounts = vec![
        cri::Mount {
            container_path: "/data/sub".into(),
            host_path: "/srv/sub".into(),
            propagation: cri::MountPropagation::PropagationHostToContainer as i32,
            ..Default::default()
        },
        cri::Mount {
            container_path: "/data/".into(),
            host_path: "/srv/data".into(),
            readonly: true,
            recursive_read_only: true,
            selinux_relabel: true,
            ..Default::default()
        },
        cri::Mount {
            container_path: "/shared".into(),
            host_path: "/srv/shared".into(),
            propagation: cri::MountPropagation::PropagationBidirectional as i32,
            ..Default::default()
        },
        cri::Mount {
            container_path: "/etc/hosts".into(),
            host_path: "/var/lib/kubelet/etc-hosts".into(),
            ..Default::default()
        },
    ];
    let spec = f.spec();
    let data = mount_at(&spec, "/data").unwrap();
    assert_eq!(options(data), ["rbind", "rprivate", "rro", "ro"]);
    let sub = mount_at(&spec, "/data/sub").unwrap();
    assert_eq!(options(sub), ["rbind", "rslave", "rw"]);
    assert_eq!(
        options(mount_at(&spec, "/shared").unwrap()),
        ["rbind", "rshared", "rw"]
    );
    // libcontainer takes "shared"/"slave"/"private" for the rootfs (an "r" prefix is refused).
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("shared"));
    let mounts = spec.mounts().as_ref().unwrap();
    let pos = |d: &str| {
        mounts
            .iter()
            .position(|m| m.destination() == Path::new(d))
            .unwrap()
    };
    assert!(pos("/data") < pos("/data/sub"), "parents first");
    let hosts: Vec<_> = mounts
        .iter()
        .filter(|m| m.destination() == Path::new("/etc/hosts"))
        .collect();
    assert_eq!(hosts.len(), 1, "the CRI mount replaces the sandbox's hosts");
    assert_eq!(
        hosts[0].source().as_deref(),
        Some(Path::new("/var/lib/kubelet/etc-hosts"))
    );

    f.config.mounts[1].readonly = false;
    invalid(&f, "mounts[1].recursive_read_only");
    f.config.mounts[1].readonly = true;
    f.config.mounts[0].container_path = "relative/path".into();
    invalid(&f, "mounts[0].container_path");
    f.config.mounts = vec![f.config.mounts[0].clone()];
    f.config.mounts[0].container_path = "/data/sub".into();
    assert_eq!(
        linux(&f.spec()).rootfs_propagation().as_deref(),
        Some("slave")
    );
}

#[test]
fn image_volume_mounts() {
    let mut f = Fixture::new("imgvol");
    let image = Some(cri::ImageSpec {
        image: "busybox".into(),
        ..Default::default()
    });
    f.config.mounts = vec![cri::Mount {
        container_path: "/mnt/img".into(),
        readonly: true,
        image: image.clone(),
        ..Default::default()
    }];
    invalid(&f, "mounts[0].image");
    f.image_volumes
        .insert(0, PathBuf::from("/var/lib/berth/c1/imagevols/0"));
    let spec = f.spec();
    let m = mount_at(&spec, "/mnt/img").unwrap();
    assert_eq!(
        m.source().as_deref(),
        Some(Path::new("/var/lib/berth/c1/imagevols/0"))
    );
    assert_eq!(options(m), ["rbind", "rprivate", "ro"]);
    assert_eq!(m.typ().as_deref(), Some("bind"));
    f.config.mounts[0].readonly = false;
    invalid(&f, "mounts[0].readonly");
    f.config.mounts[0].readonly = true;
    f.config.mounts[0].host_path = "/srv".into();
    invalid(&f, "mounts[0].host_path");
    f.config.mounts[0].host_path = String::new();
    f.config.mounts[0].propagation = cri::MountPropagation::PropagationBidirectional as i32;
    invalid(&f, "mounts[0].propagation");
    f.config.mounts[0].propagation = 0;
    f.config.mounts[0].container_path = "mnt/img".into();
    invalid(&f, "mounts[0].container_path");
}

#[test]
fn termination_message_file_is_bound_unless_a_mount_covers_it() {
    let mut f = Fixture::new("termlog");
    f.termination = Some((
        PathBuf::from("/var/lib/berth/c1/termination-log"),
        PathBuf::from("/dev/termination-log"),
    ));
    let spec = f.spec();
    let m = mount_at(&spec, "/dev/termination-log").unwrap();
    assert_eq!(
        m.source().as_deref(),
        Some(Path::new("/var/lib/berth/c1/termination-log"))
    );
    assert!(options(m).contains(&"rw".to_string()));
    f.config.mounts = vec![cri::Mount {
        container_path: "/dev/termination-log".into(),
        host_path: "/pods/x/termination".into(),
        ..Default::default()
    }];
    let spec = f.spec();
    let all: Vec<_> = spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .filter(|m| m.destination() == Path::new("/dev/termination-log"))
        .collect();
    assert_eq!(all.len(), 1);
    assert_eq!(
        all[0].source().as_deref(),
        Some(Path::new("/pods/x/termination"))
    );
}

#[test]
fn devices_and_their_cgroup_rules() {
    let mut f = Fixture::new("devices");
    f.config.devices = vec![cri::Device {
        container_path: "/dev/mynull".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    }];
    let spec = f.spec();
    let devs = linux(&spec).devices().clone().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].path(), Path::new("/dev/mynull"));
    assert_eq!(
        (devs[0].typ(), devs[0].major(), devs[0].minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    let rules = linux(&spec)
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(!rules[0].allow());
    let last = rules.last().unwrap();
    assert!(last.allow());
    assert_eq!((last.major(), last.minor()), (Some(1), Some(3)));
    assert_eq!(last.access().as_deref(), Some("rw"));

    f.config.devices[0].permissions = "rwx".into();
    invalid(&f, "devices[0].permissions");
    f.config.devices[0].permissions = "rwm".into();
    f.config.devices[0].host_path = "/nonexistent/device".into();
    invalid(&f, "devices[0].host_path");
    f.config.devices[0].host_path = f.rootfs.join("etc/passwd").to_string_lossy().into();
    invalid(&f, "not a device");
    // A directory of devices: each node below it, under the container path.
    f.config.devices[0].host_path = "/dev".into();
    f.config.devices[0].container_path = "/hostdev".into();
    let spec = f.spec();
    let devs = linux(&spec).devices().clone().unwrap();
    assert!(devs.iter().any(|d| d.path() == Path::new("/hostdev/null")));
}

fn caps(spec: &Spec) -> oci_spec::runtime::LinuxCapabilities {
    process(spec).capabilities().clone().unwrap()
}

#[test]
fn default_capabilities_add_drop_all() {
    let mut f = Fixture::new("caps");
    let c = caps(&f.spec());
    let expected: HashSet<_> = DEFAULT_CAPABILITIES.iter().copied().collect();
    assert_eq!(c.bounding().as_ref().unwrap(), &expected);
    assert_eq!(c.effective().as_ref().unwrap(), &expected);
    assert_eq!(c.permitted().as_ref().unwrap(), &expected);
    assert!(c.inheritable().as_ref().unwrap().is_empty());
    assert!(c.ambient().as_ref().unwrap().is_empty());

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["NET_ADMIN".into(), "CAP_SYS_TIME".into()],
        drop_capabilities: vec!["KILL".into()],
        ..Default::default()
    });
    let b = caps(&f.spec()).bounding().clone().unwrap();
    assert!(b.contains(&Capability::NetAdmin) && b.contains(&Capability::SysTime));
    assert!(!b.contains(&Capability::Kill));

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["NET_BIND_SERVICE".into()],
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let b = caps(&f.spec()).bounding().clone().unwrap();
    assert_eq!(b, [Capability::NetBindService].into_iter().collect());

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["ALL".into()],
        drop_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let b = caps(&f.spec()).bounding().clone().unwrap();
    assert_eq!(b.len(), ALL_CAPABILITIES.len() - 1);

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["NOT_A_CAP".into()],
        ..Default::default()
    });
    invalid(&f, "capabilities.add_capabilities");
}

#[test]
fn capabilities_are_limited_to_the_host_bounding_set() {
    // A host without CAP_SYS_RESOURCE (bit 24) in its bounding set, as on this project's VM.
    let host = capabilities_from_mask(0x1ff_feff_ffff);
    assert!(!host.contains(&Capability::SysResource));
    assert!(host.contains(&Capability::CheckpointRestore) && host.contains(&Capability::Chown));
    assert_eq!(host.len(), ALL_CAPABILITIES.len() - 1);
    let mut f = Fixture::new("hostcaps");
    f.host_caps = Some(host.clone());
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let b = caps(&f.spec()).bounding().clone().unwrap();
    assert_eq!(b, host);
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: vec!["SYS_RESOURCE".into(), "NET_ADMIN".into()],
        ..Default::default()
    });
    let b = caps(&f.spec()).bounding().clone().unwrap();
    assert!(b.contains(&Capability::NetAdmin) && !b.contains(&Capability::SysResource));
    f.sc().capabilities = None;
    f.sc().privileged = true;
    let p = caps(&f.spec());
    assert_eq!(p.bounding().clone().unwrap(), host);
    assert_eq!(p.effective().clone().unwrap(), host);
    // The live host's set parses and holds at least the defaults.
    let live = host_capabilities().unwrap();
    assert!(DEFAULT_CAPABILITIES.iter().all(|c| live.contains(c)));
}

#[test]
fn run_as_group_without_a_user_is_refused() {
    let mut f = Fixture::new("grouponly");
    f.sc().run_as_group = Some(cri::Int64Value { value: 1002 });
    invalid(&f, "run_as_group");
    f.sc().run_as_user = Some(cri::Int64Value { value: 1001 });
    let (spec, user) = f.run().unwrap();
    assert_eq!((user.uid, user.gid), (1001, 1002));
    let u = process(&spec).user();
    assert_eq!((u.uid(), u.gid()), (1001, 1002));
}

#[test]
fn privileged_gets_everything() {
    let mut f = Fixture::new("privileged");
    f.sc().privileged = true;
    f.sc().seccomp = Some(cri::SecurityProfile::default());
    let spec = f.spec();
    assert_eq!(
        caps(&spec).bounding().as_ref().unwrap().len(),
        ALL_CAPABILITIES.len()
    );
    assert!(caps(&spec).inheritable().as_ref().unwrap().is_empty());
    assert!(linux(&spec).masked_paths().as_ref().unwrap().is_empty());
    assert!(linux(&spec).readonly_paths().as_ref().unwrap().is_empty());
    assert!(options(mount_at(&spec, "/sys").unwrap()).contains(&"rw".into()));
    assert!(linux(&spec).seccomp().is_none());
    let rules = linux(&spec)
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r.allow() && r.typ() == Some(LinuxDeviceType::A))
    );
    let devs = linux(&spec).devices().clone().unwrap();
    assert!(devs.iter().any(|d| d.path() == Path::new("/dev/null")));
}

#[test]
fn readonly_rootfs_and_no_new_privs() {
    let mut f = Fixture::new("ro");
    let spec = f.spec();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(false));
    // Absent, not false: libcontainer then loads seccomp before dropping capabilities.
    assert_eq!(process(&spec).no_new_privileges(), None);
    f.sc().readonly_rootfs = true;
    f.sc().no_new_privs = true;
    let spec = f.spec();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    assert_eq!(spec.root().as_ref().unwrap().path(), &*f.rootfs);
    assert_eq!(process(&spec).no_new_privileges(), Some(true));
}

#[test]
fn masked_and_readonly_paths() {
    let mut f = Fixture::new("masked");
    let spec = f.spec();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        DEFAULT_MASKED_PATHS
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        DEFAULT_READONLY_PATHS
    );
    f.sc().masked_paths = vec!["/proc/kcore".into(), "/proc/extra".into()];
    f.sc().readonly_paths = vec!["/proc/more".into()];
    let spec = f.spec();
    let masked = linux(&spec).masked_paths().clone().unwrap();
    assert_eq!(masked.len(), DEFAULT_MASKED_PATHS.len() + 1);
    assert!(masked.contains(&"/proc/extra".to_string()));
    let ro = linux(&spec).readonly_paths().clone().unwrap();
    assert!(ro.contains(&"/proc/more".to_string()) && ro.contains(&"/proc/sys".to_string()));
}

#[test]
fn selinux_labels_are_ignored_without_selinux_and_refused_with_it() {
    let mut f = Fixture::new("selinux");
    f.sc().selinux_options = Some(cri::SeLinuxOption {
        level: "s0:c0,c1".into(),
        ..Default::default()
    });
    assert!(f.run().is_ok(), "no SELinux on the host: ignored");
    f.selinux = true;
    let e = f.run().expect_err("SELinux enabled: refused");
    assert!(matches!(e, SpecError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("s0:c0,c1"), "{e}");
    f.sc().selinux_options = Some(cri::SeLinuxOption::default());
    assert!(f.run().is_ok(), "empty options ask for nothing");
}

#[test]
fn apparmor_profile_reaches_the_process() {
    let mut f = Fixture::new("apparmor");
    let list = f.rootfs.join("profiles");
    std::fs::write(&list, "berth-default (enforce)\nmine (enforce)\n").unwrap();
    f.apparmor = crate::runtime::apparmor::Host::enabled(&list, true);
    assert_eq!(
        process(&f.spec()).apparmor_profile().as_deref(),
        Some("berth-default")
    );
    f.sc().privileged = true;
    assert_eq!(process(&f.spec()).apparmor_profile().as_deref(), None);
    f.sc().apparmor = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: "mine".into(),
    });
    assert_eq!(
        process(&f.spec()).apparmor_profile().as_deref(),
        Some("mine")
    );
}

#[test]
fn seccomp_profiles() {
    use cri::security_profile::ProfileType;
    let mut f = Fixture::new("seccomp");
    assert!(
        linux(&f.spec()).seccomp().is_none(),
        "no profile given: unconfined"
    );
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let s = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(s.default_action(), LinuxSeccompAction::ScmpActErrno);
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert!(linux(&f.spec()).seccomp().is_none());
    let profile = f.rootfs.join("profile.json");
    std::fs::write(&profile, r#"{"defaultAction":"SCMP_ACT_LOG"}"#).unwrap();
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: profile.to_string_lossy().into_owned(),
    });
    let s = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(s.default_action(), LinuxSeccompAction::ScmpActLog);
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: "/no/such/profile.json".into(),
    });
    invalid(&f, "/no/such/profile.json");
}

fn ns_path(spec: &Spec, typ: LinuxNamespaceType) -> Option<Option<PathBuf>> {
    linux(spec)
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .find(|n| n.typ() == typ)
        .map(|n| n.path().clone())
}

#[test]
fn namespaces_per_mode() {
    use LinuxNamespaceType as T;
    let mut f = Fixture::new("ns");
    let spec = f.spec();
    assert_eq!(ns_path(&spec, T::Mount), Some(None));
    assert_eq!(
        ns_path(&spec, T::Cgroup),
        host_is_cgroup_v2().then_some(None)
    );
    assert_eq!(ns_path(&spec, T::User), None);
    assert_eq!(
        ns_path(&spec, T::Network),
        Some(Some("/run/berth/sb/ns/net".into()))
    );
    assert_eq!(
        ns_path(&spec, T::Ipc),
        Some(Some("/run/berth/sb/ns/ipc".into()))
    );
    assert_eq!(
        ns_path(&spec, T::Uts),
        Some(Some("/run/berth/sb/ns/uts".into()))
    );
    assert_eq!(ns_path(&spec, T::Pid), Some(None));

    f.ns().pid = cri::NamespaceMode::Pod as i32;
    f.ns().ipc = cri::NamespaceMode::Container as i32;
    let spec = f.spec();
    assert_eq!(
        ns_path(&spec, T::Pid),
        Some(Some("/run/berth/sb/ns/pid".into()))
    );
    assert_eq!(ns_path(&spec, T::Ipc), Some(None));

    f.ns().pid = cri::NamespaceMode::Node as i32;
    f.ns().ipc = cri::NamespaceMode::Node as i32;
    f.ns().network = cri::NamespaceMode::Node as i32;
    let spec = f.spec();
    for t in [T::Pid, T::Ipc, T::Network, T::Uts] {
        assert_eq!(ns_path(&spec, t), None, "{t:?} should be the host's");
    }

    f.ns().pid = cri::NamespaceMode::Target as i32;
    f.ns().target_id = "other".into();
    invalid(&f, "target_id");
    f.paths.target_pid_ns = Some("/proc/42/ns/pid".into());
    assert_eq!(
        ns_path(&f.spec(), T::Pid),
        Some(Some("/proc/42/ns/pid".into()))
    );

    f.ns().network = cri::NamespaceMode::Pod as i32;
    f.paths.net_ns = None;
    let e = f.run().unwrap_err();
    assert!(matches!(e, SpecError::SandboxMissing(_)) && !e.is_invalid_argument());
}

/// Without a hugetlb controller the kubelet's zero limits (one per page size) are dropped and
/// the container is made; a limit above zero is refused naming the field.
#[test]
fn hugepage_limits_follow_the_hugetlb_controller() {
    let mut f = Fixture::new("hugetlb");
    f.hugetlb = false;
    let zero = |page: &str| cri::HugepageLimit {
        page_size: page.into(),
        limit: 0,
    };
    f.resources().hugepage_limits = vec![zero("2MB"), zero("1GB")];
    f.resources().cpu_shares = 2;
    let spec = f.spec();
    let r = linux(&spec).resources().clone().unwrap();
    assert!(r.hugepage_limits().is_none());
    assert_eq!(r.cpu().clone().unwrap().shares(), Some(2));

    f.resources().hugepage_limits[1].limit = 1 << 30;
    let err = f.run().unwrap_err().to_string();
    assert!(
        err.contains("resources.hugepage_limits[1]") && err.contains("1GB"),
        "{err}"
    );
    assert!(matches!(f.run(), Err(SpecError::InvalidArgument { .. })));

    f.hugetlb = true;
    let spec = f.spec();
    let hp = linux(&spec)
        .resources()
        .clone()
        .unwrap()
        .hugepage_limits()
        .clone()
        .unwrap();
    assert_eq!(hp.len(), 2);
}

#[test]
fn resources_map_to_linux_resources() {
    let mut f = Fixture::new("resources");
    *f.resources() = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 256 << 20,
        memory_swap_limit_in_bytes: 512 << 20,
        cpuset_cpus: "0-1".into(),
        cpuset_mems: "0".into(),
        hugepage_limits: vec![cri::HugepageLimit {
            page_size: "2MB".into(),
            limit: 4 << 20,
        }],
        unified: [("memory.high".to_string(), "200M".to_string())].into(),
        oom_score_adj: 500,
    };
    let spec = f.spec();
    let r = linux(&spec).resources().clone().unwrap();
    let cpu = r.cpu().clone().unwrap();
    assert_eq!(
        (cpu.shares(), cpu.quota(), cpu.period()),
        (Some(512), Some(50_000), Some(100_000))
    );
    assert_eq!(
        (cpu.cpus().as_deref(), cpu.mems().as_deref()),
        (Some("0-1"), Some("0"))
    );
    let mem = r.memory().unwrap();
    assert_eq!(
        (mem.limit(), mem.swap()),
        (Some(256 << 20), Some(512 << 20))
    );
    let hp = r.hugepage_limits().clone().unwrap();
    assert_eq!(
        (hp[0].page_size().as_str(), hp[0].limit()),
        ("2MB", 4 << 20)
    );
    assert_eq!(r.unified().as_ref().unwrap()["memory.high"], "200M");
    assert!(r.pids().is_none());
    assert_eq!(process(&spec).oom_score_adj(), Some(500));

    f.resources().memory_swap_limit_in_bytes = 1;
    invalid(&f, "resources.memory_swap_limit_in_bytes");
    // NoSwap: memory plus swap equal to the memory limit (libcontainer writes
    // memory.swap.max = swap - limit = 0 on cgroup v2, memsw = limit on v1).
    f.resources().memory_swap_limit_in_bytes = 256 << 20;
    let mem = linux(&f.spec())
        .resources()
        .clone()
        .unwrap()
        .memory()
        .unwrap();
    assert_eq!(
        (mem.limit(), mem.swap()),
        (Some(256 << 20), Some(256 << 20))
    );
    // Swap without a memory limit cannot be bounded: dropped, not handed to libcontainer
    // (which fails the create on cgroup v2).
    f.resources().memory_limit_in_bytes = 0;
    for swap in [512 << 20, -1] {
        f.resources().memory_swap_limit_in_bytes = swap;
        let r = linux(&f.spec()).resources().clone().unwrap();
        assert_eq!(r.memory().and_then(|m| m.swap()), None, "swap {swap}");
    }
    // The kubelet's swap on cgroup v2 is `unified` memory.swap.max: with a memory limit it is
    // also the memory+swap bound (what libcontainer's systemd manager makes MemorySwapMax of).
    f.resources().memory_limit_in_bytes = 256 << 20;
    f.resources().memory_swap_limit_in_bytes = 0;
    for (swap_max, bound) in [
        ("0", 256 << 20),
        ("1048576", (256 << 20) + 1048576),
        ("max", -1),
    ] {
        f.resources().unified = [("memory.swap.max".to_string(), swap_max.to_string())].into();
        let r = linux(&f.spec()).resources().clone().unwrap();
        assert_eq!(r.memory().and_then(|m| m.swap()), Some(bound), "{swap_max}");
        assert_eq!(r.unified().as_ref().unwrap()["memory.swap.max"], swap_max);
    }
    // Without a limit there is no bound to make of it: the file alone.
    f.resources().memory_limit_in_bytes = 0;
    let r = linux(&f.spec()).resources().clone().unwrap();
    assert_eq!(r.memory().and_then(|m| m.swap()), None);
    f.resources().unified.clear();
    f.resources().memory_limit_in_bytes = -5;
    invalid(&f, "resources.memory_limit_in_bytes");
    f.resources().memory_limit_in_bytes = 0;
    f.resources().cpu_period = 10;
    invalid(&f, "resources.cpu_period");
    f.resources().cpu_period = 0;
    f.resources().cpu_shares = -1;
    invalid(&f, "resources.cpu_shares");
    f.resources().cpu_shares = 0;
    f.resources().cpuset_cpus = "zero".into();
    invalid(&f, "resources.cpuset_cpus");
    f.resources().cpuset_cpus.clear();
    f.resources().oom_score_adj = 5000;
    invalid(&f, "resources.oom_score_adj");
    // Nothing requested: no cpu or memory section at all.
    *f.resources() = Default::default();
    let r = linux(&f.spec()).resources().clone().unwrap();
    assert!(r.cpu().is_none() && r.memory().is_none() && r.hugepage_limits().is_none());
}

#[test]
fn oom_score_adj_is_clamped_to_the_runtime_value() {
    let mut f = Fixture::new("oom");
    f.runtime_oom = -500;
    f.resources().oom_score_adj = -998;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-500));
    f.resources().oom_score_adj = -100;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-100));
}

#[test]
fn cgroups_path_sysctls_rlimits_and_annotations() {
    let f = Fixture::new("misc");
    let spec = f.spec();
    assert_eq!(
        linux(&spec).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/burstable/poduid-1/berth-c1"))
    );
    assert_eq!(
        linux(&spec).sysctl().as_ref().unwrap()["net.ipv4.ip_forward"],
        "1"
    );
    assert!(process(&spec).rlimits().is_none());
    let a = spec.annotations().clone().unwrap();
    assert_eq!(a[ANNOTATION_CONTAINER_TYPE], "container");
    assert_eq!(a[ANNOTATION_SANDBOX_ID], "s1");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "app");
    assert_eq!(a[ANNOTATION_IMAGE_NAME], "docker.io/library/busybox:1.36");
    assert_eq!(a[ANNOTATION_SANDBOX_NAMESPACE], "default");
}

#[test]
fn spec_json_has_no_inheritable_caps_and_a_cgroup_ns_on_v2_only() {
    let f = Fixture::new("json");
    let json = serde_json::to_value(f.spec()).unwrap();
    assert_eq!(
        json["process"]["capabilities"]["inheritable"],
        serde_json::json!([])
    );
    assert_eq!(
        json["process"]["capabilities"]["ambient"],
        serde_json::json!([])
    );
    let ns = json["linux"]["namespaces"].as_array().unwrap();
    // oci-spec's default would add one on every host.
    assert_eq!(
        ns.iter().any(|n| n["type"] == "cgroup"),
        host_is_cgroup_v2()
    );
    assert_eq!(json["ociVersion"], "1.0.2");
    let back: Spec = serde_json::from_value(json).unwrap();
    assert_eq!(back, f.spec());
}

#[test]
fn image_config_parsing() {
    let blob = serde_json::json!({
        "architecture": "amd64",
        "config": {
            "User": "app:wheel",
            "Env": ["PATH=/bin", "X=1"],
            "Entrypoint": ["/entry"],
            "Cmd": ["a", "b"],
            "WorkingDir": "/srv",
            "StopSignal": "SIGQUIT",
            "Volumes": {"/var/lib/b": {}, "/data": {}}
        }
    });
    let c = parse_image_config(&blob);
    assert_eq!(c.user, "app:wheel");
    assert_eq!(c.env, ["PATH=/bin", "X=1"]);
    assert_eq!(c.entrypoint, ["/entry"]);
    assert_eq!(c.cmd, ["a", "b"]);
    assert_eq!(c.working_dir, "/srv");
    assert_eq!(c.stop_signal, "SIGQUIT");
    assert_eq!(c.volumes, ["/data", "/var/lib/b"]);
    assert_eq!(
        parse_image_config(&serde_json::json!({})),
        ImageConfig::default()
    );
    assert_eq!(
        parse_image_config(&serde_json::json!({"config": null, "Cmd": ["x"]})).cmd,
        ["x"]
    );
}

#[test]
fn a_private_cgroup_namespace_only_where_asked() {
    use LinuxNamespaceType as T;
    let opts = cri::NamespaceOption::default();
    let has_cgroup = |private| {
        namespaces(&opts, &sandbox_paths(), private)
            .unwrap()
            .iter()
            .filter(|n| n.typ() == T::Cgroup)
            .map(|n| n.path().clone())
            .collect::<Vec<_>>()
    };
    // A new one (no path to join), or none: the host's.
    assert_eq!(has_cgroup(true), vec![None]);
    assert!(has_cgroup(false).is_empty());
    // Privileged containers keep the host's on every host, as containerd's do.
    let mut f = Fixture::new("cgroupns");
    f.sc().privileged = true;
    assert_eq!(ns_path(&f.spec(), T::Cgroup), None);
    // This host's answer agrees with the filesystem at /sys/fs/cgroup.
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    assert_eq!(host_is_cgroup_v2(), v2);
}

#[test]
fn unified_keys_are_interface_files_of_the_own_cgroup() {
    let mut f = Fixture::new("unified");
    for key in [
        "../../../../proc/sys/kernel/core_pattern",
        "memory.high/../../x",
        "..",
        ".hidden.max",
        "nodot",
        "",
        "memory.high\0",
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.kill",
    ] {
        f.resources().unified = [(key.to_string(), "1".to_string())].into();
        let e = f.run().unwrap_err();
        assert!(e.is_invalid_argument(), "{key:?}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("resources.unified[{key:?}]")),
            "{e}"
        );
    }
    f.resources().unified = [("memory.high".to_string(), "1\0".to_string())].into();
    invalid(&f, "NUL");
    f.resources().unified = [
        ("memory.high".to_string(), "200M".to_string()),
        ("pids.max".to_string(), "10".to_string()),
        ("hugetlb.2MB.limit_in_bytes".to_string(), "0".to_string()),
        ("memory.oom.group".to_string(), "1".to_string()),
    ]
    .into();
    let spec = f.spec();
    let r = linux(&spec).resources().clone().unwrap();
    assert_eq!(r.unified().as_ref().unwrap().len(), 4);
}
