//! Security contexts, seccomp, mount propagation, image volumes and ContainerStatus details,
//! observed in real containers of the busybox test image.
//!
//! What a container's own process sees is read from its CRI log (ExecSync'd processes do not
//! yet take the container's user and seccomp filter: see `exec_runs_as_the_container_user`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use berth::client::CriClient;
use common::*;
use k8s_cri::v1 as cri;

const TERMINATION_ANNOTATION: &str = "io.kubernetes.container.terminationMessagePath";

/// A daemon, a pulled busybox and one pod.
struct Env {
    d: Daemon,
    c: CriClient,
    busybox: String,
    logs: PathBuf,
    pod: String,
    pod_config: cri::PodSandboxConfig,
}

impl Env {
    async fn new(name: &str) -> Self {
        let d = Daemon::start();
        let c = d.client().await;
        let busybox = image("busybox");
        pull(&c, &busybox).await.expect("pull busybox");
        let logs = d.dir.path().join("logs");
        let pod_config = pod_config(name, &logs, cri::NamespaceMode::Container);
        let pod = run_pod(&c, &pod_config).await;
        Self {
            d,
            c,
            busybox,
            logs,
            pod,
            pod_config,
        }
    }

    /// A `sh -c script` container config with a security context.
    fn container(
        &self,
        name: &str,
        script: &str,
        sc: cri::LinuxContainerSecurityContext,
    ) -> cri::ContainerConfig {
        let mut config = sh_container(name, &self.busybox, script, cri::NamespaceMode::Container);
        let linux = config.linux.get_or_insert_with(Default::default);
        let ns = linux
            .security_context
            .take()
            .and_then(|s| s.namespace_options);
        linux.security_context = Some(cri::LinuxContainerSecurityContext {
            namespace_options: ns,
            ..sc
        });
        config
    }

    async fn create(&self, config: cri::ContainerConfig) -> Result<String, tonic::Status> {
        self.c
            .runtime()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: self.pod.clone(),
                config: Some(config),
                sandbox_config: Some(self.pod_config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    async fn run(&self, config: cri::ContainerConfig) -> String {
        run_container(&self.c, &self.pod, &self.pod_config, config).await
    }

    /// Runs the container to its end; returns its status and stdout lines.
    async fn run_to_exit(&self, config: cri::ContainerConfig) -> (cri::ContainerStatus, String) {
        let name = config.metadata.as_ref().map(|m| m.name.clone());
        let id = self.run(config).await;
        let status = wait_exited(&self.c, &id).await;
        let log =
            std::fs::read_to_string(self.logs.join(format!("{}.log", name.unwrap_or_default())))
                .unwrap_or_default();
        (status, stdout_of(&log))
    }

    async fn remove(&self, id: &str) {
        self.c
            .runtime()
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .expect("RemoveContainer");
    }

    /// Container bundles on disk.
    fn bundles(&self) -> Vec<String> {
        common::settled_entries(&self.d.root().join("containers"))
    }

    /// Mount points under the daemon's container bundles.
    fn bundle_mounts(&self) -> Vec<String> {
        let root = format!("{}/containers/", self.d.root().display());
        let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&root))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    }

    /// A failed CreateContainer must leave no bundle, snapshot or mount behind.
    async fn assert_refused(&self, config: cri::ContainerConfig, code: tonic::Code, needle: &str) {
        let snapshots = self.d.snapshot_dirs();
        let mut bundles = self.bundles();
        let mounts = self.bundle_mounts();
        let e = self
            .create(config)
            .await
            .expect_err("CreateContainer must fail");
        assert_eq!(e.code(), code, "{e:?}");
        assert!(
            e.message().contains(needle),
            "{:?} lacks {needle:?}",
            e.message()
        );
        assert_eq!(self.d.snapshot_dirs(), snapshots, "snapshot left behind");
        let mut after = self.bundles();
        bundles.sort();
        after.sort();
        assert_eq!(after, bundles, "bundle left behind");
        // An earlier container's rootfs may be unmounted meanwhile, as it exits: only a mount
        // that was not there before is one this call left.
        let new_mounts: Vec<String> = self
            .bundle_mounts()
            .into_iter()
            .filter(|m| !mounts.contains(m))
            .collect();
        assert!(new_mounts.is_empty(), "mount left behind: {new_mounts:?}");
    }
}

/// The stdout records of a CRI log, joined by newlines.
fn stdout_of(log: &str) -> String {
    log.lines()
        .filter_map(|l| l.split_once(" stdout F ").map(|(_, t)| t))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of `Key:\t...` in /proc/<pid>/status text.
fn status_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.strip_prefix(key)
            .map(|v| v.trim_start_matches(':').trim())
    })
}

fn host_cap_bnd() -> String {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    status_field(&s, "CapBnd").expect("CapBnd").to_string()
}

fn sc() -> cri::LinuxContainerSecurityContext {
    cri::LinuxContainerSecurityContext::default()
}

#[tokio::test]
async fn run_as_user_group_and_supplemental_groups_reach_the_process() {
    let env = Env::new("users").await;
    let script = "id -u; id -g; id -G";
    let (s, out) = env
        .run_to_exit(env.container(
            "uid",
            script,
            cri::LinuxContainerSecurityContext {
                run_as_user: Some(cri::Int64Value { value: 1001 }),
                run_as_group: Some(cri::Int64Value { value: 1002 }),
                supplemental_groups: vec![1234, 5678],
                ..sc()
            },
        ))
        .await;
    assert_eq!(s.exit_code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["1001", "1002"], "{out}");
    let groups: Vec<&str> = lines[2].split(' ').collect();
    assert!(
        groups.contains(&"1234") && groups.contains(&"5678") && groups.contains(&"1002"),
        "{out}"
    );
    let user = s.user.and_then(|u| u.linux).expect("ContainerStatus.user");
    assert_eq!((user.uid, user.gid), (1001, 1002));
    assert!(user.supplemental_groups.contains(&1234) && user.supplemental_groups.contains(&5678));

    // A user name from the image's /etc/passwd.
    let (s, out) = env
        .run_to_exit(env.container(
            "byname",
            "id -un; id -u",
            cri::LinuxContainerSecurityContext {
                run_as_username: "nobody".into(),
                ..sc()
            },
        ))
        .await;
    assert_eq!(out, "nobody\n65534", "{out}");
    assert_eq!(s.user.and_then(|u| u.linux).map(|u| u.uid), Some(65534));

    // RunAsGroup alone is refused and leaves nothing behind.
    env.assert_refused(
        env.container(
            "grouponly",
            "true",
            cri::LinuxContainerSecurityContext {
                run_as_group: Some(cri::Int64Value { value: 1002 }),
                ..sc()
            },
        ),
        tonic::Code::InvalidArgument,
        "run_as_group",
    )
    .await;
    remove_pod(&env.c, &env.pod).await;
}

/// No user of the host but root reaches a container's files, its spec or Berth's database
/// through Berth's directories, while the container's own non-root user works as before.
#[tokio::test]
async fn host_users_cannot_reach_a_containers_files() {
    let env = Env::new("closed").await;
    let id = env
        .run(env.container(
            "closed",
            "echo secret > /tmp/f && exec sleep 1000",
            cri::LinuxContainerSecurityContext {
                run_as_user: Some(cri::Int64Value { value: 1001 }),
                ..sc()
            },
        ))
        .await;
    let (root, state) = (env.d.root(), env.d.state());
    let bundle = root.join("containers").join(&id);
    // The shell creates the file before echo writes to it: wait for its content.
    let written = bundle.join("rootfs/tmp/f");
    for _ in 0..100 {
        if std::fs::read_to_string(&written).is_ok_and(|s| s == "secret\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed = [
        (root.clone(), bundle.join("rootfs/tmp/f")),
        (root.clone(), bundle.join("rootfs/bin/busybox")),
        (root.clone(), bundle.join("config.json")),
        (root.clone(), root.join("berth.redb")),
        (
            state.clone(),
            state.join("sandboxes").join(&env.pod).join("shm"),
        ),
        (
            state.clone(),
            state.join("sandboxes").join(&env.pod).join("hosts"),
        ),
    ];
    for (top, path) in &closed {
        assert!(path.exists(), "{} exists", path.display());
        assert!(
            !berth::runtime::dir_modes::others_can_read(top, path),
            "{} is closed to other users",
            path.display()
        );
    }
    // The container's own user (1001) wrote its file through the closed directories.
    assert_eq!(
        std::fs::read_to_string(&written).expect("written"),
        "secret\n"
    );
    env.remove(&id).await;
    remove_pod(&env.c, &env.pod).await;
}

/// The syscall probe (tests/probes/syscalls.c), built static into `dir`.
fn syscall_probe(dir: &Path) -> PathBuf {
    let out = dir.join("probe");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probes/syscalls.c");
    let built = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .output()
        .expect("gcc (hack/install-deps.sh installs it)");
    assert!(
        built.status.success(),
        "building the probe: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// `name=errno` lines of the probe's output.
fn probe_results(out: &str) -> std::collections::HashMap<String, i32> {
    out.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Under RuntimeDefault a container without extra capabilities cannot make a user namespace,
/// use the kernel keyring, trace a process, mount, load a kernel module or open an AF_ALG
/// socket: each fails with EPERM from the filter, where the kernel alone allows or answers
/// otherwise (Unconfined shows which). Ordinary sockets and reading the clock's state work.
#[tokio::test]
async fn runtime_default_refuses_what_docker_and_containerd_refuse() {
    use cri::security_profile::ProfileType;
    let env = Env::new("seccomp-probe").await;
    let dir = TempDir::new("seccomp-probe");
    let probe = syscall_probe(dir.path());
    let run = |name: &str, t: ProfileType| {
        let mut config = env.container(
            name,
            "exec /probe",
            cri::LinuxContainerSecurityContext {
                seccomp: Some(cri::SecurityProfile {
                    profile_type: t as i32,
                    localhost_ref: String::new(),
                }),
                ..sc()
            },
        );
        config.mounts = vec![cri::Mount {
            container_path: "/probe".into(),
            host_path: probe.to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        }];
        config
    };
    let (s, out) = env
        .run_to_exit(run("unconfined", ProfileType::Unconfined))
        .await;
    assert_eq!(s.exit_code, 0, "{out}");
    let open = probe_results(&out);
    for name in ["unshare_user", "keyctl", "ptrace"] {
        assert_eq!(open.get(name), Some(&0), "{name} without a filter: {out}");
    }
    let (s, out) = env
        .run_to_exit(run("default", ProfileType::RuntimeDefault))
        .await;
    assert_eq!(s.exit_code, 0, "{out}");
    let filtered = probe_results(&out);
    const EPERM: i32 = 1;
    for name in [
        "unshare_user",
        "keyctl",
        "ptrace",
        "mount",
        "finit_module",
        "init_module",
        "socket_alg",
    ] {
        assert_eq!(filtered.get(name), Some(&EPERM), "{name}: {out}");
    }
    assert_eq!(filtered.get("socket_inet"), Some(&0), "{out}");
    assert_eq!(filtered.get("clock_adjtime_read"), Some(&0), "{out}");
    remove_pod(&env.c, &env.pod).await;
}

#[tokio::test]
async fn privileged_and_all_capabilities() {
    let env = Env::new("caps").await;
    let host = host_cap_bnd();
    let script = "grep -E '^Cap(Eff|Bnd|Prm)' /proc/self/status";
    let (_, default) = env
        .run_to_exit(env.container("default", script, sc()))
        .await;
    // containerd's default set (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
    // SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP).
    assert_eq!(
        status_field(&default, "CapEff"),
        Some("00000000a80425fb"),
        "{default}"
    );

    let (s, all) = env
        .run_to_exit(env.container(
            "all",
            script,
            cri::LinuxContainerSecurityContext {
                capabilities: Some(cri::Capability {
                    add_capabilities: vec!["ALL".into()],
                    ..Default::default()
                }),
                ..sc()
            },
        ))
        .await;
    assert_eq!(s.exit_code, 0, "{all}");
    assert_eq!(status_field(&all, "CapEff"), Some(host.as_str()), "{all}");
    assert_eq!(status_field(&all, "CapBnd"), Some(host.as_str()), "{all}");

    // Privileged: every host capability, the host's devices, writable /sys.
    let host_dev = std::fs::read_dir("/dev")
        .expect("/dev")
        .flatten()
        .filter(|e| {
            use std::os::unix::fs::FileTypeExt;
            e.file_type()
                .is_ok_and(|t| t.is_char_device() || t.is_block_device())
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| {
            !matches!(
                n.as_str(),
                "null" | "zero" | "full" | "random" | "urandom" | "tty" | "console" | "ptmx"
            )
        })
        .expect("a host device beyond the defaults");
    let (s, out) = env
        .run_to_exit(env.container(
            "privileged",
            &format!(
                "grep -E '^CapEff' /proc/self/status; test -e /dev/{host_dev} && echo dev=yes; \
                 grep -E '^Seccomp:' /proc/self/status; grep ' /sys ' /proc/mounts | grep -q rw, && echo sys=rw"
            ),
            cri::LinuxContainerSecurityContext {
                privileged: true,
                ..sc()
            },
        ))
        .await;
    assert_eq!(s.exit_code, 0, "{out}");
    assert_eq!(status_field(&out, "CapEff"), Some(host.as_str()), "{out}");
    assert!(out.contains("dev=yes"), "/dev/{host_dev} missing: {out}");
    assert!(out.contains("sys=rw"), "{out}");
    assert_eq!(status_field(&out, "Seccomp"), Some("0"), "{out}");
    remove_pod(&env.c, &env.pod).await;
}

#[tokio::test]
async fn seccomp_profiles_filter_syscalls() {
    use cri::security_profile::ProfileType;
    let env = Env::new("seccomp").await;
    let profile = |t: ProfileType, path: &str| cri::LinuxContainerSecurityContext {
        seccomp: Some(cri::SecurityProfile {
            profile_type: t as i32,
            localhost_ref: path.into(),
        }),
        ..sc()
    };
    let script = "grep '^Seccomp:' /proc/self/status; unshare -U true 2>/dev/null; echo unshare=$?";
    let (_, out) = env
        .run_to_exit(env.container("unconfined", script, profile(ProfileType::Unconfined, "")))
        .await;
    assert!(out.contains("unshare=0"), "{out}");
    assert_eq!(status_field(&out, "Seccomp"), Some("0"), "{out}");
    // RuntimeDefault refuses unshare(2) to a container without CAP_SYS_ADMIN, which the kernel
    // alone would allow (a user namespace needs no capability).
    let (_, out) = env
        .run_to_exit(env.container("default", script, profile(ProfileType::RuntimeDefault, "")))
        .await;
    assert!(out.contains("unshare=1"), "{out}");
    assert_eq!(status_field(&out, "Seccomp"), Some("2"), "{out}");

    // A localhost profile that refuses mkdir and sethostname, even with CAP_SYS_ADMIN.
    let dir = TempDir::new("seccomp-profiles");
    let path = dir.path().join("block.json");
    std::fs::write(
        &path,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[
            {"names":["mkdir","mkdirat","sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .expect("profile");
    let mut local = profile(ProfileType::Localhost, &path.to_string_lossy());
    local.capabilities = Some(cri::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let script = "mkdir /made 2>&1; echo mkdir=$?; hostname blocked 2>/dev/null; echo hostname=$?; \
                  touch /file; echo touch=$?";
    let (_, out) = env
        .run_to_exit(env.container("local", script, local.clone()))
        .await;
    assert!(out.contains("Operation not permitted"), "{out}");
    assert!(
        out.contains("mkdir=1") && out.contains("hostname=1"),
        "{out}"
    );
    assert!(out.contains("touch=0"), "{out}");
    // Privileged containers run unconfined: the same profile is ignored.
    let (_, out) = env
        .run_to_exit(env.container(
            "local-privileged",
            script,
            cri::LinuxContainerSecurityContext {
                privileged: true,
                ..local.clone()
            },
        ))
        .await;
    assert!(
        out.contains("mkdir=0") && out.contains("hostname=0"),
        "{out}"
    );

    // Unknown or unreadable profiles are refused, naming the file.
    env.assert_refused(
        env.container(
            "missing",
            "true",
            profile(ProfileType::Localhost, "/no/such/profile.json"),
        ),
        tonic::Code::InvalidArgument,
        "/no/such/profile.json",
    )
    .await;
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "not json").expect("garbage");
    env.assert_refused(
        env.container(
            "garbage",
            "true",
            profile(ProfileType::Localhost, &garbage.to_string_lossy()),
        ),
        tonic::Code::InvalidArgument,
        "garbage.json",
    )
    .await;
    remove_pod(&env.c, &env.pod).await;
}

/// AppArmor from the CRI's `apparmor` field and its deprecated string, on this host as it is:
/// with AppArmor enabled the default runs under `berth-default`; without it the default runs
/// unconfined. Either way a named profile the host cannot enforce is refused, naming it, and
/// leaves nothing behind; a string of no CRI form is the caller's error. (Enforcement itself
/// is checked in the node VM, whose kernel has AppArmor: tests/node_vm/guest.sh.)
#[tokio::test]
async fn apparmor_profiles_follow_the_host() {
    use cri::security_profile::ProfileType;
    let enabled = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.starts_with('Y'));
    let env = Env::new("apparmor").await;
    let profile = |t: ProfileType, name: &str| cri::LinuxContainerSecurityContext {
        apparmor: Some(cri::SecurityProfile {
            profile_type: t as i32,
            localhost_ref: name.into(),
        }),
        ..sc()
    };
    #[allow(deprecated)]
    let legacy = |s: &str| cri::LinuxContainerSecurityContext {
        apparmor_profile: s.into(),
        ..sc()
    };
    let script = "cat /proc/self/attr/current 2>/dev/null || echo no-lsm-attr";
    for (name, ctx) in [
        ("default", profile(ProfileType::RuntimeDefault, "")),
        ("legacy-default", legacy("runtime/default")),
        ("unset", sc()),
    ] {
        let (status, out) = env.run_to_exit(env.container(name, script, ctx)).await;
        assert_eq!(status.exit_code, 0, "{name}: {out}");
        if enabled {
            assert_eq!(out.trim(), "berth-default (enforce)", "{name}");
        } else {
            assert!(!out.contains("berth-default"), "{name}: {out}");
        }
    }
    let (status, out) = env
        .run_to_exit(env.container("unconfined", script, profile(ProfileType::Unconfined, "")))
        .await;
    assert_eq!(status.exit_code, 0, "{out}");
    assert!(!out.contains("berth-default"), "{out}");

    let why = if enabled {
        "is not loaded"
    } else {
        "not enabled"
    };
    env.assert_refused(
        env.container(
            "named",
            "true",
            profile(ProfileType::Localhost, "berth-test-no-such-profile"),
        ),
        tonic::Code::FailedPrecondition,
        "\"berth-test-no-such-profile\"",
    )
    .await;
    env.assert_refused(
        env.container(
            "named-legacy",
            "true",
            legacy("localhost/berth-test-no-such-profile"),
        ),
        tonic::Code::FailedPrecondition,
        why,
    )
    .await;
    env.assert_refused(
        env.container("bogus", "true", legacy("docker-default")),
        tonic::Code::InvalidArgument,
        "apparmor_profile",
    )
    .await;
    remove_pod(&env.c, &env.pod).await;
}

/// Runs `mount ARGS` on the host, panicking on failure.
fn host_mount(args: &[&str]) {
    let out = Command::new("mount").args(args).output().expect("mount");
    assert!(
        out.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One propagation mode end to end, as critest does: the host mounts a tmpfs under the
/// source after start; the container mounts one under its destination.
async fn propagation_case(env: &Env, name: &str, mode: cri::MountPropagation) -> (bool, bool) {
    // Everything below `host` is unmounted when it drops, even if an assertion fails.
    let host = TempDir::new(&format!("prop-{name}"));
    let src = host.path().join("src");
    std::fs::create_dir_all(&src).expect("src");
    let src_s = src.to_string_lossy().into_owned();
    host_mount(&["--bind", &src_s, &src_s]);
    let make = if mode == cri::MountPropagation::PropagationPrivate {
        "--make-rprivate"
    } else {
        "--make-rshared"
    };
    host_mount(&[make, &src_s]);
    let mut config = env.container(
        name,
        "sleep 1000",
        cri::LinuxContainerSecurityContext {
            privileged: true,
            ..sc()
        },
    );
    config.mounts = vec![cri::Mount {
        container_path: "/mnt/prop".into(),
        host_path: src_s.clone(),
        propagation: mode as i32,
        ..Default::default()
    }];
    let id = env.run(config).await;
    let status = container_status(&env.c, &id).await.expect("status");
    assert_eq!(status.mounts.len(), 1);
    assert_eq!(status.mounts[0].propagation, mode as i32);

    // Host → container.
    let inner = src.join("from-host");
    std::fs::create_dir_all(&inner).expect("inner");
    host_mount(&["-t", "tmpfs", "tmpfs", &inner.to_string_lossy()]);
    std::fs::write(inner.join("flag"), "x").expect("flag");
    let seen = exec_ok(&env.c, &id, &["ls", "-A", "/mnt/prop/from-host"]).await;
    let host_to_container = seen.contains("flag");

    // Container → host.
    exec_ok(
        &env.c,
        &id,
        &[
            "sh",
            "-c",
            "mkdir -p /mnt/prop/from-ctr && mount -t tmpfs none /mnt/prop/from-ctr && \
             touch /mnt/prop/from-ctr/flag",
        ],
    )
    .await;
    let container_to_host = src.join("from-ctr/flag").exists();
    env.remove(&id).await;
    drop(host);
    (host_to_container, container_to_host)
}

#[tokio::test]
async fn mount_propagation_modes() {
    use cri::MountPropagation as P;
    let env = Env::new("propagation").await;
    assert_eq!(
        propagation_case(&env, "rprivate", P::PropagationPrivate).await,
        (false, false),
        "rprivate"
    );
    assert_eq!(
        propagation_case(&env, "rslave", P::PropagationHostToContainer).await,
        (true, false),
        "rslave"
    );
    assert_eq!(
        propagation_case(&env, "rshared", P::PropagationBidirectional).await,
        (true, true),
        "rshared"
    );
    // A missing host path is created as a directory; a failed create removes what it made.
    let host = TempDir::new("missing-host-path");
    let missing = host.path().join("new/deep");
    let mut config = env.container("relative", "true", sc());
    config.mounts = vec![cri::Mount {
        container_path: "mnt/rel".into(),
        host_path: missing.to_string_lossy().into_owned(),
        ..Default::default()
    }];
    env.assert_refused(
        config.clone(),
        tonic::Code::InvalidArgument,
        "container_path",
    )
    .await;
    assert!(
        !host.path().join("new").exists(),
        "created host path left behind"
    );
    config.mounts[0].container_path = "/mnt/abs".into();
    let (s, _) = env.run_to_exit(config).await;
    assert_eq!(s.exit_code, 0);
    assert!(missing.is_dir());
    remove_pod(&env.c, &env.pod).await;
}

fn image_mount(image: &str, path: &str) -> cri::Mount {
    cri::Mount {
        container_path: path.into(),
        readonly: true,
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn image_volumes_mount_read_only_and_are_removed() {
    let env = Env::new("imgvol").await;
    let snapshots = env.d.snapshot_dirs();
    let mut config = env.container("vol", "sleep 1000", sc());
    config.mounts = vec![image_mount(&env.busybox, "/mnt/image")];
    let id = env.run(config).await;
    let hostdir = env
        .d
        .root()
        .join("containers")
        .join(&id)
        .join("imagevols/0");
    assert!(mounted(&hostdir), "{} not mounted", hostdir.display());
    let out = exec_ok(
        &env.c,
        &id,
        &["ls", "/mnt/image/bin/busybox", "/mnt/image/etc"],
    )
    .await;
    assert!(out.contains("passwd"), "{out}");
    let r = exec(&env.c, &id, &["touch", "/mnt/image/new"], 10)
        .await
        .expect("exec");
    assert_ne!(r.exit_code, 0, "the image volume is writable");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Read-only"),
        "{r:?}"
    );
    exec_ok(&env.c, &id, &["/mnt/image/bin/busybox", "true"]).await;
    let status = container_status(&env.c, &id).await.expect("status");
    assert_eq!(
        status.mounts[0].image.as_ref().map(|i| i.image.as_str()),
        Some(env.busybox.as_str())
    );
    env.remove(&id).await;
    assert!(!mounted(&hostdir));
    assert_eq!(
        env.d.snapshot_dirs(),
        snapshots,
        "image volume snapshot left"
    );

    // A missing image is NotFound, naming it; a writable image volume is refused.
    let mut config = env.container("novol", "true", sc());
    let missing = image("no-such-image:1");
    config.mounts = vec![image_mount(&missing, "/mnt/image")];
    env.assert_refused(config.clone(), tonic::Code::NotFound, &missing)
        .await;
    config.mounts = vec![image_mount(&env.busybox, "/mnt/image")];
    config.mounts[0].readonly = false;
    env.assert_refused(config.clone(), tonic::Code::InvalidArgument, "readonly")
        .await;
    // A failure after the image volume was mounted (a bad profile) undoes it too.
    config.mounts[0].readonly = true;
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: "/no/such/profile.json".into(),
    });
    env.assert_refused(config, tonic::Code::InvalidArgument, "profile.json")
        .await;
    remove_pod(&env.c, &env.pod).await;
}

#[tokio::test]
async fn status_reports_reason_message_image_ref_and_verbose_info() {
    let env = Env::new("status").await;
    let mut config = env.container(
        "done",
        "echo 'all done' > /dev/termination-log; exit 0",
        cri::LinuxContainerSecurityContext {
            run_as_user: Some(cri::Int64Value { value: 1000 }),
            ..sc()
        },
    );
    config
        .annotations
        .insert(TERMINATION_ANNOTATION.into(), "/dev/termination-log".into());
    let (s, _) = env.run_to_exit(config).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    assert_eq!(s.message, "all done\n");

    // A kubelet-style mount of its own file at the path: the file holds what the container
    // wrote, and the message stays empty (the kubelet reads its file and appends the text to
    // the message itself; a message here would show twice).
    let dir = TempDir::new("termlog");
    let file = dir.path().join("termination-log");
    std::fs::write(&file, "").expect("file");
    let mut config = env.container(
        "failed",
        "yes x | tr -d '\\n' | head -c 5000 > /dev/termination-log; exit 2",
        sc(),
    );
    config
        .annotations
        .insert(TERMINATION_ANNOTATION.into(), "/dev/termination-log".into());
    config.mounts = vec![cri::Mount {
        container_path: "/dev/termination-log".into(),
        host_path: file.to_string_lossy().into_owned(),
        ..Default::default()
    }];
    let (s, _) = env.run_to_exit(config).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (2, "Error"));
    assert_eq!(s.message, "");
    assert_eq!(std::fs::read(&file).expect("termination file").len(), 5000);

    // Berth's own file (no mount at the path) is read, at most 4 KiB.
    let mut config = env.container(
        "long",
        "yes x | tr -d '\\n' | head -c 5000 > /dev/termination-log; exit 3",
        sc(),
    );
    config
        .annotations
        .insert(TERMINATION_ANNOTATION.into(), "/dev/termination-log".into());
    let (long, _) = env.run_to_exit(config).await;
    assert_eq!((long.exit_code, long.reason.as_str()), (3, "Error"));
    assert_eq!(long.message, "x".repeat(4096));

    // image_ref is what ImageStatus reports: a repo digest when known, else the id.
    let img = status(&env.c, &env.busybox).await.expect("image");
    let expected = img.repo_digests.first().cloned().unwrap_or(img.id.clone());
    assert_eq!(s.image_ref, expected);
    assert_eq!(s.image_id, img.id);

    // Verbose: info["info"] is JSON with the pid, sandbox, spec, snapshot and bundle.
    let id = env.run(env.container("running", "sleep 1000", sc())).await;
    let info = container_info(&env.c, &id).await;
    assert!(info["pid"].as_u64().unwrap_or(0) > 0, "{info}");
    assert_eq!(info["sandboxID"], env.pod.as_str());
    assert_eq!(info["runtimeSpec"]["process"]["args"][2], "sleep 1000");
    assert!(
        info["snapshotKey"]
            .as_str()
            .is_some_and(|k| k.contains(&id))
    );
    assert!(
        info["bundle"]
            .as_str()
            .is_some_and(|b| Path::new(b).join("config.json").exists()),
        "{info}"
    );
    let plain = container_status(&env.c, &id).await.expect("status");
    assert!(plain.reason.is_empty() && plain.message.is_empty());
    let quiet = env
        .c
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .expect("status")
        .into_inner();
    assert!(quiet.info.is_empty());
    remove_pod(&env.c, &env.pod).await;
}

/// ExecSync'd processes run as the container's user with its groups and seccomp filter, in
/// its cgroups and namespaces.
#[tokio::test]
async fn exec_runs_as_the_container_user() {
    let env = Env::new("execuser").await;
    let id = env
        .run(env.container(
            "sleeper",
            "sleep 1000",
            cri::LinuxContainerSecurityContext {
                run_as_user: Some(cri::Int64Value { value: 1001 }),
                supplemental_groups: vec![1234],
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    localhost_ref: String::new(),
                }),
                ..sc()
            },
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(exec_ok(&env.c, &id, &["id", "-u"]).await.trim(), "1001");
    assert!(exec_ok(&env.c, &id, &["id", "-G"]).await.contains("1234"));
    let s = exec_ok(&env.c, &id, &["cat", "/proc/self/status"]).await;
    assert_eq!(status_field(&s, "Seccomp"), Some("2"));
    // It is in the container's cgroups and namespaces: those of its init (pid 1 there).
    let same = exec_ok(
        &env.c,
        &id,
        &[
            "sh",
            "-c",
            "cat /proc/self/cgroup; for n in pid mnt net ipc uts cgroup; do readlink /proc/self/ns/$n; done",
        ],
    )
    .await;
    let init = exec_ok(
        &env.c,
        &id,
        &[
            "sh",
            "-c",
            "cat /proc/1/cgroup; for n in pid mnt net ipc uts cgroup; do readlink /proc/1/ns/$n; done",
        ],
    )
    .await;
    assert_eq!(same, init);
    assert!(same.contains("pid:["), "{same}");
    remove_pod(&env.c, &env.pod).await;
}
