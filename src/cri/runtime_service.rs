//! CRI RuntimeService: the service the gRPC server calls; each call is handed to its group's file.

use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};

use super::events_service::{self, EventSource};
use super::stats_service::{self, StatsCollector};
use super::{
    checkpoint, container_service, metrics_service, runtime_info, sandbox_service, stream_service,
};
use crate::image::ImageManager;
use crate::runtime::container::ContainerManager;
use crate::runtime::sandbox::SandboxManager;

/// The RuntimeService: the managers its calls reach.
#[derive(Clone)]
pub struct RuntimeApi {
    pub(super) images: ImageManager,
    pub(super) sandboxes: Arc<SandboxManager>,
    pub(super) containers: Arc<ContainerManager>,
    pub(super) stats: Arc<StatsCollector>,
    pub(super) stream: Option<Arc<crate::stream::StreamServer>>,
    pub(super) events: EventSource,
}

/// Runs a call that makes something on the host to its end in a task of its own, even when the
/// caller goes away first (deadline, disconnect): cut short, it would leave half a pod or a
/// container behind. A retry meanwhile finds the name reserved and waits for this result.
pub(super) async fn to_completion<T: Send + 'static>(
    call: impl std::future::Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(tracing::Instrument::in_current_span(call))
        .await
        .map_err(|e| Status::internal(format!("the call's task ended: {e}")))?
}

impl RuntimeApi {
    /// The sandbox manager behind the pod sandbox calls.
    pub(super) fn sandboxes(&self) -> &SandboxManager {
        &self.sandboxes
    }

    /// The container manager behind the container calls.
    pub(super) fn containers(&self) -> &ContainerManager {
        &self.containers
    }

    /// A runtime service; `images` also feeds the verbose status (pulls in progress).
    pub fn new(
        images: ImageManager,
        sandboxes: Arc<SandboxManager>,
        containers: Arc<ContainerManager>,
    ) -> Self {
        let events = EventSource {
            bus: containers.events().clone(),
            sandboxes: sandboxes.clone(),
            images: images.clone(),
        };
        Self {
            images,
            sandboxes,
            containers,
            stats: Arc::new(StatsCollector::new()),
            stream: None,
            events,
        }
    }

    /// Serves Exec, Attach and PortForward URLs from `server`.
    pub fn with_stream_server(mut self, server: Arc<crate::stream::StreamServer>) -> Self {
        self.stream = Some(server);
        self
    }
}

/// Each call is handed to the file of its group: `runtime_info` (Version, Status, runtime
/// config), `sandbox_service`, `container_service`, `stream_service` (ExecSync, Exec, Attach,
/// PortForward), `stats_service`, `metrics_service`, `events_service` and `checkpoint`.
#[tonic::async_trait]
impl RuntimeService for RuntimeApi {
    async fn version(
        &self,
        request: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        runtime_info::version(self, request).await
    }

    async fn status(
        &self,
        request: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        runtime_info::status(self, request).await
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        sandbox_service::run_pod_sandbox(self, request).await
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        sandbox_service::stop_pod_sandbox(self, request).await
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        sandbox_service::remove_pod_sandbox(self, request).await
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        sandbox_service::pod_sandbox_status(self, request).await
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        sandbox_service::list_pod_sandbox(self, request).await
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        container_service::list_containers(self, request).await
    }

    async fn list_container_stats(
        &self,
        request: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        stats_service::list_container_stats(self, request).await
    }

    async fn container_stats(
        &self,
        request: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        stats_service::container_stats(self, request).await
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        stats_service::pod_sandbox_stats(self, request).await
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        stats_service::list_pod_sandbox_stats(self, request).await
    }

    async fn update_container_resources(
        &self,
        request: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        container_service::update_container_resources(self, request).await
    }

    /// Stopping an unknown or exited container succeeds, as the CRI requires.
    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        container_service::stop_container(self, request).await
    }

    /// Removing an unknown container succeeds, as the CRI requires.
    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        container_service::remove_container(self, request).await
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        container_service::create_container(self, request).await
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        stream_service::exec_sync(self, request).await
    }

    async fn exec(
        &self,
        request: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        stream_service::exec(self, request).await
    }

    async fn attach(
        &self,
        request: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        stream_service::attach(self, request).await
    }

    async fn port_forward(
        &self,
        request: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        stream_service::port_forward(self, request).await
    }

    async fn reopen_container_log(
        &self,
        request: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        container_service::reopen_container_log(self, request).await
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        container_service::start_container(self, request).await
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        container_service::container_status(self, request).await
    }

    async fn runtime_config(
        &self,
        request: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        runtime_info::runtime_config(self, request).await
    }

    async fn update_runtime_config(
        &self,
        request: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        runtime_info::update_runtime_config(self, request).await
    }

    type GetContainerEventsStream = super::events_service::EventStream;

    async fn get_container_events(
        &self,
        request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        events_service::get_container_events(self, request).await
    }

    async fn checkpoint_container(
        &self,
        request: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        checkpoint::checkpoint_container(self, request).await
    }

    async fn list_metric_descriptors(
        &self,
        request: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        metrics_service::list_metric_descriptors(self, request).await
    }

    async fn list_pod_sandbox_metrics(
        &self,
        request: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        metrics_service::list_pod_sandbox_metrics(self, request).await
    }
}
