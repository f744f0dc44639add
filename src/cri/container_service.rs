//! CRI container calls: CreateContainer, StartContainer, StopContainer, RemoveContainer,
//! ContainerStatus, ListContainers, UpdateContainerResources and ReopenContainerLog, and the
//! messages they answer from Berth's container records.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::{RuntimeApi, to_completion};
use crate::image::ImageManager;
use crate::runtime::container::{ContainerError, ContainerRecord, ContainerState, cri_state};
use crate::runtime::container_create::CreateExtras;
use crate::runtime::container_create::{CreateError, volumes};

impl From<ContainerError> for Status {
    fn from(e: ContainerError) -> Self {
        let msg = e.to_string();
        match e {
            ContainerError::Create(c) => c.into(),
            ContainerError::NotFound(_) => Status::not_found(msg),
            ContainerError::FailedPrecondition(_) => Status::failed_precondition(msg),
            ContainerError::NameInUse { .. } => Status::already_exists(msg),
            ContainerError::DeadlineExceeded(_) => Status::deadline_exceeded(msg),
            ContainerError::Unavailable(_) => Status::unavailable(msg),
            ContainerError::Internal(_) => Status::internal(msg),
        }
    }
}

impl From<CreateError> for Status {
    fn from(e: CreateError) -> Self {
        let msg = e.to_string();
        match e {
            CreateError::InvalidArgument(_) => Status::invalid_argument(msg),
            CreateError::NotFound(_) => Status::not_found(msg),
            CreateError::FailedPrecondition(_) => Status::failed_precondition(msg),
            CreateError::Internal(_) => Status::internal(msg),
        }
    }
}

/// A ListContainers item.
pub fn to_list_item(rec: &ContainerRecord) -> cri::Container {
    let config = rec.config_ref();
    cri::Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.sandbox_id.clone(),
        metadata: config.metadata.clone(),
        image: config.image.clone(),
        image_ref: rec.image_id.clone(),
        image_id: rec.image_id.clone(),
        state: cri_state(rec.state),
        created_at: rec.created_at,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
    }
}

/// The image reference ContainerStatus reports as `image_ref`: the repo digest of the image
/// (`name@sha256:…`) matching the repository the container asked for, else its first repo
/// digest, else the image id (what ImageStatus reports as `repo_digests` / `id`).
fn image_ref_of(rec: &ContainerRecord, images: &ImageManager) -> String {
    digest_reference(images, &rec.image_id, &rec.image_ref).unwrap_or_else(|| rec.image_id.clone())
}

/// The image `image` (an id or a reference) as its repo digest, the one of the repository
/// `reference` names when it has several; its id when it has none; None when there is no such
/// image.
pub(super) fn digest_reference(
    images: &ImageManager,
    image: &str,
    reference: &str,
) -> Option<String> {
    let Ok(Some(view)) = images.status(image) else {
        return None;
    };
    let digests = &view.record.repo_digests;
    let repo = reference
        .split('@')
        .next()
        .map(|r| {
            // Drop a tag (a ':' after the last '/').
            match (r.rfind(':'), r.rfind('/')) {
                (Some(c), Some(s)) if c > s => &r[..c],
                (Some(c), None) => &r[..c],
                _ => r,
            }
        })
        .unwrap_or_default();
    digests
        .iter()
        .find(|d| !repo.is_empty() && d.split('@').next().is_some_and(|n| n.ends_with(repo)))
        .or_else(|| digests.first())
        .cloned()
        .or(Some(view.record.id))
}

/// The verbose `info` map: key "info" holds JSON with the pid, sandbox id, runtime spec (the
/// bundle's config.json), snapshot key and bundle path.
fn verbose_info(rec: &ContainerRecord) -> HashMap<String, String> {
    let pid = match rec.init_process {
        Some(init) if rec.is_active() => init.pid,
        _ => 0,
    };
    let spec = std::fs::read(rec.bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let info = serde_json::json!({
        "sandboxID": rec.sandbox_id,
        "pid": pid,
        "snapshotKey": rec.snapshot,
        "snapshotter": "overlayfs",
        "bundle": rec.bundle,
        "imageID": rec.image_id,
        "logPath": rec.log_path,
        "runtimeSpec": spec,
    });
    HashMap::from([("info".to_string(), info.to_string())])
}

/// ContainerStatus; `verbose` adds the `info` map.
pub fn status(
    rec: &ContainerRecord,
    images: &ImageManager,
    verbose: bool,
) -> cri::ContainerStatusResponse {
    let config = rec.config_ref();
    let exit = rec.exit.clone().unwrap_or_default();
    let exited = rec.state == ContainerState::Exited;
    let reason = match exit.reason.as_str() {
        _ if !exited => String::new(),
        "" if exit.exit_code == 0 => "Completed".into(),
        "" => "Error".into(),
        r => r.to_string(),
    };
    let message = if exited {
        let written = volumes::read_termination_message(&rec.bundle, config);
        if written.is_empty() {
            exit.message.clone()
        } else {
            written
        }
    } else {
        String::new()
    };
    let info = if verbose {
        verbose_info(rec)
    } else {
        HashMap::new()
    };
    let mut status = cri::ContainerStatus {
        id: rec.id.clone(),
        metadata: config.metadata.clone(),
        state: cri_state(rec.state),
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: exit.finished_at,
        exit_code: exit.exit_code,
        image: config.image.clone(),
        image_ref: image_ref_of(rec, images),
        image_id: rec.image_id.clone(),
        reason,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        mounts: config.mounts.clone(),
        log_path: rec.log_path.display().to_string(),
        user: Some(cri::ContainerUser {
            linux: Some(cri::LinuxContainerUser {
                uid: i64::from(rec.uid),
                gid: i64::from(rec.gid),
                supplemental_groups: rec.groups.iter().map(|g| i64::from(*g)).collect(),
            }),
        }),
        resources: config
            .linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .map(|r| cri::ContainerResources {
                linux: Some(r),
                windows: None,
            }),
        ..Default::default()
    };
    status.message = message;
    cri::ContainerStatusResponse {
        status: Some(status),
        info,
    }
}

pub(super) async fn create_container(
    api: &RuntimeApi,
    request: Request<cri::CreateContainerRequest>,
) -> Result<Response<cri::CreateContainerResponse>, Status> {
    let containers = api.containers.clone();
    // A v0.34+ client's fields, read off the wire beside k8s-cri's message.
    let extras = request
        .extensions()
        .get::<super::api_v136::CreateContainerRequestExt>()
        .and_then(|e| e.config.as_ref())
        .map(|c| CreateExtras {
            stop_signal: c.stop_signal,
            image_sub_paths: c.mounts.iter().map(|m| m.image_sub_path.clone()).collect(),
        })
        .unwrap_or_default();
    let req = Arc::new(request.into_inner());
    let container_id =
        to_completion(async move { Ok(containers.create(req, extras).await?) }).await?;
    Ok(Response::new(cri::CreateContainerResponse { container_id }))
}

pub(super) async fn start_container(
    api: &RuntimeApi,
    request: Request<cri::StartContainerRequest>,
) -> Result<Response<cri::StartContainerResponse>, Status> {
    api.containers
        .start(&request.get_ref().container_id)
        .await?;
    Ok(Response::new(cri::StartContainerResponse {}))
}

/// Stopping an unknown or exited container succeeds, as the CRI requires.
pub(super) async fn stop_container(
    api: &RuntimeApi,
    request: Request<cri::StopContainerRequest>,
) -> Result<Response<cri::StopContainerResponse>, Status> {
    let req = request.get_ref();
    api.containers.stop(&req.container_id, req.timeout).await?;
    Ok(Response::new(cri::StopContainerResponse {}))
}

/// Removing an unknown container succeeds, as the CRI requires.
pub(super) async fn remove_container(
    api: &RuntimeApi,
    request: Request<cri::RemoveContainerRequest>,
) -> Result<Response<cri::RemoveContainerResponse>, Status> {
    api.containers
        .remove(&request.get_ref().container_id)
        .await?;
    Ok(Response::new(cri::RemoveContainerResponse {}))
}

pub(super) async fn container_status(
    api: &RuntimeApi,
    request: Request<cri::ContainerStatusRequest>,
) -> Result<Response<cri::ContainerStatusResponse>, Status> {
    let req = request.get_ref();
    let rec = api.containers.status(&req.container_id)?;
    Ok(Response::new(status(&rec, &api.images, req.verbose)))
}

pub(super) async fn list_containers(
    api: &RuntimeApi,
    request: Request<cri::ListContainersRequest>,
) -> Result<Response<cri::ListContainersResponse>, Status> {
    let recs = api.containers.list(request.get_ref().filter.as_ref());
    Ok(Response::new(cri::ListContainersResponse {
        containers: recs.iter().map(|r| to_list_item(r)).collect(),
    }))
}

pub(super) async fn update_container_resources(
    api: &RuntimeApi,
    request: Request<cri::UpdateContainerResourcesRequest>,
) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
    let req = request.get_ref();
    api.containers
        .update_resources(&req.container_id, req.linux.as_ref(), api.stats.layout())
        .await?;
    Ok(Response::new(cri::UpdateContainerResourcesResponse {}))
}

pub(super) async fn reopen_container_log(
    api: &RuntimeApi,
    request: Request<cri::ReopenContainerLogRequest>,
) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
    api.containers
        .reopen_log(&request.get_ref().container_id)
        .await?;
    Ok(Response::new(cri::ReopenContainerLogResponse {}))
}
