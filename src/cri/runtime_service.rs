//! CRI RuntimeService: the runtime's calls, each handed to its service file or the runtime core.

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::events_service::EventSource;
use super::stats_service::{self, StatsCollector};
use super::{container_service, metrics_service, runtime_info, sandbox_service};
use crate::image::ImageManager;
use crate::runtime::container::{ContainerManager, ContainerRecord, ContainerState};
use crate::runtime::events::EventKind;
use crate::runtime::sandbox::{SandboxManager, SandboxRecord, SandboxState};

/// The RuntimeService.
#[derive(Clone)]
pub struct RuntimeApi {
    images: ImageManager,
    sandboxes: Arc<SandboxManager>,
    containers: Arc<ContainerManager>,
    stats: Arc<StatsCollector>,
    stream: Option<Arc<crate::stream::StreamServer>>,
    events: EventSource,
}

/// Runs a call that makes something on the host to its end in a task of its own, even when the
/// caller goes away first (deadline, disconnect): cut short, it would leave half a pod or a
/// container behind. A retry meanwhile finds the name reserved and waits for this result.
async fn to_completion<T: Send + 'static>(
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

    fn stream_server(&self) -> Result<&Arc<crate::stream::StreamServer>, Status> {
        self.stream
            .as_ref()
            .ok_or_else(|| Status::unavailable("the streaming server is not running"))
    }

    /// Checks the streams asked for by Exec and Attach, as the kubelet does.
    fn check_streams(
        call: &str,
        tty: bool,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    ) -> Result<(), Status> {
        if !(stdin || stdout || stderr) {
            return Err(Status::invalid_argument(format!(
                "{call}: one of stdin, stdout or stderr must be set"
            )));
        }
        if tty && stderr {
            return Err(Status::invalid_argument(format!(
                "{call}: tty and stderr cannot both be set (a tty merges stderr into stdout)"
            )));
        }
        Ok(())
    }

    /// Stats of the containers passing `filter`, read off the async threads (cgroupfs and
    /// snapshot walks block).
    async fn container_stats_list(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>, Status> {
        let all = self.containers.stored()?;
        if filter.is_none() {
            let ids: HashSet<String> = all.iter().map(|r| r.id.clone()).collect();
            self.stats.prune(Some(&ids), None);
        }
        let recs: Vec<_> = all
            .into_iter()
            .filter(|r| stats_service::container_matches(r, filter.as_ref()))
            .collect();
        let stats = self.stats.clone();
        let snapshots = self.images.snapshotter();
        tokio::task::spawn_blocking(move || {
            recs.iter()
                .map(|r| stats.container(r, &snapshots))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| Status::internal(format!("container stats: {e}")))
    }

    /// Stats of the given sandboxes with their containers.
    async fn pod_stats_list(
        &self,
        sandboxes: Vec<SandboxRecord>,
        prune: bool,
    ) -> Result<Vec<cri::PodSandboxStats>, Status> {
        let all = self.containers.stored()?;
        if prune {
            let ids: HashSet<String> = all.iter().map(|c| c.id.clone()).collect();
            self.stats.prune(Some(&ids), None);
        }
        let stats = self.stats.clone();
        let snapshots = self.images.snapshotter();
        tokio::task::spawn_blocking(move || {
            let mut by_sandbox: HashMap<&str, Vec<ContainerRecord>> = HashMap::new();
            for c in all.iter().filter(|c| c.state != ContainerState::Creating) {
                by_sandbox
                    .entry(c.sandbox_id.as_str())
                    .or_default()
                    .push(c.clone());
            }
            let one = |s: &SandboxRecord| {
                let mine = by_sandbox.get(s.id.as_str()).map_or(&[][..], Vec::as_slice);
                stats.sandbox(s, mine, &snapshots)
            };
            stats_service::spread_over_cores(&sandboxes, one)
        })
        .await
        .map_err(|e| Status::internal(format!("pod sandbox stats: {e}")))
    }
}

/// Writes the service impl: `async_trait` must see the generated methods, so the macro emits
/// the whole impl block around the hand-written ones.
#[tonic::async_trait]
impl RuntimeService for RuntimeApi {
    async fn version(
        &self,
        _request: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(runtime_info::version_v1()))
    }

    async fn status(
        &self,
        request: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        let verbose = request.get_ref().verbose;
        let mut resp = runtime_info::status(verbose, self.sandboxes.network().map(|n| n.as_ref()));
        if verbose {
            let pulls: Vec<serde_json::Value> = self
                .images
                .pulls_in_progress()
                .into_iter()
                .map(|(image, layers)| serde_json::json!({ "image": image, "layers": layers }))
                .collect();
            // An object, not an array: crictl only pretty-prints values that start with `{`.
            resp.info.insert(
                "pulls".into(),
                serde_json::json!({ "inProgress": pulls }).to_string(),
            );
            resp.info.insert(
                "events".into(),
                serde_json::json!({ "subscribers": self.containers.events().subscribers() })
                    .to_string(),
            );
        }
        Ok(Response::new(resp))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        let (sandboxes, containers) = (self.sandboxes.clone(), self.containers.clone());
        let req = request.into_inner();
        let pod_sandbox_id = to_completion(async move {
            let (id, made) = sandboxes.run(&req).await?;
            // A retry returns the first call's sandbox, whose events went out with it.
            if made {
                containers.emit_sandbox(EventKind::Created, &id);
                containers.emit_sandbox(EventKind::Started, &id);
            }
            Ok(id)
        })
        .await?;
        Ok(Response::new(cri::RunPodSandboxResponse { pod_sandbox_id }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        let id = &request.get_ref().pod_sandbox_id;
        // Its containers first (the CRI asks StopPodSandbox to stop them all).
        let ready = self
            .sandboxes
            .find(id)
            .ok()
            .filter(|s| s.state == SandboxState::Ready);
        if let Ok(sandbox) = self.sandboxes.get(id) {
            for c in self.containers.in_sandbox(&sandbox.id)? {
                self.containers.stop(&c, 0).await?;
            }
        }
        self.sandboxes.stop(id).await?;
        if let Some(s) = ready {
            self.containers.emit_sandbox(EventKind::Stopped, &s.id);
        }
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        let id = &request.get_ref().pod_sandbox_id;
        let existed = self.sandboxes.find(id).ok();
        if let Some(sandbox) = &existed {
            for c in self.containers.in_sandbox(&sandbox.id)? {
                self.containers.remove(&c).await?;
            }
        }
        self.sandboxes.remove(id).await?;
        if let Some(s) = existed {
            self.containers.emit_sandbox(EventKind::Deleted, &s.id);
        }
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        let req = request.get_ref();
        let rec = self.sandboxes.find(&req.pod_sandbox_id)?;
        // CHECK only when asked for details (the kubelet polls the plain status often), and then
        // its last result: the plugins run in the background.
        let check = if req.verbose {
            self.sandboxes.last_network_check(&rec)
        } else {
            None
        };
        Ok(Response::new(sandbox_service::status(
            &rec,
            req.verbose,
            check,
        )))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        Ok(Response::new(sandbox_service::list(
            &self.sandboxes,
            request.get_ref().filter.as_ref(),
        )?))
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        let recs = self.containers.list(request.get_ref().filter.as_ref());
        Ok(Response::new(cri::ListContainersResponse {
            containers: recs
                .iter()
                .map(|r| container_service::to_list_item(r))
                .collect(),
        }))
    }

    async fn list_container_stats(
        &self,
        request: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        let stats = self
            .container_stats_list(request.into_inner().filter)
            .await?;
        Ok(Response::new(cri::ListContainerStatsResponse { stats }))
    }

    async fn container_stats(
        &self,
        request: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        let rec = self.containers.get(&request.get_ref().container_id)?;
        let filter = cri::ContainerStatsFilter {
            id: rec.id.clone(),
            ..Default::default()
        };
        let stats = self
            .container_stats_list(Some(filter))
            .await?
            .into_iter()
            .next();
        match stats {
            Some(s) => Ok(Response::new(cri::ContainerStatsResponse {
                stats: Some(s),
            })),
            None => Err(Status::not_found(format!("container {} not found", rec.id))),
        }
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        let rec = self.sandboxes.get(&request.get_ref().pod_sandbox_id)?;
        let stats = self
            .pod_stats_list(vec![rec], false)
            .await?
            .into_iter()
            .next();
        Ok(Response::new(cri::PodSandboxStatsResponse { stats }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        let filter = request.into_inner().filter;
        let all = self.sandboxes.list()?;
        let prune = filter.is_none();
        if prune {
            let ids: HashSet<String> = all.iter().map(|r| r.id.clone()).collect();
            self.stats.prune(None, Some(&ids));
        }
        let pod_filter = filter.map(|f| cri::PodSandboxFilter {
            id: f.id,
            state: None,
            label_selector: f.label_selector,
        });
        let sandboxes: Vec<SandboxRecord> = all
            .into_iter()
            .filter(|s| s.state != SandboxState::Creating)
            .filter(|s| {
                pod_filter
                    .as_ref()
                    .is_none_or(|f| SandboxManager::matches(s, f))
            })
            .map(|s| SandboxRecord::clone(&s))
            .collect();
        let stats = self.pod_stats_list(sandboxes, prune).await?;
        Ok(Response::new(cri::ListPodSandboxStatsResponse { stats }))
    }

    async fn update_container_resources(
        &self,
        request: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        let req = request.get_ref();
        self.containers
            .update_resources(&req.container_id, req.linux.as_ref(), self.stats.layout())
            .await?;
        Ok(Response::new(cri::UpdateContainerResourcesResponse {}))
    }

    /// Stopping an unknown or exited container succeeds, as the CRI requires.
    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        let req = request.get_ref();
        self.containers.stop(&req.container_id, req.timeout).await?;
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    /// Removing an unknown container succeeds, as the CRI requires.
    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        self.containers
            .remove(&request.get_ref().container_id)
            .await?;
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        let containers = self.containers.clone();
        let req = Arc::new(request.into_inner());
        let container_id = to_completion(async move { Ok(containers.create(req).await?) }).await?;
        Ok(Response::new(cri::CreateContainerResponse { container_id }))
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        let req = request.get_ref();
        let r = self
            .containers
            .exec_sync(&req.container_id, &req.cmd, req.timeout)
            .await?;
        Ok(Response::new(cri::ExecSyncResponse {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
        }))
    }

    async fn exec(
        &self,
        request: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        let req = request.into_inner();
        let server = self.stream_server()?;
        if req.cmd.is_empty() {
            return Err(Status::invalid_argument("Exec: cmd is empty"));
        }
        Self::check_streams("Exec", req.tty, req.stdin, req.stdout, req.stderr)?;
        let rec = self.containers.running(&req.container_id, "Exec")?;
        // The client connects to the URL at once and the process will join the container's
        // cgroups: the head start on the cgroup-attach lock.
        crate::runtime::cgroup_attach::prime();
        let url = server.url_for(crate::stream::Pending::Exec(cri::ExecRequest {
            container_id: rec.id.clone(),
            ..req
        }));
        Ok(Response::new(cri::ExecResponse { url }))
    }

    async fn attach(
        &self,
        request: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        let req = request.into_inner();
        let server = self.stream_server()?;
        Self::check_streams("Attach", req.tty, req.stdin, req.stdout, req.stderr)?;
        let rec = self.containers.running(&req.container_id, "Attach")?;
        let url = server.url_for(crate::stream::Pending::Attach(cri::AttachRequest {
            container_id: rec.id.clone(),
            ..req
        }));
        Ok(Response::new(cri::AttachResponse { url }))
    }

    async fn port_forward(
        &self,
        request: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        let req = request.into_inner();
        let server = self.stream_server()?;
        if let Some(p) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(Status::invalid_argument(format!(
                "PortForward: invalid port {p}"
            )));
        }
        let rec = self.sandboxes.get(&req.pod_sandbox_id)?;
        if rec.state != SandboxState::Ready {
            return Err(Status::failed_precondition(format!(
                "PortForward: pod sandbox {} is not ready",
                rec.id
            )));
        }
        let url = server.url_for(crate::stream::Pending::PortForward(
            cri::PortForwardRequest {
                pod_sandbox_id: rec.id,
                port: req.port,
            },
        ));
        Ok(Response::new(cri::PortForwardResponse { url }))
    }

    async fn reopen_container_log(
        &self,
        request: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        self.containers
            .reopen_log(&request.get_ref().container_id)
            .await?;
        Ok(Response::new(cri::ReopenContainerLogResponse {}))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        self.containers
            .start(&request.get_ref().container_id)
            .await?;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        let req = request.get_ref();
        let rec = self.containers.status(&req.container_id)?;
        Ok(Response::new(container_service::status(
            &rec,
            &self.images,
            req.verbose,
        )))
    }

    async fn runtime_config(
        &self,
        _request: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        Ok(Response::new(runtime_info::runtime_config()))
    }

    async fn update_runtime_config(
        &self,
        request: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        // The pod CIDR is kept and offered to plugins that ask for the ipRanges capability.
        let cidr = request
            .get_ref()
            .runtime_config
            .as_ref()
            .and_then(|c| c.network_config.as_ref())
            .map(|n| n.pod_cidr.clone())
            .unwrap_or_default();
        if let Some(net) = self.sandboxes.network()
            && !cidr.is_empty()
        {
            net.set_pod_cidr(&cidr);
        }
        Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
    }

    type GetContainerEventsStream = super::events_service::EventStream;

    async fn get_container_events(
        &self,
        _request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        Ok(Response::new(self.events.stream()))
    }

    async fn checkpoint_container(
        &self,
        request: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        let id = &request.get_ref().container_id;
        let rec = self.containers.running(id, "CheckpointContainer")?;
        let reason = tokio::task::spawn_blocking(super::checkpoint::criu_unusable)
            .await
            .map_err(|e| Status::internal(format!("CheckpointContainer: {e}")))?;
        Err(Status::failed_precondition(format!(
            "CheckpointContainer {}: checkpoints need CRIU, and {reason}",
            rec.id
        )))
    }

    async fn list_metric_descriptors(
        &self,
        _request: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        Ok(Response::new(cri::ListMetricDescriptorsResponse {
            descriptors: metrics_service::descriptors(self.stats.layout()),
        }))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _request: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        let sandboxes: Vec<SandboxRecord> = self
            .sandboxes
            .list()?
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| SandboxRecord::clone(s))
            .collect();
        let containers = self.containers.stored()?;
        let stats = self.stats.clone();
        let snapshots = self.images.snapshotter();
        let pod_metrics = tokio::task::spawn_blocking(move || {
            let mut by_sandbox: HashMap<&str, Vec<ContainerRecord>> = HashMap::new();
            for c in containers.iter().filter(|c| c.is_active()) {
                by_sandbox
                    .entry(c.sandbox_id.as_str())
                    .or_default()
                    .push(ContainerRecord::clone(c));
            }
            let layer_fs = metrics_service::LayerFs::measure(&snapshots);
            stats_service::spread_over_cores(&sandboxes, |s| {
                let mine = by_sandbox.get(s.id.as_str()).map_or(&[][..], Vec::as_slice);
                metrics_service::pod_metrics(&stats, s, mine, &snapshots, layer_fs.as_ref())
            })
        })
        .await
        .map_err(|e| Status::internal(format!("ListPodSandboxMetrics: {e}")))?;
        Ok(Response::new(cri::ListPodSandboxMetricsResponse {
            pod_metrics,
        }))
    }
}
