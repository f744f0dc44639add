//! CRI container messages from Berth's container records.

use k8s_cri::v1 as cri;
use tonic::Status;

use crate::runtime::container::{ContainerError, ContainerRecord, cri_state};
use crate::runtime::container_create::CreateError;

impl From<ContainerError> for Status {
    fn from(e: ContainerError) -> Self {
        let msg = e.to_string();
        match e {
            ContainerError::Create(c) => c.into(),
            ContainerError::NotFound(_) => Status::not_found(msg),
            ContainerError::FailedPrecondition(_) => Status::failed_precondition(msg),
            ContainerError::NameInUse { .. } => Status::already_exists(msg),
            ContainerError::DeadlineExceeded(_) => Status::deadline_exceeded(msg),
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
    let config = rec.config();
    cri::Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.sandbox_id.clone(),
        metadata: config.metadata,
        image: config.image,
        image_ref: rec.image_id.clone(),
        state: cri_state(rec.state),
        created_at: rec.created_at,
        labels: config.labels,
        annotations: config.annotations,
        ..Default::default()
    }
}

/// ContainerStatus.
pub fn status(rec: &ContainerRecord) -> cri::ContainerStatusResponse {
    let config = rec.config();
    let exit = rec.exit.clone().unwrap_or_default();
    cri::ContainerStatusResponse {
        status: Some(cri::ContainerStatus {
            id: rec.id.clone(),
            metadata: config.metadata,
            state: cri_state(rec.state),
            created_at: rec.created_at,
            started_at: rec.started_at,
            finished_at: exit.finished_at,
            exit_code: exit.exit_code,
            image: config.image,
            image_ref: rec.image_id.clone(),
            image_id: rec.image_id.clone(),
            reason: exit.reason,
            labels: config.labels,
            annotations: config.annotations,
            mounts: config.mounts,
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
                .and_then(|l| l.resources)
                .map(|r| cri::ContainerResources {
                    linux: Some(r),
                    windows: None,
                }),
            ..Default::default()
        }),
        info: Default::default(),
    }
}
