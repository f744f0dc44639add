//! CDI devices through CreateContainer, from spec files of the test's own making in two spec
//! directories: a YAML file mapping /dev/zero under a new name with a mount, environment, an
//! additional group and a createRuntime hook that writes a marker on the host; a JSON file in
//! the later directory mapping /dev/null, named through a `cdi.k8s.io/` annotation. An unknown
//! device is refused with InvalidArgument naming it, and leaves no container behind.

mod common;

use common::*;
use k8s_cri::v1 as cri;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_devices_bring_their_nodes_mounts_env_and_hooks() {
    let dir = TempDir::new("cdi");
    let (etc, run) = (dir.path().join("etc-cdi"), dir.path().join("run-cdi"));
    std::fs::create_dir_all(&etc).expect("dir");
    std::fs::create_dir_all(&run).expect("dir");
    let shared = dir.path().join("shared.txt");
    std::fs::write(&shared, "from the host\n").expect("write");
    let marker = dir.path().join("hook-ran");
    std::fs::write(
        etc.join("berth-test.yaml"),
        format!(
            "cdiVersion: 0.6.0
kind: berth.test/dev
containerEdits:
  env: [CDI_SPEC=yes]
devices:
- name: zero
  containerEdits:
    env: [CDI_DEVICE=zero]
    deviceNodes:
    - path: /dev/berth-zero
      hostPath: /dev/zero
      permissions: rw
    mounts:
    - hostPath: {shared}
      containerPath: /etc/cdi-shared
      options: [ro, bind]
    additionalGids: [4321]
    hooks:
    - hookName: createRuntime
      path: /bin/sh
      args: [sh, -c, 'echo ran > {marker}']
",
            shared = shared.display(),
            marker = marker.display()
        ),
    )
    .expect("write");
    // The same name in the earlier directory is overridden by the later one's.
    let null_spec = |host: &str| {
        format!(
            r#"{{"cdiVersion":"0.8.0","kind":"berth.test/null","devices":[{{"name":"null","containerEdits":{{"deviceNodes":[{{"path":"/dev/berth-null","hostPath":"{host}"}}]}}}}]}}"#
        )
    };
    std::fs::write(etc.join("null.json"), null_spec("/dev/full")).expect("write");
    std::fs::write(run.join("null.json"), null_spec("/dev/null")).expect("write");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\ncdi_spec_dirs = [{:?}, {:?}]\n",
            etc.display().to_string(),
            run.display().to_string()
        ),
    )
    .expect("config");

    let d = Daemon::start_with(&["--config", &config.to_string_lossy()]);
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let pod_cfg = pod_config("cdi", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &pod_cfg).await;
    let with_devices = |name: &str, devices: &[&str], annotated: &str| {
        let mut cfg = sh_container(
            name,
            &image("busybox"),
            "exec sleep 600",
            cri::NamespaceMode::Container,
        );
        cfg.cdi_devices = devices
            .iter()
            .map(|n| cri::CdiDevice {
                name: n.to_string(),
            })
            .collect();
        if !annotated.is_empty() {
            cfg.annotations
                .insert("cdi.k8s.io/test".into(), annotated.into());
        }
        cfg
    };
    let id = run_container(
        &c,
        &pod,
        &pod_cfg,
        with_devices("dev", &["berth.test/dev=zero"], "berth.test/null=null"),
    )
    .await;

    let zeros = exec_ok(
        &c,
        &id,
        &["sh", "-c", "head -c 4 /dev/berth-zero | od -An -tx1"],
    )
    .await;
    assert_eq!(zeros.trim(), "00 00 00 00", "the node reads as /dev/zero");
    exec_ok(&c, &id, &["sh", "-c", "echo gone > /dev/berth-null"]).await;
    let kinds = exec_ok(
        &c,
        &id,
        &["sh", "-c", "ls -l /dev/berth-zero /dev/berth-null"],
    )
    .await;
    assert!(
        kinds.contains("1,   5") && kinds.contains("1,   3"),
        "/dev/berth-zero is 1,5 and /dev/berth-null 1,3 (the later directory's):\n{kinds}"
    );
    assert_eq!(
        exec_ok(&c, &id, &["cat", "/etc/cdi-shared"]).await,
        "from the host\n"
    );
    let refused = exec(&c, &id, &["sh", "-c", "echo x > /etc/cdi-shared"], 10)
        .await
        .expect("ExecSync");
    assert_ne!(refused.exit_code, 0, "the mount is read-only");
    let env = exec_ok(&c, &id, &["env"]).await;
    assert!(
        env.contains("CDI_SPEC=yes\n") && env.contains("CDI_DEVICE=zero\n"),
        "{env}"
    );
    let groups = exec_ok(&c, &id, &["id", "-G"]).await;
    assert!(groups.split_whitespace().any(|g| g == "4321"), "{groups}");
    assert_eq!(
        std::fs::read_to_string(&marker).expect("the createRuntime hook ran"),
        "ran\n"
    );

    // An unknown device: InvalidArgument naming it, and nothing made.
    let before = list_containers(&c).await.len();
    let e = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(with_devices("unknown", &["berth.test/dev=nine"], "")),
            sandbox_config: Some(pod_cfg.clone()),
        })
        .await
        .expect_err("an unknown CDI device is refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("berth.test/dev=nine"), "{e:?}");
    let e = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(with_devices("malformed", &[], "no-kind")),
            sandbox_config: Some(pod_cfg.clone()),
        })
        .await
        .expect_err("a malformed CDI name is refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("no-kind"), "{e:?}");
    assert_eq!(
        list_containers(&c).await.len(),
        before,
        "nothing left behind"
    );
    let bundles = std::fs::read_dir(d.root().join("containers"))
        .expect("containers dir")
        .count();
    assert_eq!(bundles, 1, "only the first container's bundle");
    remove_pod(&c, &pod).await;
}
