//! CRI pod sandbox calls: RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus,
//! ListPodSandbox.

use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::{RuntimeApi, to_completion};
use crate::runtime::events::EventKind;
use crate::runtime::sandbox::{SandboxError, SandboxManager, SandboxRecord, SandboxState};

impl From<SandboxError> for Status {
    fn from(e: SandboxError) -> Self {
        let msg = e.to_string();
        match e {
            SandboxError::InvalidArgument(_) => Status::invalid_argument(msg),
            SandboxError::NotFound(_) => Status::not_found(msg),
            SandboxError::FailedPrecondition(_) => Status::failed_precondition(msg),
            SandboxError::NameInUse { .. } => Status::already_exists(msg),
            SandboxError::Internal(_) => Status::internal(msg),
        }
    }
}

fn state(rec: &SandboxRecord) -> i32 {
    match rec.state {
        SandboxState::Ready => cri::PodSandboxState::SandboxReady as i32,
        SandboxState::Creating | SandboxState::NotReady => {
            cri::PodSandboxState::SandboxNotready as i32
        }
    }
}

/// The pod's IP and additional IPs (dual stack), while it is ready.
fn network_status(rec: &SandboxRecord) -> cri::PodSandboxNetworkStatus {
    let mut ips = rec
        .pod_ips
        .iter()
        .filter(|_| rec.state == SandboxState::Ready);
    cri::PodSandboxNetworkStatus {
        ip: ips.next().cloned().unwrap_or_default(),
        additional_ips: ips.map(|ip| cri::PodIp { ip: ip.clone() }).collect(),
    }
}

/// PodSandboxStatus; `verbose` adds the info JSON, with the CNI CHECK outcome if there was one.
pub fn status(
    rec: &SandboxRecord,
    verbose: bool,
    network_check: Option<String>,
) -> cri::PodSandboxStatusResponse {
    let config = rec.config_ref();
    let ns = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let mut info = std::collections::HashMap::new();
    if verbose {
        info.insert(
            "info".to_string(),
            serde_json::json!({
                "id": rec.id,
                "name": rec.name,
                "state": format!("{:?}", rec.state),
                "netns": rec.net_ns,
                "podIPs": rec.pod_ips,
                "ipcns": rec.ipc_ns,
                "utsns": rec.uts_ns,
                "shm": rec.shm,
                "hostname": rec.file("hostname"),
                "hosts": rec.file("hosts"),
                "resolvConf": rec.file("resolv.conf"),
                "cgroupParent": rec.cgroup_parent,
                "runtimeHandler": rec.runtime_handler,
                "networkCheck": network_check,
                "podResources": config.linux.as_ref().map(|l| serde_json::json!({
                    "overhead": l.overhead,
                    "resources": l.resources,
                })),
            })
            .to_string(),
        );
    }
    cri::PodSandboxStatusResponse {
        status: Some(cri::PodSandboxStatus {
            id: rec.id.clone(),
            metadata: config.metadata.clone(),
            state: state(rec),
            created_at: rec.created_at,
            network: Some(network_status(rec)),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace { options: ns }),
            }),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            runtime_handler: rec.runtime_handler.clone(),
        }),
        info,
        containers_statuses: Vec::new(),
        timestamp: crate::util::unix_nanos_now(),
    }
}

/// ListPodSandbox.
pub fn list(
    manager: &SandboxManager,
    filter: Option<&cri::PodSandboxFilter>,
) -> Result<cri::ListPodSandboxResponse, Status> {
    let items = listed(manager, filter)?
        .iter()
        .map(|r| list_item(r))
        .collect();
    Ok(cri::ListPodSandboxResponse { items })
}

/// The sandboxes ListPodSandbox answers with for `filter`.
pub fn listed(
    manager: &SandboxManager,
    filter: Option<&cri::PodSandboxFilter>,
) -> Result<Vec<std::sync::Arc<SandboxRecord>>, Status> {
    Ok(manager
        .list()?
        .into_iter()
        .filter(|r| r.state != SandboxState::Creating)
        .filter(|r| filter.is_none_or(|f| SandboxManager::matches(r, f)))
        .collect())
}

/// A ListPodSandbox item.
pub fn list_item(r: &SandboxRecord) -> cri::PodSandbox {
    let config = r.config_ref();
    cri::PodSandbox {
        id: r.id.clone(),
        metadata: config.metadata.clone(),
        state: state(r),
        created_at: r.created_at,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        runtime_handler: r.runtime_handler.clone(),
    }
}

pub(super) async fn run_pod_sandbox(
    api: &RuntimeApi,
    request: Request<cri::RunPodSandboxRequest>,
) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
    let (sandboxes, containers) = (api.sandboxes.clone(), api.containers.clone());
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

pub(super) async fn stop_pod_sandbox(
    api: &RuntimeApi,
    request: Request<cri::StopPodSandboxRequest>,
) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
    let id = &request.get_ref().pod_sandbox_id;
    // No container is created in the pod until it is stopped (and then none can be).
    let _held = api.sandboxes.hold(id).await;
    // Its containers first (the CRI asks StopPodSandbox to stop them all).
    let ready = api
        .sandboxes
        .find(id)
        .ok()
        .filter(|s| s.state == SandboxState::Ready);
    if let Ok(sandbox) = api.sandboxes.get(id) {
        for c in api.containers.in_sandbox(&sandbox.id)? {
            api.containers.stop(&c, 0).await?;
        }
    }
    api.sandboxes.stop(id).await?;
    if let Some(s) = ready {
        api.containers.emit_sandbox(EventKind::Stopped, &s.id);
    }
    Ok(Response::new(cri::StopPodSandboxResponse {}))
}

pub(super) async fn remove_pod_sandbox(
    api: &RuntimeApi,
    request: Request<cri::RemovePodSandboxRequest>,
) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
    let id = &request.get_ref().pod_sandbox_id;
    // No container is created in the pod while its containers are listed and removed.
    let _held = api.sandboxes.hold(id).await;
    let existed = api.sandboxes.find(id).ok();
    if let Some(sandbox) = &existed {
        for c in api.containers.in_sandbox(&sandbox.id)? {
            api.containers.remove(&c).await?;
        }
    }
    api.sandboxes.remove(id).await?;
    if let Some(s) = existed {
        api.containers.emit_sandbox(EventKind::Deleted, &s.id);
    }
    Ok(Response::new(cri::RemovePodSandboxResponse {}))
}

pub(super) async fn pod_sandbox_status(
    api: &RuntimeApi,
    request: Request<cri::PodSandboxStatusRequest>,
) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
    let req = request.get_ref();
    let rec = api.sandboxes.find(&req.pod_sandbox_id)?;
    // CHECK only when asked for details (the kubelet polls the plain status often), and then
    // its last result: the plugins run in the background.
    let check = if req.verbose {
        api.sandboxes.last_network_check(&rec)
    } else {
        None
    };
    Ok(Response::new(status(&rec, req.verbose, check)))
}

pub(super) async fn list_pod_sandbox(
    api: &RuntimeApi,
    request: Request<cri::ListPodSandboxRequest>,
) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
    Ok(Response::new(list(
        &api.sandboxes,
        request.get_ref().filter.as_ref(),
    )?))
}
