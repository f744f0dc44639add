//! CRI `runtime.v1alpha2`, served by translating every message to and from v1 in this one place.
//!
//! v1 was born as a copy of v1alpha2 with the same field numbers, so a message re-encoded in
//! protobuf and decoded as the other version's type carries every field both know; fields only
//! v1 has stay at their defaults. Kubelets 1.20–1.25 speak v1alpha2.

use k8s_cri::v1;
use k8s_cri::v1::image_service_server::ImageService as _;
use k8s_cri::v1::runtime_service_server::RuntimeService as _;
use k8s_cri::v1alpha2 as a2;
use prost::Message;
use tonic::{Request, Response, Status};

use super::{ImageApi, RuntimeApi};

/// Re-encodes a message as another version's type.
fn translate<A: Message, B: Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("translating CRI v1alpha2 message: {e}")))
}

/// RuntimeService v1alpha2 over the v1 implementation.
#[derive(Clone)]
pub struct RuntimeV1Alpha2(pub RuntimeApi);

/// ImageService v1alpha2 over the v1 implementation.
#[derive(Clone)]
pub struct ImageV1Alpha2(pub ImageApi);

/// Writes a v1alpha2 service impl whose methods forward to v1 (the whole impl block, so that
/// `async_trait` sees the generated methods).
macro_rules! forward_impl {
    ($trait:path, $ty:ty, { $($body:tt)* } $($method:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl $trait for $ty {
            $($body)*
            $(
        async fn $method(
            &self,
            request: Request<a2::$req>,
        ) -> Result<Response<a2::$resp>, Status> {
            let req: v1::$req = translate(request.get_ref())?;
            let resp = self.0.$method(Request::new(req)).await?;
            Ok(Response::new(translate(resp.get_ref())?))
        }
            )*
        }
    };
}

forward_impl! {
    a2::runtime_service_server::RuntimeService, RuntimeV1Alpha2,
    {
    async fn version(
        &self,
        _request: Request<a2::VersionRequest>,
    ) -> Result<Response<a2::VersionResponse>, Status> {
        Ok(Response::new(translate(&super::runtime_info::version_for("v1alpha2"))?))
    }

    }
        run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
        stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
        remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
        pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse;
        list_pod_sandbox(ListPodSandboxRequest) -> ListPodSandboxResponse;
        create_container(CreateContainerRequest) -> CreateContainerResponse;
        start_container(StartContainerRequest) -> StartContainerResponse;
        stop_container(StopContainerRequest) -> StopContainerResponse;
        remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
        list_containers(ListContainersRequest) -> ListContainersResponse;
        container_status(ContainerStatusRequest) -> ContainerStatusResponse;
        update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
        reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
        exec_sync(ExecSyncRequest) -> ExecSyncResponse;
        exec(ExecRequest) -> ExecResponse;
        attach(AttachRequest) -> AttachResponse;
        port_forward(PortForwardRequest) -> PortForwardResponse;
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
        list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
        list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
        update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
        status(StatusRequest) -> StatusResponse;
}

forward_impl! {
    a2::image_service_server::ImageService, ImageV1Alpha2, {}
        list_images(ListImagesRequest) -> ListImagesResponse;
        image_status(ImageStatusRequest) -> ImageStatusResponse;
        pull_image(PullImageRequest) -> PullImageResponse;
        remove_image(RemoveImageRequest) -> RemoveImageResponse;
        image_fs_info(ImageFsInfoRequest) -> ImageFsInfoResponse;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_the_round_trip() {
        let req = a2::PullImageRequest {
            image: Some(a2::ImageSpec {
                image: "busybox".into(),
                annotations: [("a".to_string(), "b".to_string())].into(),
            }),
            auth: Some(a2::AuthConfig {
                username: "u".into(),
                password: "p".into(),
                ..Default::default()
            }),
            sandbox_config: None,
        };
        let v: v1::PullImageRequest = translate(&req).expect("to v1");
        assert_eq!(v.image.as_ref().map(|s| s.image.as_str()), Some("busybox"));
        assert_eq!(v.auth.as_ref().map(|a| a.password.as_str()), Some("p"));
        let back: a2::PullImageRequest = translate(&v).expect("back");
        assert_eq!(back, req);
    }
}
