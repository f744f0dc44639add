//! Pods with their own user namespace (mode POD) through CRI on a real berthd: root inside,
//! an unprivileged host uid outside, the image and volumes seen through idmapped mounts, and
//! the requests that must be refused.

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use k8s_cri::v1 as cri;

/// A mapping of 65536 ids at a host range no other test uses.
fn pod_ids() -> (u32, cri::UserNamespace) {
    let mut b = [0u8; 2];
    getrandom::fill(&mut b).expect("random");
    let host_id = 65536 * (100 + u32::from(u16::from_le_bytes(b) % 1000));
    let m = cri::IdMapping {
        host_id,
        container_id: 0,
        length: 65536,
    };
    (
        host_id,
        cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![m],
            gids: vec![m],
        },
    )
}

fn with_userns(
    mut pod: cri::PodSandboxConfig,
    userns: &cri::UserNamespace,
) -> cri::PodSandboxConfig {
    pod.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(userns.clone());
    pod
}

fn with_container_userns(
    mut config: cri::ContainerConfig,
    userns: cri::UserNamespace,
) -> cri::ContainerConfig {
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(userns);
    config
}

async fn run_pod_err(
    c: &berth::client::CriClient,
    config: &cri::PodSandboxConfig,
) -> tonic::Status {
    c.runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("RunPodSandbox must fail")
}

async fn create_err(
    c: &berth::client::CriClient,
    pod: &str,
    pod_config: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> tonic::Status {
    c.runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(pod_config.clone()),
        })
        .await
        .expect_err("CreateContainer must fail")
}

/// The host uid of process `pid` (`Uid:` of its status, the real one).
fn host_uid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("Uid line")
}

#[tokio::test]
async fn a_pod_root_is_unprivileged_on_the_host_and_owns_its_files() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let (host_id, userns) = pod_ids();
    let logs = d.dir.path().join("logs");
    let pod_cfg = with_userns(
        pod_config("userns", &logs, cri::NamespaceMode::Container),
        &userns,
    );
    let pod = run_pod(&c, &pod_cfg).await;

    // A volume, as the kubelet's emptyDir: a host directory owned by host root.
    let volume = d.dir.path().join("empty-dir");
    std::fs::create_dir_all(&volume).expect("volume");
    let mut config = sh_container(
        "root-inside",
        &busybox,
        "echo made > /data/by-pod-root && touch /etc/in-rootfs && exec sleep 1000",
        cri::NamespaceMode::Container,
    );
    config.mounts.push(cri::Mount {
        container_path: "/data".into(),
        host_path: volume.display().to_string(),
        ..Default::default()
    });
    let config = with_container_userns(config, userns.clone());
    let id = run_container(&c, &pod, &pod_cfg, config).await;
    for _ in 0..100 {
        if volume.join("by-pod-root").exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // Inside: root, in a user namespace with the pod's mapping; the image's files are root's.
    assert_eq!(exec_ok(&c, &id, &["id", "-u"]).await.trim(), "0");
    let map: Vec<String> = exec_ok(&c, &id, &["cat", "/proc/self/uid_map"])
        .await
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(map, ["0", &host_id.to_string(), "65536"]);
    // The image's files, the volume, and the files Berth made for the pod are its root's.
    let owner = exec_ok(
        &c,
        &id,
        &[
            "stat",
            "-c",
            "%u:%g",
            "/bin/sh",
            "/data",
            "/etc/in-rootfs",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/dev/shm",
        ],
    )
    .await;
    assert_eq!(owner.lines().collect::<Vec<_>>(), ["0:0"; 6]);
    // Outside: the container's process runs as the pod's first host uid, not root.
    let pid = container_info(&c, &id).await["pid"].as_u64().expect("pid") as u32;
    assert_eq!(host_uid(pid), host_id);
    // What the pod's root wrote to the idmapped volume is host root's on disk.
    let written = std::fs::metadata(volume.join("by-pod-root")).expect("written by the pod");
    assert_eq!((written.uid(), written.gid()), (0, 0));
    assert_eq!(
        std::fs::read_to_string(volume.join("by-pod-root")).expect("read"),
        "made\n"
    );
    // The idmapped copies of the bind sources were only needed while the container was made.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&format!("/containers/{id}/idmapped/")),
        "no idmapped bind source is left attached"
    );

    // Refused: a container asking for another user namespace than its pod's, a user the pod's
    // namespace does not map, and another pod overlapping these host ids.
    let node = sh_container("node", &busybox, "true", cri::NamespaceMode::Container);
    let node = with_container_userns(
        node,
        cri::UserNamespace {
            mode: cri::NamespaceMode::Node as i32,
            ..Default::default()
        },
    );
    let e = create_err(&c, &pod, &pod_cfg, node).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let mut unmapped = sh_container("unmapped", &busybox, "true", cri::NamespaceMode::Container);
    unmapped
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .run_as_user = Some(cri::Int64Value { value: 70000 });
    let e = create_err(&c, &pod, &pod_cfg, unmapped).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("70000"), "{e}");
    let mut overlapping = userns.clone();
    overlapping.uids[0].host_id += 1000;
    overlapping.gids[0].host_id += 1000;
    let other = with_userns(
        pod_config("userns-other", &logs, cri::NamespaceMode::Container),
        &overlapping,
    );
    let e = run_pod_err(&c, &other).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(
        e.message().contains(&pod),
        "names the pod holding the ids: {e}"
    );
    // The same pod's next attempt shares its ids.
    let mut retry = pod_cfg.clone();
    retry.metadata.as_mut().expect("metadata").attempt = 1;
    let second = run_pod(&c, &retry).await;
    remove_pod(&c, &second).await;

    remove_pod(&c, &pod).await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir = d.dir.path().display().to_string();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir)).collect();
    assert!(left.is_empty(), "mounts left: {left:#?}");
}

/// A pod with its own user namespace on the host's network: the host's network namespace
/// and interfaces, root inside mapped to an unprivileged host range, the host's /sys bound
/// read-only (a sysfs of the host's network cannot be mounted from the pod's namespace), and
/// no power over the host's network.
#[tokio::test]
async fn a_pod_with_its_own_user_namespace_uses_the_host_network() {
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let (host_id, userns) = pod_ids();
    let logs = d.dir.path().join("logs");
    let mut pod_cfg = with_userns(
        pod_config("userns-hostnet", &logs, cri::NamespaceMode::Container),
        &userns,
    );
    pod_cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .expect("options")
        .network = cri::NamespaceMode::Node as i32;
    let pod = run_pod(&c, &pod_cfg).await;
    let config = with_container_userns(
        sh_container(
            "main",
            &busybox,
            "exec sleep 1000",
            cri::NamespaceMode::Container,
        ),
        userns.clone(),
    );
    let mut config = config;
    config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .expect("options")
        .network = cri::NamespaceMode::Node as i32;
    let id = run_container(&c, &pod, &pod_cfg, config).await;

    let host_net = std::fs::read_link("/proc/self/ns/net").expect("host netns");
    assert_eq!(
        exec_ok(&c, &id, &["readlink", "/proc/self/ns/net"])
            .await
            .trim(),
        host_net.to_string_lossy(),
        "the host's network namespace"
    );
    let map: Vec<String> = exec_ok(&c, &id, &["cat", "/proc/self/uid_map"])
        .await
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(map, ["0", &host_id.to_string(), "65536"]);
    let mut host_ifaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .expect("host interfaces")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    host_ifaces.sort();
    let mut seen: Vec<String> = exec_ok(&c, &id, &["ls", "/sys/class/net"])
        .await
        .split_whitespace()
        .map(str::to_string)
        .collect();
    seen.sort();
    assert_eq!(seen, host_ifaces, "the host's interfaces under /sys");
    // /sys is read-only, and the pod's root cannot change the host's network.
    let r = exec(&c, &id, &["touch", "/sys/berth-probe"], 10)
        .await
        .expect("exec");
    assert_ne!(r.exit_code, 0, "/sys is writable");
    let r = exec(&c, &id, &["ip", "link", "set", "lo", "mtu", "1400"], 10)
        .await
        .expect("exec");
    assert_ne!(r.exit_code, 0, "the pod's root changed the host's loopback");
    remove_pod(&c, &pod).await;
}

#[tokio::test]
async fn bad_user_namespace_options_are_refused_and_leave_nothing() {
    let d = Daemon::start();
    let c = d.client().await;
    let logs = d.dir.path().join("logs");
    let (_, good) = pod_ids();
    let mut two = good.clone();
    two.uids.push(cri::IdMapping {
        host_id: 1,
        container_id: 70000,
        length: 1,
    });
    let mut not_root = good.clone();
    not_root.uids[0].container_id = 1;
    let mut host_root = good.clone();
    host_root.uids[0].host_id = 0;
    let container_mode = cri::UserNamespace {
        mode: cri::NamespaceMode::Container as i32,
        ..Default::default()
    };
    let target_mode = cri::UserNamespace {
        mode: cri::NamespaceMode::Target as i32,
        ..Default::default()
    };
    for (what, userns) in [
        ("two mappings", &two),
        ("container id 0 unmapped", &not_root),
        ("host root mapped", &host_root),
        ("mode CONTAINER", &container_mode),
        ("mode TARGET", &target_mode),
    ] {
        let cfg = with_userns(
            pod_config("bad", &logs, cri::NamespaceMode::Container),
            userns,
        );
        let e = run_pod_err(&c, &cfg).await;
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e}");
        assert!(e.message().contains("user namespace"), "{what}: {e}");
    }
    // With the host's IPC the pod could not own its IPC namespace.
    let mut host_ipc = with_userns(
        pod_config("bad", &logs, cri::NamespaceMode::Container),
        &good,
    );
    host_ipc
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .expect("options")
        .ipc = cri::NamespaceMode::Node as i32;
    let e = run_pod_err(&c, &host_ipc).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("IPC"), "{e}");
    assert!(list_pod_sandboxes(&c).await.is_empty());
    assert!(
        std::fs::read_dir(d.state().join("sandboxes"))
            .map(|r| r.count())
            .unwrap_or(0)
            == 0,
        "no sandbox directory left"
    );
}

/// The container's process, already in the pod's user namespace, reaches its rootfs by path: a
/// root directory below one that others cannot search is refused with a clear error.
#[tokio::test]
async fn a_root_the_pod_cannot_reach_is_refused_clearly() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let c = d.client().await;
    let busybox = image("busybox");
    pull(&c, &busybox).await.expect("pull");
    let (_, userns) = pod_ids();
    let logs = d.dir.path().join("logs");
    let pod_cfg = with_userns(
        pod_config("unreachable", &logs, cri::NamespaceMode::Container),
        &userns,
    );
    let pod = run_pod(&c, &pod_cfg).await;
    let closed = d.root();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let e = create_err(
        &c,
        &pod,
        &pod_cfg,
        sh_container("c", &busybox, "true", cri::NamespaceMode::Container),
    )
    .await;
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains(&closed.display().to_string()), "{e}");
    assert!(list_containers(&c).await.is_empty());
    remove_pod(&c, &pod).await;
}
