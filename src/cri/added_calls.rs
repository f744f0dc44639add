//! The calls cri-api added after v0.32 (Kubernetes 1.33–1.36), which the k8s-cri crate's
//! generated services do not route: the streaming lists (`StreamPodSandboxes`,
//! `StreamContainers`, `StreamContainerStats`, `StreamPodSandboxStats`,
//! `StreamPodSandboxMetrics`, `StreamImages`) and `UpdatePodSandboxResources`; and the v1
//! calls whose messages gained fields k8s-cri cannot carry (`CreateContainer`: the stop signal
//! and image sub paths; `ContainerStatus`: the stop signal; `Status`: user namespaces with the
//! host network; the stats calls: pressure, see [`super::stats_psi`]), served through
//! [`super::wire_extensions`].
//!
//! A streaming list answers what its unary list would, in messages of at most
//! [`BATCH_BYTES`] each, so no count of containers meets the 16 MiB message ceiling. Its
//! request and response messages have the wire shape of the unary list's (filter at 1, items
//! at 1), so the unary call's own types decode the request and encode each batch.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::ImageService;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use prost::Message;
use tonic::server::Grpc;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::api_v136::{
    ContainerStatusExt, ContainerStatusResponseExt, CreateContainerRequestExt, ImageSpecExt,
    MountStatusExt, RuntimeFeaturesExt, StatusResponseExt, UpdatePodSandboxResourcesRequest,
    UpdatePodSandboxResourcesResponse,
};
use super::encoded_lists::{self, EncodedItems};
use super::stats_psi;
use super::wire_extensions::{Appended, DualCodec};
use super::{ImageApi, RuntimeApi};

/// The most bytes of items one streamed message carries (an item larger than this goes alone).
pub const BATCH_BYTES: usize = 1 << 20;

/// A call answered here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddedCall {
    StreamPodSandboxes,
    StreamContainers,
    StreamContainerStats,
    StreamPodSandboxStats,
    StreamPodSandboxMetrics,
    StreamImages,
    UpdatePodSandboxResources,
    CreateContainer,
    ContainerStatus,
    Status,
    ContainerStats,
    ListContainerStats,
    PodSandboxStats,
    ListPodSandboxStats,
}

/// The call a request path names, if it is one of those answered here.
pub fn route(path: &str) -> Option<AddedCall> {
    if let Some(method) = path.strip_prefix("/runtime.v1.RuntimeService/") {
        return Some(match method {
            "StreamPodSandboxes" => AddedCall::StreamPodSandboxes,
            "StreamContainers" => AddedCall::StreamContainers,
            "StreamContainerStats" => AddedCall::StreamContainerStats,
            "StreamPodSandboxStats" => AddedCall::StreamPodSandboxStats,
            "StreamPodSandboxMetrics" => AddedCall::StreamPodSandboxMetrics,
            "UpdatePodSandboxResources" => AddedCall::UpdatePodSandboxResources,
            "CreateContainer" => AddedCall::CreateContainer,
            "ContainerStatus" => AddedCall::ContainerStatus,
            "Status" => AddedCall::Status,
            "ContainerStats" => AddedCall::ContainerStats,
            "ListContainerStats" => AddedCall::ListContainerStats,
            "PodSandboxStats" => AddedCall::PodSandboxStats,
            "ListPodSandboxStats" => AddedCall::ListPodSandboxStats,
            _ => return None,
        });
    }
    (path == "/runtime.v1.ImageService/StreamImages").then_some(AddedCall::StreamImages)
}

/// The items in messages of at most [`BATCH_BYTES`] (one message when they all fit, none for
/// no items).
pub fn batches(items: Vec<Bytes>) -> Vec<EncodedItems> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    let mut size = 0;
    for item in items {
        if !current.is_empty() && size + item.len() > BATCH_BYTES {
            out.push(EncodedItems(std::mem::take(&mut current)));
            size = 0;
        }
        size += item.len();
        current.push(item);
    }
    if !current.is_empty() {
        out.push(EncodedItems(current));
    }
    out
}

fn encoded<M: Message>(items: &[M]) -> Vec<Bytes> {
    items
        .iter()
        .map(|m| Bytes::from(m.encode_to_vec()))
        .collect()
}

/// Streams the items `list` produces from the decoded request.
async fn stream_of<Req, F, Fut>(
    req: http::Request<hyper::body::Incoming>,
    list: F,
) -> http::Response<tonic::body::Body>
where
    Req: Message + Default + Send + 'static,
    F: FnOnce(Req) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<Bytes>, Status>> + Send + 'static,
{
    let max = Some(super::server::MAX_MESSAGE);
    let svc = tower::service_fn(move |r: Request<Req>| {
        let list = list.clone();
        async move {
            let items = list(r.into_inner()).await?;
            let messages = batches(items).into_iter().map(Ok::<_, Status>);
            Ok::<_, Status>(Response::new(stream::iter(messages)))
        }
    });
    Grpc::new(ProstCodec::<EncodedItems, Req>::default())
        .apply_max_message_size_config(max, max)
        .server_streaming(svc, req)
        .await
}

/// Container stats items with their pressure, read off the async threads (cgroup files).
async fn container_stats_items(
    runtime: Arc<RuntimeApi>,
    stats: Vec<cri::ContainerStats>,
) -> Result<Vec<Bytes>, Status> {
    tokio::task::spawn_blocking(move || {
        stats
            .iter()
            .map(|s| stats_psi::container_item(&runtime, s))
            .collect()
    })
    .await
    .map_err(|e| Status::internal(format!("container stats: {e}")))
}

/// ListContainerStats' items with their pressure (the list and the stream answer the same).
async fn container_stats_of(
    runtime: Arc<RuntimeApi>,
    req: cri::ListContainerStatsRequest,
) -> Result<Vec<Bytes>, Status> {
    let resp = runtime.list_container_stats(Request::new(req)).await?;
    container_stats_items(runtime, resp.into_inner().stats).await
}

/// ListPodSandboxStats' items with their pressure (the list and the stream answer the same).
async fn pod_stats_of(
    runtime: Arc<RuntimeApi>,
    req: cri::ListPodSandboxStatsRequest,
) -> Result<Vec<Bytes>, Status> {
    let resp = runtime.list_pod_sandbox_stats(Request::new(req)).await?;
    pod_stats_items(runtime, resp.into_inner().stats).await
}

/// Pod stats items with their pressure, read off the async threads (cgroup files).
async fn pod_stats_items(
    runtime: Arc<RuntimeApi>,
    stats: Vec<cri::PodSandboxStats>,
) -> Result<Vec<Bytes>, Status> {
    tokio::task::spawn_blocking(move || {
        stats
            .into_iter()
            .map(|s| stats_psi::pod_item(&runtime, s))
            .collect()
    })
    .await
    .map_err(|e| Status::internal(format!("pod sandbox stats: {e}")))
}

/// A unary call whose response is its items at field 1 (a list, or a single stats message).
async fn unary_items<Req, F, Fut>(
    req: http::Request<hyper::body::Incoming>,
    items: F,
) -> http::Response<tonic::body::Body>
where
    Req: Message + Default + Send + 'static,
    F: FnOnce(Req) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<Bytes>, Status>> + Send + 'static,
{
    let max = Some(super::server::MAX_MESSAGE);
    let svc = tower::service_fn(move |r: Request<Req>| {
        let items = items.clone();
        async move { Ok::<_, Status>(Response::new(EncodedItems(items(r.into_inner()).await?))) }
    });
    Grpc::new(ProstCodec::<EncodedItems, Req>::default())
        .apply_max_message_size_config(max, max)
        .unary(svc, req)
        .await
}

/// A ContainerStatus mount, encoded with the digest of the image an image volume mounts and
/// the directory of it mounted.
fn mount_status(runtime: &RuntimeApi, m: cri::Mount, image_sub_path: String) -> Vec<u8> {
    let image_ref = m
        .image
        .as_ref()
        .filter(|i| !i.image.is_empty())
        .and_then(|i| {
            super::container_service::digest_reference(&runtime.images, &i.image, &i.image)
        });
    let ext = MountStatusExt {
        image: image_ref.map(|image_ref| ImageSpecExt { image_ref }),
        image_sub_path,
    };
    Appended(m, ext).encode_to_vec()
}

/// Answers one request for an added call.
pub async fn serve(
    call: AddedCall,
    runtime: Arc<RuntimeApi>,
    images: Arc<ImageApi>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<tonic::body::Body> {
    match call {
        AddedCall::StreamContainers => {
            stream_of(req, move |r: cri::ListContainersRequest| async move {
                Ok(encoded_lists::container_items(&runtime, r.filter.as_ref()))
            })
            .await
        }
        AddedCall::StreamPodSandboxes => {
            stream_of(req, move |r: cri::ListPodSandboxRequest| async move {
                encoded_lists::sandbox_items(&runtime, r.filter.as_ref())
            })
            .await
        }
        AddedCall::StreamContainerStats => {
            stream_of(req, move |r| container_stats_of(runtime, r)).await
        }
        AddedCall::StreamPodSandboxStats => stream_of(req, move |r| pod_stats_of(runtime, r)).await,
        AddedCall::ListContainerStats => {
            unary_items(req, move |r| container_stats_of(runtime, r)).await
        }
        AddedCall::ContainerStats => {
            unary_items(req, move |r: cri::ContainerStatsRequest| async move {
                let resp = runtime.container_stats(Request::new(r)).await?;
                let one = resp.into_inner().stats.into_iter().collect();
                container_stats_items(runtime, one).await
            })
            .await
        }
        AddedCall::ListPodSandboxStats => unary_items(req, move |r| pod_stats_of(runtime, r)).await,
        AddedCall::PodSandboxStats => {
            unary_items(req, move |r: cri::PodSandboxStatsRequest| async move {
                let resp = runtime.pod_sandbox_stats(Request::new(r)).await?;
                let one = resp.into_inner().stats.into_iter().collect();
                pod_stats_items(runtime, one).await
            })
            .await
        }
        AddedCall::StreamPodSandboxMetrics => {
            stream_of(
                req,
                move |r: cri::ListPodSandboxMetricsRequest| async move {
                    let resp = runtime.list_pod_sandbox_metrics(Request::new(r)).await?;
                    Ok(encoded(&resp.into_inner().pod_metrics))
                },
            )
            .await
        }
        AddedCall::StreamImages => {
            stream_of(req, move |r: cri::ListImagesRequest| async move {
                let resp = images.list_images(Request::new(r)).await?;
                Ok(encoded(&resp.into_inner().images))
            })
            .await
        }
        AddedCall::CreateContainer => {
            let svc = tower::service_fn(
                move |r: Request<(cri::CreateContainerRequest, CreateContainerRequestExt)>| {
                    let runtime = runtime.clone();
                    async move {
                        let (req, ext) = r.into_inner();
                        let mut req = Request::new(req);
                        req.extensions_mut().insert(ext);
                        runtime.create_container(req).await
                    }
                },
            );
            let max = Some(super::server::MAX_MESSAGE);
            Grpc::new(DualCodec::<
                cri::CreateContainerResponse,
                cri::CreateContainerRequest,
                CreateContainerRequestExt,
            >::default())
            .apply_max_message_size_config(max, max)
            .unary(svc, req)
            .await
        }
        AddedCall::ContainerStatus => {
            let svc = tower::service_fn(move |r: Request<cri::ContainerStatusRequest>| {
                let runtime = runtime.clone();
                async move {
                    let resp = runtime.container_status(r).await?.into_inner();
                    let id = resp
                        .status
                        .as_ref()
                        .map(|s| s.id.clone())
                        .unwrap_or_default();
                    let rec = runtime.containers().find(&id);
                    let stop_signal = rec.as_ref().map_or(0, |rec| {
                        crate::runtime::stop_signal::to_cri(rec.stop_signal)
                    });
                    let mut sub_paths = rec
                        .map(|rec| rec.image_sub_paths.clone())
                        .unwrap_or_default()
                        .into_iter();
                    let mut resp = resp;
                    let mounts = resp
                        .status
                        .as_mut()
                        .map(|s| std::mem::take(&mut s.mounts))
                        .unwrap_or_default();
                    let mounts = mounts
                        .into_iter()
                        .map(|m| mount_status(&runtime, m, sub_paths.next().unwrap_or_default()))
                        .collect();
                    let ext = ContainerStatusResponseExt {
                        status: Some(ContainerStatusExt {
                            stop_signal,
                            mounts,
                        }),
                    };
                    Ok::<_, Status>(Response::new(Appended(resp, ext)))
                }
            });
            let max = Some(super::server::MAX_MESSAGE);
            Grpc::new(ProstCodec::<
                Appended<cri::ContainerStatusResponse, ContainerStatusResponseExt>,
                cri::ContainerStatusRequest,
            >::default())
            .apply_max_message_size_config(max, max)
            .unary(svc, req)
            .await
        }
        AddedCall::Status => {
            let svc = tower::service_fn(move |r: Request<cri::StatusRequest>| {
                let runtime = runtime.clone();
                async move {
                    let resp = runtime.status(r).await?.into_inner();
                    // The same condition as user namespaces at all: idmapped mounts.
                    let ext = StatusResponseExt {
                        features: Some(RuntimeFeaturesExt {
                            user_namespaces_host_network: crate::runtime::userns::supported(),
                        }),
                    };
                    Ok::<_, Status>(Response::new(Appended(resp, ext)))
                }
            });
            let max = Some(super::server::MAX_MESSAGE);
            Grpc::new(ProstCodec::<
                Appended<cri::StatusResponse, StatusResponseExt>,
                cri::StatusRequest,
            >::default())
            .apply_max_message_size_config(max, max)
            .unary(svc, req)
            .await
        }
        AddedCall::UpdatePodSandboxResources => {
            let svc = tower::service_fn(move |r: Request<UpdatePodSandboxResourcesRequest>| {
                let runtime = runtime.clone();
                async move {
                    let r = r.into_inner();
                    runtime
                        .sandboxes()
                        .update_resources(&r.pod_sandbox_id, r.overhead, r.resources)
                        .await?;
                    Ok::<_, Status>(Response::new(UpdatePodSandboxResourcesResponse {}))
                }
            });
            let max = Some(super::server::MAX_MESSAGE);
            Grpc::new(ProstCodec::<
                UpdatePodSandboxResourcesResponse,
                UpdatePodSandboxResourcesRequest,
            >::default())
            .apply_max_message_size_config(max, max)
            .unary(svc, req)
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_calls_route_by_their_published_paths() {
        assert_eq!(
            route("/runtime.v1.RuntimeService/StreamContainers"),
            Some(AddedCall::StreamContainers)
        );
        assert_eq!(
            route("/runtime.v1.ImageService/StreamImages"),
            Some(AddedCall::StreamImages)
        );
        assert_eq!(
            route("/runtime.v1.RuntimeService/UpdatePodSandboxResources"),
            Some(AddedCall::UpdatePodSandboxResources)
        );
        assert_eq!(route("/runtime.v1.RuntimeService/ListContainers"), None);
        assert_eq!(
            route("/runtime.v1alpha2.RuntimeService/StreamContainers"),
            None
        );
        assert_eq!(route("/runtime.v1.RuntimeService/StreamImages"), None);
    }

    #[test]
    fn batches_stay_under_the_bound_and_keep_every_item_in_order() {
        let items: Vec<Bytes> = (0..50u8)
            .map(|i| Bytes::from(vec![i; 100 * 1024]))
            .collect();
        let out = batches(items.clone());
        assert!(out.len() > 1, "{} batches", out.len());
        for b in &out {
            assert!(b.0.iter().map(Bytes::len).sum::<usize>() <= BATCH_BYTES);
        }
        let flat: Vec<Bytes> = out.into_iter().flat_map(|b| b.0).collect();
        assert_eq!(flat, items);
        assert!(batches(Vec::new()).is_empty());
        let huge = vec![
            Bytes::from(vec![1; BATCH_BYTES + 1]),
            Bytes::from_static(b"x"),
        ];
        assert_eq!(batches(huge).len(), 2, "an oversized item goes alone");
    }
}
