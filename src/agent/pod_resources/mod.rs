//! The pod resources API, as the kubelet serves it on `kubelet.sock` in its pod resources
//! directory: node-local monitoring agents (GPU exporters among them) ask which devices each
//! pod's containers hold (List, Get) and which the node has (GetAllocatableResources). The
//! agent has no CPU or memory manager, so no container holds CPUs or memory of its own.

pub mod api;

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tonic::{Request, Response, Status};

use crate::agent::AgentContext;
use crate::agent::devices::DeviceManager;
use crate::agent::devices::assign::DeviceIds;
use api::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use api::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

/// The socket's name in the pod resources directory.
pub const SOCKET_NAME: &str = "kubelet.sock";

struct Lister {
    ctx: Arc<AgentContext>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pod_resources = self
            .ctx
            .pods
            .list()
            .iter()
            .map(|pod| resources_of(pod, &self.ctx.devices))
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse {
            devices: devices_of(&self.ctx.devices.healthy_devices()),
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let key = (r.pod_namespace.clone(), r.pod_name.clone());
        let pod = self.ctx.pods.get(&key).ok_or_else(|| {
            Status::not_found(format!(
                "pod {:?} in namespace {:?} is not on this node",
                r.pod_name, r.pod_namespace
            ))
        })?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(resources_of(&pod, &self.ctx.devices)),
        }))
    }
}

/// What the containers of `pod` hold: its app containers and its sidecars (restartable init
/// containers), which run beside them.
fn resources_of(pod: &Pod, devices: &DeviceManager) -> PodResources {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let held = devices.pod_devices(uid);
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let apps = spec.map(|s| s.containers.iter()).into_iter().flatten();
    let containers = sidecars
        .chain(apps)
        .map(|c| ContainerResources {
            name: c.name.clone(),
            devices: held.get(&c.name).map(devices_of).unwrap_or_default(),
            ..Default::default()
        })
        .collect();
    PodResources {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        containers,
    }
}

/// Device IDs by resource, as the API gives them.
fn devices_of(ids: &DeviceIds) -> Vec<ContainerDevices> {
    ids.iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(resource, ids)| ContainerDevices {
            resource_name: resource.clone(),
            device_ids: ids.clone(),
            topology: None,
        })
        .collect()
}

/// Serves the API on `kubelet.sock` in `dir` until berthd ends.
pub async fn serve(dir: PathBuf, ctx: Arc<AgentContext>) {
    let socket = dir.join(SOCKET_NAME);
    let listener = match crate::agent::grpc_socket::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(socket = %socket.display(), error = %e, "pod resources API not served (set agent.pod_resources_dir)");
            return;
        }
    };
    tracing::info!(socket = %socket.display(), "serving the pod resources API");
    let routes = tonic::service::Routes::new(PodResourcesListerServer::new(Lister { ctx }));
    crate::agent::grpc_socket::serve(listener, routes, "pod resources").await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_given_by_resource_leaving_out_resources_with_none() {
        let ids: DeviceIds = [
            (
                "example.com/gpu".to_string(),
                vec!["g1".into(), "g0".into()],
            ),
            ("example.com/nic".to_string(), vec![]),
        ]
        .into();
        let given = devices_of(&ids);
        assert_eq!(given.len(), 1);
        assert_eq!(given[0].resource_name, "example.com/gpu");
        assert_eq!(given[0].device_ids, ["g1", "g0"]);
    }

    #[test]
    fn a_pod_lists_its_sidecars_and_app_containers_but_not_its_init_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {
                "initContainers": [
                    {"name": "setup"},
                    {"name": "proxy", "restartPolicy": "Always"}
                ],
                "containers": [{"name": "main"}]
            }
        }))
        .expect("pod");
        let dir = std::env::temp_dir().join(format!("berth-podres-{}", std::process::id()));
        let devices = DeviceManager::new(&dir, &dir.join("devices.json"));
        let listed = resources_of(&pod, &devices);
        let names: Vec<&str> = listed.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            (listed.name.as_str(), listed.namespace.as_str()),
            ("p", "ns")
        );
        assert_eq!(names, ["proxy", "main"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
