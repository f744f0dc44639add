//! Pod sandboxes through CRI on a real berthd: namespaces, files, cgroups, retries, crash safety.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::*;
use k8s_cri::v1 as cri;
use tonic::Code;

fn pod_config(name: &str, cgroup_parent: &str, host_network: bool) -> cri::PodSandboxConfig {
    let mode = if host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: format!("{name}-host"),
        dns_config: Some(cri::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        labels: [("app".to_string(), name.to_string())].into(),
        annotations: [("note".to_string(), "berth-test".to_string())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: mode as i32,
                    ipc: mode as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sysctls: if host_network {
                HashMap::new()
            } else {
                [(
                    "net.ipv4.ip_unprivileged_port_start".to_string(),
                    "0".to_string(),
                )]
                .into()
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn run(
    c: &berth::client::CriClient,
    config: cri::PodSandboxConfig,
) -> Result<String, tonic::Status> {
    c.runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
}

async fn info(
    c: &berth::client::CriClient,
    id: &str,
) -> (cri::PodSandboxStatus, serde_json::Value) {
    let r = c
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .expect("status")
        .into_inner();
    let v = serde_json::from_str(&r.info["info"]).expect("info JSON");
    (r.status.expect("status"), v)
}

fn path(v: &serde_json::Value) -> PathBuf {
    PathBuf::from(v.as_str().unwrap_or_default())
}

/// A unique cgroup parent, removed at the end even on failure.
struct CgroupParent(String);

impl CgroupParent {
    fn new() -> Self {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).expect("random");
        Self(format!("/berth-test-{}/pod", hex::encode(b)))
    }
    fn dirs(&self) -> Vec<PathBuf> {
        berth::runtime::cgroups::Layout::detect()
            .expect("layout")
            .dirs(&self.0)
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        for d in self.dirs() {
            let _ = std::fs::remove_dir(&d);
            if let Some(p) = d.parent() {
                let _ = std::fs::remove_dir(p);
            }
        }
    }
}

#[tokio::test]
async fn sandbox_life_cycle_owns_its_namespaces_files_and_cgroup() {
    let d = Daemon::start();
    let c = d.client().await;
    let cg = CgroupParent::new();
    let id = run(&c, pod_config("web", &cg.0, false)).await.expect("run");
    let (status, v) = info(&c, &id).await;
    assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
    assert_eq!(
        status.metadata.as_ref().map(|m| m.name.as_str()),
        Some("web")
    );
    assert_eq!(status.labels["app"], "web");
    assert_eq!(status.annotations["note"], "berth-test");

    let (netns, ipcns, utsns, shm) = (
        path(&v["netns"]),
        path(&v["ipcns"]),
        path(&v["utsns"]),
        path(&v["shm"]),
    );
    for p in [&netns, &ipcns, &utsns, &shm] {
        assert!(mounted(p), "{} mounted", p.display());
    }
    let n = format!("--net={}", netns.display());
    let u = format!("--uts={}", utsns.display());
    assert_eq!(nsenter(&[&u, "hostname"]), "web-host");
    assert_eq!(
        nsenter(&[&n, "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"]),
        "0"
    );
    let resolv = std::fs::read_to_string(path(&v["resolvConf"])).expect("resolv.conf");
    assert_eq!(
        resolv,
        "search default.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    let hosts = std::fs::read_to_string(path(&v["hosts"])).expect("hosts");
    assert!(hosts.contains("web-host"));
    assert_eq!(
        std::fs::read_to_string(path(&v["hostname"])).expect("hostname"),
        "web-host\n"
    );
    for dir in cg.dirs() {
        assert!(dir.is_dir(), "pod cgroup {}", dir.display());
    }

    // List with filters.
    let list = |filter: Option<cri::PodSandboxFilter>| {
        let c = c.clone();
        async move {
            c.runtime()
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
                .await
                .expect("list")
                .into_inner()
                .items
        }
    };
    assert_eq!(list(None).await.len(), 1);
    let by_prefix = cri::PodSandboxFilter {
        id: id[..8].to_string(),
        ..Default::default()
    };
    assert_eq!(list(Some(by_prefix)).await.len(), 1);
    let by_label = cri::PodSandboxFilter {
        label_selector: [("app".to_string(), "other".to_string())].into(),
        ..Default::default()
    };
    assert!(list(Some(by_label)).await.is_empty());
    let not_ready = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxNotready as i32,
        }),
        ..Default::default()
    };
    assert!(list(Some(not_ready.clone())).await.is_empty());

    // Stop: network gone, NotReady; twice is fine.
    for _ in 0..2 {
        c.runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .expect("stop");
    }
    assert!(!mounted(&netns) && !netns.exists());
    assert_eq!(
        info(&c, &id).await.0.state,
        cri::PodSandboxState::SandboxNotready as i32
    );
    assert_eq!(list(Some(not_ready)).await.len(), 1);

    // Remove: nothing left; twice is fine; then NotFound.
    for _ in 0..2 {
        c.runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .expect("remove");
    }
    for p in [&ipcns, &utsns, &shm] {
        assert!(!mounted(p) && !p.exists(), "{} gone", p.display());
    }
    for dir in cg.dirs() {
        assert!(!dir.exists(), "pod cgroup {} removed", dir.display());
    }
    let e = c
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .expect_err("gone");
    assert_eq!(e.code(), Code::NotFound);
    assert!(list(None).await.is_empty());
}

#[tokio::test]
async fn retried_run_returns_the_same_sandbox_and_a_different_request_conflicts() {
    let d = Daemon::start();
    let c = d.client().await;
    let cg = CgroupParent::new();
    let config = pod_config("retry", &cg.0, false);
    let first = run(&c, config.clone()).await.expect("run");
    let again = run(&c, config.clone()).await.expect("retry");
    assert_eq!(first, again, "a retry gets the first call's sandbox");
    let mut other = config.clone();
    other.hostname = "something-else".into();
    let e = run(&c, other)
        .await
        .expect_err("same name, different request");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains(&first), "{}", e.message());
    // Concurrent identical requests also converge on one sandbox.
    let mut cfg2 = config.clone();
    cfg2.metadata.as_mut().expect("meta").name = "burst".into();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            let cfg = cfg2.clone();
            tokio::spawn(async move { run(&c, cfg).await })
        })
        .collect();
    let mut ids = Vec::new();
    for call in calls {
        ids.push(call.await.expect("join").expect("run"));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    for id in [first, ids[0].clone()] {
        c.runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .expect("remove");
    }
}

#[tokio::test]
async fn host_network_pod_uses_the_host_namespaces_and_files() {
    let d = Daemon::start();
    let c = d.client().await;
    let cg = CgroupParent::new();
    let id = run(&c, pod_config("hostnet", &cg.0, true))
        .await
        .expect("run");
    let (status, v) = info(&c, &id).await;
    assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
    assert!(
        v["netns"].is_null() && v["ipcns"].is_null() && v["utsns"].is_null() && v["shm"].is_null()
    );
    let hosts = std::fs::read_to_string(path(&v["hosts"])).expect("hosts");
    assert_eq!(
        hosts,
        std::fs::read_to_string("/etc/hosts").unwrap_or_default()
    );
    let node = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .to_string();
    assert_eq!(
        std::fs::read_to_string(path(&v["hostname"]))
            .expect("hostname")
            .trim(),
        node
    );
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .expect("remove");
}

#[tokio::test]
async fn bad_sandbox_requests_are_refused_and_leave_nothing() {
    let d = Daemon::start();
    let c = d.client().await;
    let cg = CgroupParent::new();
    let e = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("h", &cg.0, false)),
            runtime_handler: "kata".into(),
        })
        .await
        .expect_err("unknown handler");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("kata"));
    let mut bad = pod_config("sysctl", &cg.0, false);
    bad.linux.as_mut().expect("linux").sysctls =
        [("vm.swappiness".to_string(), "1".to_string())].into();
    let e = run(&c, bad).await.expect_err("not namespaced");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("vm.swappiness"));
    let mut escape = pod_config("cg", "/../../etc", false);
    escape.linux.as_mut().expect("linux").sysctls.clear();
    let e = run(&c, escape).await.expect_err("cgroup escape");
    assert_eq!(e.code(), Code::InvalidArgument);
    // A systemd slice name given to berthd's cgroupfs driver (this host has no systemd): no
    // directory named after it is made outside systemd's tree.
    let mut slice = pod_config("slice", "kubepods-besteffort-podx.slice", false);
    slice.linux.as_mut().expect("linux").sysctls.clear();
    let e = run(&c, slice).await.expect_err("slice under cgroupfs");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("kubepods-besteffort-podx.slice") && e.message().contains("cgroupfs"),
        "{e:?}"
    );
    let mut long = pod_config("longname", &cg.0, false);
    long.hostname = "h".repeat(65);
    let e = run(&c, long).await.expect_err("hostname too long");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("hostname"));
    let e = run(&c, cri::PodSandboxConfig::default())
        .await
        .expect_err("no metadata");
    assert_eq!(e.code(), Code::InvalidArgument);
    // Nothing left: no records, no pod dirs, no cgroup.
    let items = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .items;
    assert!(items.is_empty());
    let pods: Vec<_> = std::fs::read_dir(d.state().join("sandboxes"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(pods.is_empty(), "{pods:?}");
    for dir in cg.dirs() {
        assert!(!dir.exists());
    }
    // Unknown ids: status NotFound, stop and remove succeed.
    let e = c
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: "nope".into(),
            verbose: false,
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("nope"));
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: "nope".into(),
        })
        .await
        .expect("stop unknown");
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: "nope".into(),
        })
        .await
        .expect("remove unknown");
}

#[tokio::test]
async fn sandboxes_survive_kill_9_and_half_created_ones_are_rolled_back() {
    let mut d = Daemon::start();
    let cg = CgroupParent::new();
    let (id, before) = {
        let c = d.client().await;
        let id = run(&c, pod_config("crash", &cg.0, false))
            .await
            .expect("run");
        (id.clone(), info(&c, &id).await)
    };
    d.kill9();
    // Forge a sandbox that a crash interrupted half-way: a record in state Creating whose
    // namespaces are already pinned.
    let half_dir = d.state().join("sandboxes").join("half");
    let pins = berth::runtime::pin::PinRequest {
        net: Some(half_dir.join("netns")),
        ..Default::default()
    };
    berth::runtime::pin::pin(std::path::Path::new(env!("CARGO_BIN_EXE_berthd")), &pins)
        .await
        .expect("pin");
    {
        let store = berth::store::Store::open(&d.root().join("berth.redb")).expect("store");
        let rec = berth::runtime::sandbox::SandboxRecord {
            id: "half".into(),
            name: "half_default_uid_0".into(),
            state: berth::runtime::sandbox::SandboxState::Creating,
            created_at: 0,
            runtime_handler: String::new(),
            config_hex: String::new(),
            fingerprint_hex: String::new(),
            dir: half_dir.clone(),
            net_ns: pins.net.clone(),
            ipc_ns: None,
            uts_ns: None,
            pid_ns: None,
            pod_init: None,
            user_ns: None,
            user_ids: None,
            shm: None,
            cgroup_parent: String::new(),
            created_cgroups: Vec::new(),
            pod_ips: Vec::new(),
            decoded: Default::default(),
            list_item: Default::default(),
        };
        store
            .put_record(berth::store::SANDBOXES, "half", &rec)
            .expect("forge record");
    }
    d.spawn();
    let c = d.client().await;
    let after = info(&c, &id).await;
    assert_eq!(
        after.0,
        before.0.clone(),
        "the sandbox is exactly as before the crash"
    );
    assert!(mounted(&path(&after.1["netns"])));
    let items = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("list")
        .into_inner()
        .items;
    assert_eq!(
        items.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![id.clone()]
    );
    assert!(
        !half_dir.exists() && !mounted(&half_dir.join("netns")),
        "half-created sandbox rolled back"
    );
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .expect("remove");
}

/// The directories `rel` names under each cgroup hierarchy that has it.
fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| h.path().join(rel.trim_start_matches('/')))
        .filter(|p| p.exists())
        .collect()
}

#[tokio::test]
async fn a_cgroup_ancestor_shared_by_pods_goes_with_the_last_of_them() {
    let d = Daemon::start();
    let c = d.client().await;
    let top = format!("/berth-it-shared-{}", std::process::id());
    let first = run(&c, pod_config("first", &format!("{top}/a"), false))
        .await
        .expect("first");
    let second = run(&c, pod_config("second", &format!("{top}/b"), false))
        .await
        .expect("second");
    let dirs = cgroup_dirs;
    assert!(!dirs(&top).is_empty(), "the shared ancestor exists");
    remove_pod(&c, &first).await;
    assert!(dirs(&format!("{top}/a")).is_empty());
    assert!(!dirs(&top).is_empty(), "still used by the second pod");
    remove_pod(&c, &second).await;
    assert!(
        dirs(&top).is_empty(),
        "removed with the last pod: {:?}",
        dirs(&top)
    );
}

#[tokio::test]
async fn pods_started_while_the_maker_of_their_cgroup_ancestor_goes_inherit_it() {
    let d = Daemon::start();
    let c = d.client().await;
    let top = format!("/berth-it-handover-{}", std::process::id());
    let _cleanup = CgroupRoot::made_by_the_test(top.trim_start_matches('/').to_string());
    for round in 0..12 {
        // The first pod makes the shared ancestor; two more start beside it while it is
        // removed, a millisecond later each round, so the removal meets them at every stage
        // of their creation.
        let maker = run(
            &c,
            pod_config(&format!("maker-{round}"), &format!("{top}/m"), false),
        )
        .await
        .expect("maker");
        let starts = (0..2).map(|i| {
            let c = c.clone();
            let parent = format!("{top}/p{i}");
            async move { run(&c, pod_config(&format!("p{round}-{i}"), &parent, false)).await }
        });
        let (started, ()) = tokio::join!(futures_util::future::join_all(starts), async {
            tokio::time::sleep(std::time::Duration::from_millis(round)).await;
            remove_pod(&c, &maker).await;
        });
        let pods: Vec<String> = started
            .into_iter()
            .map(|r| r.expect("pod beside the removal"))
            .collect();
        assert!(!cgroup_dirs(&top).is_empty(), "round {round}: still in use");
        for pod in &pods {
            remove_pod(&c, pod).await;
        }
        assert!(
            cgroup_dirs(&top).is_empty(),
            "round {round}: the ancestor goes with the last pod: {:?}",
            cgroup_dirs(&top)
        );
    }
}
