//! The parts of the device plugin API the sample plugin leaves out, with a plugin written here
//! against the published API: device nodes, env and annotations from Allocate, PreStartContainer
//! before each start when the plugin asks for it, health changes in its device list, and a
//! plugin that registers before it serves.

mod agent_support;
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_support::*;
use berth::agent::devices::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use berth::agent::devices::api::registration_client::RegistrationClient;
use berth::agent::devices::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    DeviceSpec, Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use common::{exec_ok, image};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "example.com/fake";

/// Devices `fake0` and `fake1`, each a node of the host's /dev/zero.
struct FakePlugin {
    devices: watch::Receiver<Vec<Device>>,
    pre_started: Arc<Mutex<Vec<Vec<String>>>>,
}

type DeviceLists =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for FakePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceLists;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        // The current list, then each new one.
        let first = self.devices.borrow().clone();
        let lists = futures_util::stream::unfold(
            (Some(first), self.devices.clone()),
            |(first, mut rx)| async move {
                let devices = match first {
                    Some(d) => d,
                    None => {
                        rx.changed().await.ok()?;
                        rx.borrow_and_update().clone()
                    }
                };
                Some((Ok(ListAndWatchResponse { devices }), (None, rx)))
            },
        );
        Ok(Response::new(Box::pin(lists)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preference"))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| ContainerAllocateResponse {
                envs: [("FAKE_DEVICES".to_string(), c.devices_i_ds.join(","))].into(),
                devices: c
                    .devices_i_ds
                    .iter()
                    .map(|id| DeviceSpec {
                        container_path: format!("/dev/{id}"),
                        host_path: "/dev/zero".into(),
                        permissions: "rw".into(),
                    })
                    .collect(),
                annotations: [(
                    "example.com/fake-devices".to_string(),
                    c.devices_i_ds.join(","),
                )]
                .into(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        if let Ok(mut p) = self.pre_started.lock() {
            p.push(request.into_inner().devices_i_ds);
        }
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: false,
    }
}

fn device(id: &str, health: &str) -> Device {
    Device {
        id: id.into(),
        health: health.into(),
        topology: None,
    }
}

/// Registers the plugin on `dir/kubelet.sock`, then serves it on `dir/fake.sock` half a second
/// later (the agent must wait for a plugin that registers before it serves).
async fn start_plugin(dir: &Path, plugin: FakePlugin) -> tokio::task::JoinHandle<()> {
    let socket = dir.join("fake.sock");
    let _ = std::fs::remove_file(&socket);
    let channel = berth::client::unix_channel(&dir.join("kubelet.sock"))
        .await
        .expect("connect to kubelet.sock");
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "fake.sock".into(),
            resource_name: RESOURCE.into(),
            options: Some(options()),
        })
        .await
        .expect("Register");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = tokio::net::UnixListener::bind(&socket).expect("plugin socket");
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

fn node_devices(a: &Agent) -> (String, String) {
    let node = a.get("/node").1;
    let of = |field: &str| {
        node["status"][field][RESOURCE]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    (of("capacity"), of("allocatable"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_answers_reach_the_container_and_health_changes_reach_the_node() {
    let a = Agent::start();
    let dir = a._conf.path().join("device-plugins");
    a.wait("the registration socket", Duration::from_secs(20), |_| {
        dir.join("kubelet.sock").exists()
    });
    let (list, devices) =
        watch::channel(vec![device("fake0", "Healthy"), device("fake1", "Healthy")]);
    let pre_started = Arc::new(Mutex::new(Vec::new()));
    let server = start_plugin(
        &dir,
        FakePlugin {
            devices,
            pre_started: pre_started.clone(),
        },
    )
    .await;
    a.wait(
        "the devices in the node status",
        Duration::from_secs(20),
        |a| node_devices(a) == ("2".into(), "2".into()),
    );

    a.write(
        "gpu.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: gpu\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {img}\n    command: [\"sleep\", \"1000\"]\n    resources:\n      limits:\n        {RESOURCE}: \"1\"\n",
            img = image("busybox")
        ),
    );
    let pod = a.wait_pod("default", "gpu", "running", |p| running(p, "main"));
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    let held = exec_ok(&c, &id, &["sh", "-c", "echo $FAKE_DEVICES"]).await;
    let held = held.trim().to_string();
    assert!(["fake0", "fake1"].contains(&held.as_str()), "{held}");
    // The device node is the host's /dev/zero, readable and writable in the container.
    let read = exec_ok(
        &c,
        &id,
        &[
            "sh",
            "-c",
            &format!("head -c 3 /dev/{held} | od -An -tx1 && echo x > /dev/{held}"),
        ],
    )
    .await;
    assert_eq!(
        read.split_whitespace().collect::<Vec<_>>(),
        ["00", "00", "00"]
    );
    let annotations: HashMap<String, String> = containers(&c)
        .await
        .into_iter()
        .find(|ct| ct.id == id)
        .map(|ct| ct.annotations)
        .unwrap_or_default();
    assert_eq!(
        annotations
            .get("example.com/fake-devices")
            .map(String::as_str),
        Some(held.as_str())
    );
    // Told before the container started.
    assert_eq!(
        pre_started.lock().expect("lock").clone(),
        vec![vec![held.clone()]]
    );

    // A device turning unhealthy leaves the node with one allocatable.
    list.send(vec![
        device("fake0", "Healthy"),
        device("fake1", "Unhealthy"),
    ])
    .expect("send");
    a.wait("one device allocatable", Duration::from_secs(20), |a| {
        node_devices(a) == ("2".into(), "1".into())
    });
    a.finish().await;
    server.abort();
}
