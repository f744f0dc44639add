//! CRI ImageService: PullImage, ListImages, ImageStatus, RemoveImage, ImageFsInfo.

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::ImageService;
use tonic::{Request, Response, Status};

use crate::image::{Credentials, ImageManager, ImageView};

/// The ImageService over an [`ImageManager`].
#[derive(Clone)]
pub struct ImageApi {
    images: ImageManager,
}

impl ImageApi {
    /// Serves `images`.
    pub fn new(images: ImageManager) -> Self {
        Self { images }
    }

    /// The image manager it serves.
    pub fn manager(&self) -> ImageManager {
        self.images.clone()
    }
}

/// Credentials from a CRI AuthConfig.
fn credentials(auth: Option<&cri::AuthConfig>) -> Result<Credentials, Status> {
    let Some(auth) = auth else {
        return Ok(Credentials::Anonymous);
    };
    if !auth.username.is_empty() || !auth.password.is_empty() {
        return Ok(Credentials::Basic(
            auth.username.clone(),
            auth.password.clone(),
        ));
    }
    if !auth.auth.is_empty() {
        let (user, pass) = crate::image::node_auth::decode_basic(&auth.auth).ok_or_else(|| {
            Status::invalid_argument("auth config: `auth` is not base64 of user:password")
        })?;
        return Ok(Credentials::Basic(user, pass));
    }
    if !auth.registry_token.is_empty() {
        return Ok(Credentials::Bearer(auth.registry_token.clone()));
    }
    if !auth.identity_token.is_empty() {
        return Ok(Credentials::Bearer(auth.identity_token.clone()));
    }
    Ok(Credentials::Anonymous)
}

fn image_spec_ref(spec: Option<&cri::ImageSpec>, call: &str) -> Result<String, Status> {
    let image = spec.map(|s| s.image.trim()).unwrap_or_default();
    if image.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{call}: image reference is empty"
        )));
    }
    Ok(image.to_string())
}

fn to_cri(images: &ImageManager, view: &ImageView) -> cri::Image {
    let r = &view.record;
    cri::Image {
        id: r.id.clone(),
        repo_tags: r.repo_tags.clone(),
        repo_digests: r.repo_digests.clone(),
        size: r.size,
        uid: r.uid.map(|value| cri::Int64Value { value }),
        username: r.username.clone(),
        spec: Some(cri::ImageSpec {
            image: r.id.clone(),
            ..Default::default()
        }),
        pinned: images.is_pinned(r),
    }
}

#[tonic::async_trait]
impl ImageService for ImageApi {
    async fn list_images(
        &self,
        request: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        let filter = request
            .get_ref()
            .filter
            .as_ref()
            .and_then(|f| f.image.as_ref())
            .map(|s| s.image.clone());
        let images = self.images.list(filter.as_deref())?;
        Ok(Response::new(cri::ListImagesResponse {
            images: images.iter().map(|v| to_cri(&self.images, v)).collect(),
        }))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        let req = request.get_ref();
        let reference = image_spec_ref(req.image.as_ref(), "ImageStatus")?;
        // Per the CRI, an absent image is a nil image, not an error.
        let Some(view) = self.images.status(&reference)? else {
            return Ok(Response::new(cri::ImageStatusResponse::default()));
        };
        let mut info = std::collections::HashMap::new();
        if req.verbose {
            let r = &view.record;
            let verbose = serde_json::json!({
                "id": r.id,
                "manifestDigest": r.manifest_digest,
                "manifestMediaType": r.manifest_media_type,
                "chainIDs": r.chain_ids,
                "diffIDs": r.diff_ids,
                "snapshotter": "overlayfs",
                "rootfsMounts": self.images.rootfs_mounts(r),
                "imageSpec": self.images.config_json(r),
            });
            info.insert("info".to_string(), verbose.to_string());
        }
        Ok(Response::new(cri::ImageStatusResponse {
            image: Some(to_cri(&self.images, &view)),
            info,
        }))
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        let req = request.get_ref();
        let reference = image_spec_ref(req.image.as_ref(), "PullImage")?;
        let creds = credentials(req.auth.as_ref())?;
        let started = std::time::Instant::now();
        // The request's credentials go only to the host they were given for.
        let server_address = req
            .auth
            .as_ref()
            .map(|a| a.server_address.as_str())
            .unwrap_or_default();
        let view = self
            .images
            .pull_with_auth(&reference, creds, server_address)
            .await
            .map_err(|e| {
                tracing::warn!(image = %reference, error = %e, "pull failed");
                Status::from(e)
            })?;
        tracing::info!(image = %reference, id = %view.record.id, elapsed_ms = started.elapsed().as_millis() as u64, "pulled");
        Ok(Response::new(cri::PullImageResponse {
            image_ref: view.record.id,
        }))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        let reference = image_spec_ref(request.get_ref().image.as_ref(), "RemoveImage")?;
        if self.images.remove(&reference).await? {
            tracing::info!(image = %reference, "removed image");
        }
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _request: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        // A walk of the image directories when the last one is too old: off the async workers.
        let images = self.images.clone();
        let usage = tokio::task::spawn_blocking(move || images.fs_usage())
            .await
            .map_err(|e| Status::internal(format!("measuring the image filesystem: {e}")))?;
        let root = self.images.snapshotter().root().display().to_string();
        let fs = cri::FilesystemUsage {
            timestamp: crate::util::unix_nanos_now(),
            fs_id: Some(cri::FilesystemIdentifier { mountpoint: root }),
            used_bytes: Some(cri::UInt64Value { value: usage.bytes }),
            inodes_used: Some(cri::UInt64Value {
                value: usage.inodes,
            }),
        };
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![fs.clone()],
            container_filesystems: vec![fs],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_string_decodes_to_basic() {
        let auth = cri::AuthConfig {
            auth: "dXNlcjpwYXNz".into(), // user:pass
            ..Default::default()
        };
        assert_eq!(
            credentials(Some(&auth)).expect("decodes"),
            Credentials::Basic("user".into(), "pass".into())
        );
        let bad = cri::AuthConfig {
            auth: "!!!".into(),
            ..Default::default()
        };
        let err = credentials(Some(&bad)).expect_err("bad base64");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}
