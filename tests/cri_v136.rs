//! The calls cri-api added after v0.32 against a real berthd, through a gRPC client that
//! names them by their published paths: the streaming lists answer what the unary lists do
//! and go past the 16 MiB message ceiling, and UpdatePodSandboxResources records the pod's
//! resources (kept across a restart) or names an unknown sandbox.

mod common;

use std::collections::BTreeSet;

use common::*;
use k8s_cri::v1 as cri;
use prost::Message;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;

/// Every message a streaming call sends, with the unary list's request and response types.
async fn stream_all<Req, Resp>(
    c: &berth::client::CriClient,
    path: &'static str,
    req: Req,
) -> Result<Vec<Resp>, tonic::Status>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(c.channel()).max_decoding_message_size(16 << 20);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(req),
            PathAndQuery::from_static(path),
            codec,
        )
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        out.push(m);
    }
    Ok(out)
}

/// A unary call by path.
async fn unary<Req, Resp>(
    c: &berth::client::CriClient,
    path: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(c.channel());
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(
        tonic::Request::new(req),
        PathAndQuery::from_static(path),
        codec,
    )
    .await
    .map(|r| r.into_inner())
}

#[tokio::test]
async fn streaming_lists_answer_as_the_unary_lists_do() {
    let d = Daemon::start();
    let c = d.client().await;
    let img = image("busybox");
    pull(&c, &img).await.expect("pull");
    let logs = TempDir::new("stream-lists");
    let mut pods = Vec::new();
    let mut containers = Vec::new();
    for i in 0..3 {
        let config = pod_config(&format!("stream-{i}"), logs.path(), cri::NamespaceMode::Pod);
        let pod = run_pod(&c, &config).await;
        let ctr = sh_container("main", &img, "sleep 300", cri::NamespaceMode::Pod);
        containers.push(run_container(&c, &pod, &config, ctr).await);
        pods.push(pod);
    }
    let ids = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();

    let streamed: Vec<cri::ListContainersResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamContainers",
        cri::ListContainersRequest::default(),
    )
    .await
    .expect("StreamContainers");
    let listed = list_containers(&c).await;
    assert_eq!(
        ids(streamed
            .into_iter()
            .flat_map(|m| m.containers)
            .map(|c| c.id)
            .collect()),
        ids(listed.iter().map(|c| c.id.clone()).collect())
    );
    // A filter is the unary call's.
    let one: Vec<cri::ListContainersResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamContainers",
        cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: containers[1].clone(),
                ..Default::default()
            }),
        },
    )
    .await
    .expect("StreamContainers with a filter");
    let one: Vec<String> = one
        .into_iter()
        .flat_map(|m| m.containers)
        .map(|c| c.id)
        .collect();
    assert_eq!(one, vec![containers[1].clone()]);

    let sandboxes: Vec<cri::ListPodSandboxResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamPodSandboxes",
        cri::ListPodSandboxRequest::default(),
    )
    .await
    .expect("StreamPodSandboxes");
    assert_eq!(
        ids(sandboxes
            .into_iter()
            .flat_map(|m| m.items)
            .map(|s| s.id)
            .collect()),
        ids(pods.clone())
    );

    let stats: Vec<cri::ListContainerStatsResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamContainerStats",
        cri::ListContainerStatsRequest::default(),
    )
    .await
    .expect("StreamContainerStats");
    let stats: Vec<cri::ContainerStats> = stats.into_iter().flat_map(|m| m.stats).collect();
    assert_eq!(
        ids(stats
            .iter()
            .filter_map(|s| s.attributes.as_ref())
            .map(|a| a.id.clone())
            .collect()),
        ids(containers.clone())
    );
    assert!(
        stats.iter().all(|s| s
            .memory
            .as_ref()
            .is_some_and(|m| m.working_set_bytes.is_some())),
        "{stats:?}"
    );

    let pod_stats: Vec<cri::ListPodSandboxStatsResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamPodSandboxStats",
        cri::ListPodSandboxStatsRequest::default(),
    )
    .await
    .expect("StreamPodSandboxStats");
    assert_eq!(
        ids(pod_stats
            .into_iter()
            .flat_map(|m| m.stats)
            .filter_map(|s| s.attributes.map(|a| a.id))
            .collect()),
        ids(pods.clone())
    );

    let metrics: Vec<cri::ListPodSandboxMetricsResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamPodSandboxMetrics",
        cri::ListPodSandboxMetricsRequest::default(),
    )
    .await
    .expect("StreamPodSandboxMetrics");
    let unary_metrics = c
        .runtime()
        .list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest::default())
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner();
    assert_eq!(
        ids(metrics
            .into_iter()
            .flat_map(|m| m.pod_metrics)
            .map(|m| m.pod_sandbox_id)
            .collect()),
        ids(unary_metrics
            .pod_metrics
            .into_iter()
            .map(|m| m.pod_sandbox_id)
            .collect())
    );

    let images: Vec<cri::ListImagesResponse> = stream_all(
        &c,
        "/runtime.v1.ImageService/StreamImages",
        cri::ListImagesRequest::default(),
    )
    .await
    .expect("StreamImages");
    assert_eq!(
        ids(images
            .into_iter()
            .flat_map(|m| m.images)
            .map(|i| i.id)
            .collect()),
        ids(list(&c).await.into_iter().map(|i| i.id).collect())
    );

    for pod in &pods {
        remove_pod(&c, pod).await;
    }
}

#[tokio::test]
async fn a_streamed_list_goes_past_the_16_mib_message_ceiling() {
    // 40 pods with 512 KiB of annotations each: 20 MiB of list items.
    let d = Daemon::start();
    let c = d.client().await;
    let logs = TempDir::new("stream-big");
    let mut pods = Vec::new();
    for i in 0..40 {
        let mut config = pod_config(&format!("big-{i}"), logs.path(), cri::NamespaceMode::Pod);
        config
            .annotations
            .insert("bulk".into(), "x".repeat(512 * 1024));
        pods.push(run_pod(&c, &config).await);
    }
    let unary = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await;
    assert!(unary.is_err(), "the unary list fits in one message");
    let streamed: Vec<cri::ListPodSandboxResponse> = stream_all(
        &c,
        "/runtime.v1.RuntimeService/StreamPodSandboxes",
        cri::ListPodSandboxRequest::default(),
    )
    .await
    .expect("StreamPodSandboxes");
    assert!(streamed.len() > 16, "{} messages", streamed.len());
    let got: BTreeSet<String> = streamed
        .into_iter()
        .flat_map(|m| m.items)
        .inspect(|s| assert_eq!(s.annotations["bulk"].len(), 512 * 1024))
        .map(|s| s.id)
        .collect();
    assert_eq!(got, pods.iter().cloned().collect());
    for pod in &pods {
        remove_pod(&c, pod).await;
    }
}

/// `runtime.v1.UpdatePodSandboxResourcesRequest`, as the published API numbers it.
#[derive(Clone, PartialEq, prost::Message)]
struct UpdatePodSandboxResourcesRequest {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    overhead: Option<cri::LinuxContainerResources>,
    #[prost(message, optional, tag = "3")]
    resources: Option<cri::LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct UpdatePodSandboxResourcesResponse {}

async fn pod_resources(c: &berth::client::CriClient, id: &str) -> serde_json::Value {
    let resp = c
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(&resp.info["info"]).expect("verbose info JSON");
    info["podResources"].clone()
}

#[tokio::test]
async fn update_pod_sandbox_resources_records_them_and_names_an_unknown_pod() {
    let mut d = Daemon::start();
    let c = d.client().await;
    let logs = TempDir::new("pod-resize");
    let config = pod_config("resize", logs.path(), cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &config).await;
    let path = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";
    let update = UpdatePodSandboxResourcesRequest {
        pod_sandbox_id: pod.clone(),
        overhead: Some(cri::LinuxContainerResources {
            cpu_shares: 25,
            ..Default::default()
        }),
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 256 << 20,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            ..Default::default()
        }),
    };
    let _: UpdatePodSandboxResourcesResponse = unary(&c, path, update)
        .await
        .expect("UpdatePodSandboxResources");
    let check = |r: &serde_json::Value| {
        assert_eq!(r["resources"]["memory_limit_in_bytes"], 256 << 20, "{r}");
        assert_eq!(r["resources"]["cpu_quota"], 50_000, "{r}");
        assert_eq!(r["overhead"]["cpu_shares"], 25, "{r}");
    };
    check(&pod_resources(&c, &pod).await);
    // Kept in the record: a restarted berthd reports the same.
    d.stop();
    d.spawn();
    let c = d.client().await;
    check(&pod_resources(&c, &pod).await);

    let e = unary::<_, UpdatePodSandboxResourcesResponse>(
        &c,
        path,
        UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "no-such-pod".into(),
            ..Default::default()
        },
    )
    .await
    .expect_err("unknown pod");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("no-such-pod"), "{}", e.message());
    remove_pod(&c, &pod).await;
}

/// A CreateContainerRequest with its config as bytes, as a v0.36 client writes it (with
/// `stop_signal` (18), or an env value that is not UTF-8).
#[derive(Clone, PartialEq, prost::Message)]
struct CreateWithRawConfig {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(bytes = "vec", tag = "2")]
    config: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    sandbox_config: Option<cri::PodSandboxConfig>,
}

/// The part of a v0.36 ContainerStatusResponse this test reads: `status.stop_signal` (19).
#[derive(Clone, PartialEq, prost::Message)]
struct StatusStopSignal {
    #[prost(message, optional, tag = "1")]
    status: Option<StopSignalOnly>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StopSignalOnly {
    #[prost(int32, tag = "19")]
    stop_signal: i32,
}

/// The CRI `Signal` values of SIGUSR1 and SIGTERM.
const CRI_SIGUSR1: i32 = 29;
const CRI_SIGTERM: i32 = 23;

async fn stop_signal_reported(c: &berth::client::CriClient, id: &str) -> i32 {
    let s: StatusStopSignal = unary(
        c,
        "/runtime.v1.RuntimeService/ContainerStatus",
        cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        },
    )
    .await
    .expect("ContainerStatus");
    s.status.map_or(0, |s| s.stop_signal)
}

#[tokio::test]
async fn the_config_s_stop_signal_stops_the_container_and_is_reported() {
    let d = Daemon::start();
    let c = d.client().await;
    let img = image("busybox");
    pull(&c, &img).await.expect("pull");
    let logs = TempDir::new("stop-signal");
    let pod_cfg = pod_config("stopsig", logs.path(), cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &pod_cfg).await;
    // SIGUSR1 ends it with 7; SIGTERM is ignored, so only the asked-for signal ends it early.
    let script = "trap 'exit 7' USR1; trap '' TERM; echo ready; while true; do sleep 0.1; done";
    let config = sh_container("usr1", &img, script, cri::NamespaceMode::Pod);
    let mut config_bytes = config.encode_to_vec();
    prost::encoding::int32::encode(18, &CRI_SIGUSR1, &mut config_bytes);
    let created: cri::CreateContainerResponse = unary(
        &c,
        "/runtime.v1.RuntimeService/CreateContainer",
        CreateWithRawConfig {
            pod_sandbox_id: pod.clone(),
            config: config_bytes,
            sandbox_config: Some(pod_cfg.clone()),
        },
    )
    .await
    .expect("CreateContainer with a stop signal");
    let id = created.container_id;
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("StartContainer");
    assert_eq!(stop_signal_reported(&c, &id).await, CRI_SIGUSR1);
    // Once the trap is set (it echoes first), a stop with a long grace period.
    let log = logs.path().join("usr1.log");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("ready")
    {
        assert!(
            started.elapsed().as_secs() < 20,
            "the container never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 60,
        })
        .await
        .expect("StopContainer");
    let status = container_status(&c, &id).await.expect("ContainerStatus");
    assert_eq!(status.exit_code, 7, "ended by SIGUSR1's trap: {status:?}");

    // Without one: SIGTERM (the image has no StopSignal), reported as such.
    let plain = sh_container("plain", &img, "sleep 300", cri::NamespaceMode::Pod);
    let plain = run_container(&c, &pod, &pod_cfg, plain).await;
    assert_eq!(stop_signal_reported(&c, &plain).await, CRI_SIGTERM);
    // A value the enum lacks is refused, naming the container.
    let mut bad = sh_container("bad", &img, "true", cri::NamespaceMode::Pod).encode_to_vec();
    prost::encoding::int32::encode(18, &99, &mut bad);
    let e = unary::<_, cri::CreateContainerResponse>(
        &c,
        "/runtime.v1.RuntimeService/CreateContainer",
        CreateWithRawConfig {
            pod_sandbox_id: pod.clone(),
            config: bad,
            sandbox_config: Some(pod_cfg.clone()),
        },
    )
    .await
    .expect_err("stop signal 99");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("bad") && e.message().contains("99"),
        "{}",
        e.message()
    );
    remove_pod(&c, &pod).await;
}

/// A ContainerConfig's bytes whose mounts carry `image_sub_path` (10) as a v0.36 client
/// writes it: `config` without mounts, then each mount with its sub path.
fn config_with_image_sub_paths(
    config: &cri::ContainerConfig,
    mounts: &[(cri::Mount, &str)],
) -> Vec<u8> {
    let mut bytes = cri::ContainerConfig {
        mounts: Vec::new(),
        ..config.clone()
    }
    .encode_to_vec();
    for (mount, sub_path) in mounts {
        let mut m = mount.encode_to_vec();
        prost::encoding::string::encode(10, &sub_path.to_string(), &mut m);
        prost::encoding::bytes::encode(7, &m, &mut bytes);
    }
    bytes
}

#[tokio::test]
async fn an_image_volume_mounts_its_sub_path_and_a_missing_one_is_refused() {
    let mut d = Daemon::start();
    let c = d.client().await;
    let img = image("busybox");
    pull(&c, &img).await.expect("pull");
    let logs = TempDir::new("image-sub-path");
    let pod_cfg = pod_config("subpath", logs.path(), cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &pod_cfg).await;
    let volume = cri::Mount {
        container_path: "/vol".into(),
        readonly: true,
        image: Some(cri::ImageSpec {
            image: img.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let create = |name: &str, sub_path: &'static str| {
        let config = sh_container(name, &img, "sleep 300", cri::NamespaceMode::Pod);
        CreateWithRawConfig {
            pod_sandbox_id: pod.clone(),
            config: config_with_image_sub_paths(&config, &[(volume.clone(), sub_path)]),
            sandbox_config: Some(pod_cfg.clone()),
        }
    };
    let path = "/runtime.v1.RuntimeService/CreateContainer";
    let made: cri::CreateContainerResponse = unary(&c, path, create("etc", "etc"))
        .await
        .expect("CreateContainer with an image sub path");
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: made.container_id.clone(),
        })
        .await
        .expect("StartContainer");
    // /vol is the image's /etc, not its root.
    let out = exec_ok(&c, &made.container_id, &["ls", "/vol"]).await;
    assert!(out.contains("passwd") && !out.contains("bin"), "{out}");
    // The status names the volume's image by digest (v0.36 `ImageSpec.image_ref`), in the form
    // of the container's own image_ref (the same image here); k8s-cri's reader still sees the
    // one mount.
    let mounts = status_mounts(&c, &made.container_id).await;
    let plain = container_status(&c, &made.container_id)
        .await
        .expect("ContainerStatus");
    assert_eq!(plain.mounts.len(), 1, "{:?}", plain.mounts);
    assert_eq!(plain.mounts[0].container_path, "/vol");
    assert_eq!(mounts.len(), 1);
    let image_ref = mounts[0].image.as_ref().map(|i| i.image_ref.clone());
    assert!(
        image_ref.as_deref().is_some_and(|r| r.contains("@sha256:")),
        "{image_ref:?}"
    );
    assert_eq!(image_ref.as_deref(), Some(plain.image_ref.as_str()));
    // And the directory of it mounted (v0.36 `Mount.image_sub_path`), after a restart of
    // berthd too.
    assert_eq!(mounts[0].image_sub_path, "etc");
    drop(c);
    d.stop();
    d.spawn();
    let c = d.client().await;
    let mounts = status_mounts(&c, &made.container_id).await;
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].image_sub_path, "etc");

    let before = list_containers(&c).await.len();
    let snapshots = d.snapshot_dirs();
    let e = unary::<_, cri::CreateContainerResponse>(&c, path, create("missing", "no/such/dir"))
        .await
        .expect_err("a sub path the image lacks");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("image_sub_path") && e.message().contains("no/such/dir"),
        "{}",
        e.message()
    );
    assert_eq!(
        list_containers(&c).await.len(),
        before,
        "a refused container left behind"
    );
    assert_eq!(
        d.snapshot_dirs(),
        snapshots,
        "the refused volume's snapshot left behind"
    );
    remove_pod(&c, &pod).await;
}

/// The mounts of container `id`'s status, as a v0.36 client reads them.
async fn status_mounts(c: &berth::client::CriClient, id: &str) -> Vec<MountImageRef> {
    let status: StatusMounts = unary(
        c,
        "/runtime.v1.RuntimeService/ContainerStatus",
        cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        },
    )
    .await
    .expect("ContainerStatus");
    status.status.expect("status").mounts
}

/// The part of a v0.36 ContainerStatusResponse this test reads: `status.mounts[].image.image_ref`
/// and `status.mounts[].image_sub_path`.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusMounts {
    #[prost(message, optional, tag = "1")]
    status: Option<MountsOnly>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MountsOnly {
    #[prost(message, repeated, tag = "14")]
    mounts: Vec<MountImageRef>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MountImageRef {
    #[prost(message, optional, tag = "9")]
    image: Option<ImageRefOnly>,
    #[prost(string, tag = "10")]
    image_sub_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageRefOnly {
    #[prost(string, tag = "20")]
    image_ref: String,
}

/// The part of a v0.36 StatusResponse this test reads: `features.user_namespaces_host_network`.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusFeatures {
    #[prost(message, optional, tag = "4")]
    features: Option<FeaturesV136>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FeaturesV136 {
    #[prost(bool, tag = "1")]
    supplemental_groups_policy: bool,
    #[prost(bool, tag = "2")]
    user_namespaces_host_network: bool,
}

#[tokio::test]
async fn status_reports_user_namespaces_with_the_host_network_where_user_namespaces_work() {
    let d = Daemon::start();
    let c = d.client().await;
    let status = c
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .into_inner();
    let userns = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .and_then(|h| h.features.as_ref())
        .is_some_and(|f| f.user_namespaces);
    let v136: StatusFeatures = unary(
        &c,
        "/runtime.v1.RuntimeService/Status",
        cri::StatusRequest::default(),
    )
    .await
    .expect("Status");
    let features = v136.features.expect("features");
    assert_eq!(features.user_namespaces_host_network, userns);
    // The crate's own field, merged from the first message, is still there.
    assert!(features.supplemental_groups_policy);
}

#[tokio::test]
async fn an_env_value_that_is_not_utf8_reaches_the_process_with_replacement_characters() {
    let d = Daemon::start();
    let c = d.client().await;
    let img = image("busybox");
    pull(&c, &img).await.expect("pull");
    let logs = TempDir::new("env-bytes");
    let pod_cfg = pod_config("envbytes", logs.path(), cri::NamespaceMode::Pod);
    let pod = run_pod(&c, &pod_cfg).await;
    let mut config = sh_container("env", &img, "sleep 300", cri::NamespaceMode::Pod);
    config.envs.push(cri::KeyValue {
        key: "LATIN1".into(),
        value: "caf_".into(),
    });
    // Latin-1 "café" (0xe9 is no UTF-8): KeyValue.value is bytes in v0.36.
    let mut config_bytes = config.encode_to_vec();
    let at = config_bytes
        .windows(4)
        .position(|w| w == b"caf_")
        .expect("value");
    config_bytes[at + 3] = 0xe9;
    let created: cri::CreateContainerResponse = unary(
        &c,
        "/runtime.v1.RuntimeService/CreateContainer",
        CreateWithRawConfig {
            pod_sandbox_id: pod.clone(),
            config: config_bytes,
            sandbox_config: Some(pod_cfg.clone()),
        },
    )
    .await
    .expect("CreateContainer with a Latin-1 env value");
    let id = created.container_id;
    c.runtime()
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("StartContainer");
    let seen = exec_ok(
        &c,
        &id,
        &["sh", "-c", "printf %s \"$LATIN1\" | od -An -tx1"],
    )
    .await;
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        ["63", "61", "66", "ef", "bf", "bd"],
        "c a f U+FFFD"
    );
    remove_pod(&c, &pod).await;
}
