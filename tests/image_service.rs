//! ImageService through a real berthd and a real registry: pull, list, status, remove, fs info.

mod common;

use common::*;
use k8s_cri::v1 as cri;

#[tokio::test]
async fn pull_list_status_remove_round_trip() {
    let d = Daemon::start();
    let c = d.client().await;
    let reference = image("busybox:latest");
    let id = pull(&c, &reference).await.expect("pull busybox");
    assert!(
        id.starts_with("sha256:") && id.len() == 71,
        "image ref is an id: {id}"
    );

    let images = list(&c).await;
    assert_eq!(images.len(), 1);
    let img = &images[0];
    assert_eq!(img.id, id);
    assert_eq!(img.repo_tags, vec![reference.clone()]);
    assert_eq!(img.repo_digests.len(), 1);
    assert!(img.repo_digests[0].starts_with(&format!("{}/busybox@sha256:", registry())));
    assert!(img.size > 500_000, "size counts layers: {}", img.size);

    // The same image by id, short id, tag, and digest reference.
    let short = &id["sha256:".len().."sha256:".len() + 12];
    for name in [
        id.as_str(),
        short,
        reference.as_str(),
        img.repo_digests[0].as_str(),
    ] {
        let s = status(&c, name)
            .await
            .unwrap_or_else(|| panic!("status by {name}"));
        assert_eq!(s.id, id, "status by {name}");
    }
    // Filtered list.
    let filtered = c
        .images()
        .list_images(cri::ListImagesRequest {
            filter: Some(cri::ImageFilter {
                image: spec(&reference),
            }),
        })
        .await
        .expect("filtered list")
        .into_inner()
        .images;
    assert_eq!(filtered.len(), 1);

    // Verbose status carries the config as JSON.
    let verbose = c
        .images()
        .image_status(cri::ImageStatusRequest {
            image: spec(&reference),
            verbose: true,
        })
        .await
        .expect("verbose status")
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(verbose.info.get("info").expect("info key")).expect("info is JSON");
    assert_eq!(info["id"], id);
    assert_eq!(info["imageSpec"]["config"]["Cmd"][0], "sh");

    // ImageFsInfo sees the layers.
    let fs = c
        .images()
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .expect("fs info")
        .into_inner();
    let used = fs.image_filesystems[0]
        .used_bytes
        .as_ref()
        .map(|u| u.value)
        .unwrap_or(0);
    let inodes = fs.image_filesystems[0]
        .inodes_used
        .as_ref()
        .map(|u| u.value)
        .unwrap_or(0);
    assert!(used > 1_000_000, "image fs used bytes {used}");
    assert!(inodes > 100, "image fs inodes {inodes}");
    assert!(!d.snapshot_dirs().is_empty());

    // Remove by tag removes the image with every name, and its layers.
    c.images()
        .remove_image(cri::RemoveImageRequest {
            image: spec(&reference),
        })
        .await
        .expect("remove");
    assert!(list(&c).await.is_empty());
    assert!(status(&c, &id).await.is_none(), "gone by id too");
    assert!(
        status(&c, &img.repo_digests[0]).await.is_none(),
        "gone by digest too"
    );
    assert!(
        d.snapshot_dirs().is_empty(),
        "layers freed: {:?}",
        d.snapshot_dirs()
    );
    // Idempotent.
    c.images()
        .remove_image(cri::RemoveImageRequest {
            image: spec(&reference),
        })
        .await
        .expect("second remove is not an error");
}

#[tokio::test]
async fn docker_schema2_and_oci_images_share_layers_and_remove_keeps_shared_ones() {
    let d = Daemon::start();
    let c = d.client().await;
    let docker = pull(&c, &image("busybox:latest"))
        .await
        .expect("docker v2s2");
    let oci = pull(&c, &image("busybox:oci")).await.expect("oci");
    let layers = pull(&c, &image("layers")).await.expect("layers");
    assert_ne!(docker, layers);
    let all = list(&c).await;
    assert!(all.len() >= 2);
    let before = d.snapshot_dirs().len();
    // `layers` sits on busybox's layer; removing busybox must keep what `layers` uses.
    for id in [&docker, &oci] {
        c.images()
            .remove_image(cri::RemoveImageRequest { image: spec(id) })
            .await
            .expect("remove busybox");
    }
    assert!(status(&c, &layers).await.is_some());
    assert_eq!(d.snapshot_dirs().len(), before, "shared layers stay");
    assert_eq!(
        status(&c, &image("layers"))
            .await
            .map(|i| i.uid.map(|u| u.value)),
        Some(Some(1000))
    );
}

#[tokio::test]
async fn multi_platform_index_resolves_to_the_host_platform() {
    let d = Daemon::start();
    let c = d.client().await;
    let id = pull(&c, &image("multiarch")).await.expect("pull index");
    let verbose = c
        .images()
        .image_status(cri::ImageStatusRequest {
            image: spec(&id),
            verbose: true,
        })
        .await
        .expect("status")
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).expect("info JSON");
    let want = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(info["imageSpec"]["architecture"], want);
    // The repo digest is the index's digest (what the tag points to).
    let img = status(&c, &id).await.expect("status");
    let index_digest = img.repo_digests[0]
        .split('@')
        .nth(1)
        .expect("digest")
        .to_string();
    assert_ne!(
        format!("{}", info["manifestDigest"].as_str().unwrap_or_default()),
        index_digest
    );
}

#[tokio::test]
async fn version_speaks_v1_and_v1alpha2() {
    let d = Daemon::start();
    let c = d.client().await;
    let v = c
        .runtime()
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .expect("v1 version")
        .into_inner();
    assert_eq!(v.runtime_name, "berth");
    assert_eq!(v.runtime_api_version, "v1");
    let mut old = k8s_cri::v1alpha2::runtime_service_client::RuntimeServiceClient::new(c.channel());
    let v = old
        .version(k8s_cri::v1alpha2::VersionRequest {
            version: "v1alpha2".into(),
        })
        .await
        .expect("v1alpha2 version")
        .into_inner();
    assert_eq!(v.runtime_api_version, "v1alpha2");
    // v1alpha2 image calls reach the same store.
    let mut old_images =
        k8s_cri::v1alpha2::image_service_client::ImageServiceClient::new(c.channel());
    let pulled = old_images
        .pull_image(k8s_cri::v1alpha2::PullImageRequest {
            image: Some(k8s_cri::v1alpha2::ImageSpec {
                image: image("busybox"),
                annotations: Default::default(),
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("v1alpha2 pull")
        .into_inner();
    assert_eq!(
        status(&c, &image("busybox")).await.map(|i| i.id),
        Some(pulled.image_ref)
    );

    let s = c
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("status")
        .into_inner();
    let conds = s.status.expect("conditions").conditions;
    let get = |t: &str| conds.iter().find(|c| c.r#type == t).map(|c| c.status);
    assert_eq!(get("RuntimeReady"), Some(true));
    assert_eq!(get("NetworkReady"), Some(false), "no CNI yet: honest");
    let rc = c
        .runtime()
        .runtime_config(cri::RuntimeConfigRequest {})
        .await
        .expect("runtime config")
        .into_inner();
    assert_eq!(
        rc.linux.map(|l| l.cgroup_driver),
        Some(cri::CgroupDriver::Cgroupfs as i32)
    );
    // No containers exist yet: the list is empty, unknown ids are NotFound, and stop/remove
    // of an unknown container succeed as the CRI requires.
    let listed = c
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("list containers")
        .into_inner();
    assert!(listed.containers.is_empty());
    let err = c
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: "ghost".into(),
            verbose: false,
        })
        .await
        .expect_err("unknown container");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("ghost"));
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: "ghost".into(),
            timeout: 0,
        })
        .await
        .expect("stop unknown");
    c.runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: "ghost".into(),
        })
        .await
        .expect("remove unknown");
    let err = c
        .runtime()
        .exec(cri::ExecRequest {
            container_id: "ghost".into(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect_err("unknown container");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn images_survive_a_restart() {
    let mut d = Daemon::start();
    let id = {
        let c = d.client().await;
        pull(&c, &image("busybox")).await.expect("pull")
    };
    d.stop();
    assert!(!d.socket().exists(), "clean shutdown removes the socket");
    d.spawn();
    let c = d.client().await;
    let imgs = list(&c).await;
    assert_eq!(
        imgs.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![id]
    );
}

#[tokio::test]
async fn second_daemon_on_the_same_root_is_refused_and_stale_socket_replaced() {
    let mut d = Daemon::start();
    let out = d.command().output().expect("run second berthd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already running"), "clear message: {err}");
    // The first one still answers.
    let c = d.client().await;
    assert!(list(&c).await.is_empty());
    drop(c);
    // A crash leaves the socket file behind; the next start replaces it.
    d.kill9();
    assert!(d.socket().exists());
    d.spawn();
    let c = d.client().await;
    assert!(list(&c).await.is_empty());
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(d.socket()).expect("socket").permissions(),
    );
    assert_eq!(mode & 0o777, 0o660);
}

#[tokio::test]
async fn hosts_toml_mirrors_are_used_in_order_with_fallback() {
    // Written before start: registry.example.test is served by the local registry, behind a
    // dead mirror that must be skipped.
    let dir = TempDir::new("hosts");
    let certs = dir.path().join("registry.example.test");
    std::fs::create_dir_all(&certs).expect("mkdir");
    std::fs::write(
        certs.join("hosts.toml"),
        format!(
            "server = \"http://{reg}\"\n[host.\"http://127.0.0.1:1\"]\n  capabilities = [\"pull\", \"resolve\"]\n[host.\"http://{reg}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            reg = registry()
        ),
    )
    .expect("hosts.toml");
    let d = Daemon::start_with(&["--registry-config-dir", &dir.path().to_string_lossy()]);
    let c = d.client().await;
    let id = pull(&c, "registry.example.test/busybox")
        .await
        .expect("pull through mirror");
    let img = status(&c, "registry.example.test/busybox:latest")
        .await
        .expect("by its own name");
    assert_eq!(img.id, id);
    assert_eq!(
        img.repo_tags,
        vec!["registry.example.test/busybox:latest".to_string()]
    );
}

#[tokio::test]
async fn verbose_status_reports_pull_progress_per_layer() {
    let d = Daemon::start_with(&["--max-concurrent-downloads", "1"]);
    let c = d.client().await;
    let reference = image("large");
    let puller = {
        let c = c.clone();
        let r = reference.clone();
        tokio::spawn(async move { pull(&c, &r).await })
    };
    let mut seen_partial = false;
    let mut seen_layers = 0;
    while !puller.is_finished() {
        let s = c
            .runtime()
            .status(cri::StatusRequest { verbose: true })
            .await
            .expect("status")
            .into_inner();
        let pulls: serde_json::Value =
            serde_json::from_str(&s.info["pulls"]).expect("pulls is JSON");
        for p in pulls["inProgress"].as_array().expect("inProgress list") {
            assert_eq!(p["image"], reference.clone() + ":latest");
            let layers = p["layers"].as_array().expect("layers");
            seen_layers = seen_layers.max(layers.len());
            seen_partial |= layers.iter().any(|l| {
                let (r, t) = (
                    l["received"].as_u64().unwrap_or(0),
                    l["total"].as_u64().unwrap_or(0),
                );
                r > 0 && r < t
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    puller.await.expect("join").expect("pull");
    assert_eq!(seen_layers, 9, "busybox + 8 layers listed");
    assert!(seen_partial, "a layer was seen part-way through");
    let s = c
        .runtime()
        .status(cri::StatusRequest { verbose: true })
        .await
        .expect("status")
        .into_inner();
    let pulls: serde_json::Value = serde_json::from_str(&s.info["pulls"]).expect("JSON");
    assert_eq!(pulls["inProgress"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn loopback_registries_need_no_flag_and_plain_http_over_https_is_named() {
    // `localhost:<port>` is not among the daemon's insecure registries: HTTPS fails on the
    // plain-HTTP test registry, and the pull goes on over HTTP.
    let port = registry().rsplit_once(':').map(|(_, p)| p.to_string());
    let port = port.expect("test registry port");
    let d = Daemon::start();
    let c = d.client().await;
    let by_localhost = format!("localhost:{port}/busybox");
    let id = pull(&c, &by_localhost).await.expect("pull from loopback");
    assert_eq!(
        status(&c, &format!("{by_localhost}:latest"))
            .await
            .expect("status")
            .id,
        id
    );
    drop(c);

    // A server named with https:// in hosts.toml gets HTTPS only; when it answers plain HTTP
    // the error says so and what to do.
    let dir = TempDir::new("plainhttp");
    let host_dir = dir.path().join("registry.example.test");
    std::fs::create_dir_all(&host_dir).expect("mkdir");
    std::fs::write(
        host_dir.join("hosts.toml"),
        format!("server = \"https://localhost:{port}\"\n"),
    )
    .expect("hosts.toml");
    let d = Daemon::start_with(&["--registry-config-dir", &dir.path().to_string_lossy()]);
    let c = d.client().await;
    let e = pull(&c, "registry.example.test/busybox")
        .await
        .expect_err("HTTPS to a plain-HTTP registry");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("plain HTTP") && e.message().contains("--insecure-registry"),
        "{e:?}"
    );
    assert!(list(&c).await.is_empty());
}
