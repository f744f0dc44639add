//! The parts of the device plugin API the sample plugin leaves out, with a plugin written here
//! against the published API: the devices it prefers (GetPreferredAllocation), device nodes,
//! env and annotations from Allocate, PreStartContainer
//! before each start when the plugin asks for it, health changes in its device list, a plugin
//! that registers before it serves, the pod resources API's Get and GetAllocatableResources,
//! and the plugin registry's answers to a plugin of a type
//! the agent does not serve and to a plugin whose socket goes away.

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
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use berth::agent::plugin_registry::api::registration_server::{
    Registration as PluginRegistration, RegistrationServer as PluginRegistrationServer,
};
use berth::agent::plugin_registry::api::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use berth::agent::pod_resources::api::pod_resources_lister_client::PodResourcesListerClient;
use berth::agent::pod_resources::api::{AllocatableResourcesRequest, GetPodResourcesRequest};
use common::{exec_ok, image};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "example.com/fake";

/// Devices `fake0` and `fake1`, each a node of the host's /dev/zero; it prefers the last of the
/// devices it is offered.
struct FakePlugin {
    devices: watch::Receiver<Vec<Device>>,
    pre_started: Arc<Mutex<Vec<Vec<String>>>>,
    /// The GetPreferredAllocation requests.
    offered: Arc<Mutex<Vec<Offer>>>,
}

/// One GetPreferredAllocation request: the devices offered and how many to take.
type Offer = (Vec<String>, i32);

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
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                if let Ok(mut o) = self.offered.lock() {
                    o.push((c.available_device_i_ds.clone(), c.allocation_size));
                }
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let from = c.available_device_i_ds.len().saturating_sub(size);
                ContainerPreferredAllocationResponse {
                    device_i_ds: c.available_device_i_ds[from..].to_vec(),
                }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
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
        get_preferred_allocation_available: true,
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
    let offered = Arc::new(Mutex::new(Vec::new()));
    let server = start_plugin(
        &dir,
        FakePlugin {
            devices,
            pre_started: pre_started.clone(),
            offered: offered.clone(),
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
    // The device the plugin preferred of those offered, not the first in ID order.
    assert_eq!(
        offered.lock().expect("lock").clone(),
        vec![(vec!["fake0".to_string(), "fake1".to_string()], 1)]
    );
    assert_eq!(held, "fake1");
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
    // The pod resources API: the pod's container holds the device, the node has both.
    let pod_resources =
        berth::client::unix_channel(&a._conf.path().join("pod-resources/kubelet.sock"))
            .await
            .expect("connect to the pod resources socket");
    let mut lister = PodResourcesListerClient::new(pod_resources);
    let got = lister
        .get(GetPodResourcesRequest {
            pod_name: "gpu".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner()
        .pod_resources
        .expect("the pod");
    assert_eq!(got.containers.len(), 1);
    assert_eq!(got.containers[0].name, "main");
    let devices = &got.containers[0].devices;
    assert_eq!(devices.len(), 1);
    assert_eq!(
        (
            devices[0].resource_name.as_str(),
            devices[0].device_ids.clone()
        ),
        (RESOURCE, vec![held.clone()])
    );
    let allocatable = lister
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner()
        .devices;
    assert_eq!(allocatable.len(), 1);
    assert_eq!(allocatable[0].device_ids, ["fake0", "fake1"]);
    let missing = lister
        .get(GetPodResourcesRequest {
            pod_name: "nosuchpod".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("an unknown pod");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert!(missing.message().contains("nosuchpod"), "{missing:?}");

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

/// A plugin's side of the plugin registry: what it says it is, and what it was told.
struct RegistryEntry {
    info: PluginInfo,
    told: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl PluginRegistration for RegistryEntry {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        if let Ok(mut t) = self.told.lock() {
            t.push(request.into_inner());
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Serves `entry` (and `plugin`, on the same socket, if given) on `socket`.
fn serve_in_registry(
    socket: &Path,
    entry: RegistryEntry,
    plugin: Option<FakePlugin>,
) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).expect("registry socket");
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PluginRegistrationServer::new(entry))
            .add_optional_service(plugin.map(DevicePluginServer::new))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_registry_takes_device_plugins_refuses_other_types_and_drops_plugins_whose_socket_goes()
 {
    let a = Agent::start();
    let registry = a._conf.path().join("plugins_registry");
    a.wait(
        "the plugin registry watched",
        Duration::from_secs(20),
        |a| a.daemon.log().contains("watching the plugin registry"),
    );
    // As a kubelet watching its registry leaves it.
    assert!(a._conf.path().join("device-plugins/DEPRECATION").exists());

    // A plugin of a type the agent does not serve is told so, naming its type.
    let csi_told = Arc::new(Mutex::new(Vec::new()));
    let csi = serve_in_registry(
        &registry.join("csi.example.com-reg.sock"),
        RegistryEntry {
            info: PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "csi.example.com".into(),
                endpoint: "/run/csi.example.com/csi.sock".into(),
                supported_versions: vec!["1.0.0".into()],
            },
            told: csi_told.clone(),
        },
        None,
    );

    // A device plugin serving its API on its registration socket (an empty endpoint); the
    // agent asks it for its options, since it gave none.
    let (_list, devices) =
        watch::channel(vec![device("fake0", "Healthy"), device("fake1", "Healthy")]);
    let told = Arc::new(Mutex::new(Vec::new()));
    let socket = registry.join("fake-reg.sock");
    let plugin = serve_in_registry(
        &socket,
        RegistryEntry {
            info: PluginInfo {
                r#type: "DevicePlugin".into(),
                name: RESOURCE.into(),
                endpoint: String::new(),
                supported_versions: vec!["v1beta1".into()],
            },
            told: told.clone(),
        },
        Some(FakePlugin {
            devices,
            pre_started: Arc::new(Mutex::new(Vec::new())),
            offered: Arc::new(Mutex::new(Vec::new())),
        }),
    );
    a.wait(
        "the registry's device plugin in the node status",
        Duration::from_secs(20),
        |a| node_devices(a) == ("2".into(), "2".into()),
    );
    a.wait("both plugins told", Duration::from_secs(20), |_| {
        !told.lock().expect("lock").is_empty() && !csi_told.lock().expect("lock").is_empty()
    });
    let status = told.lock().expect("lock")[0].clone();
    assert!(status.plugin_registered, "{status:?}");
    let status = csi_told.lock().expect("lock")[0].clone();
    assert!(!status.plugin_registered, "{status:?}");
    assert!(status.error.contains("\"CSIPlugin\""), "{status:?}");

    // Its socket removed (the plugin itself still serving its stream), the device plugin is
    // deregistered: its devices are counted, none allocatable.
    std::fs::remove_file(&socket).expect("remove the plugin's socket");
    a.wait("the plugin deregistered", Duration::from_secs(20), |a| {
        node_devices(a) == ("2".into(), "0".into())
    });
    a.finish().await;
    plugin.abort();
    csi.abort();
}
