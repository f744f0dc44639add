//! ListContainers and ListPodSandbox (v1 and v1alpha2) answered from each record's cached
//! encoding of its list item: a list copies bytes instead of building and encoding every item
//! again, and the kubelet asks for both every second.
//!
//! The v1alpha2 messages have v1's field numbers, so one encoding serves both versions: a
//! v1alpha2 request decodes as v1's, and a v1alpha2 client skips the few item fields only v1
//! has, as it does any unknown field.

use std::future::{Ready, ready};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use k8s_cri::v1 as cri;
use prost::encoding::{
    DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len, skip_field,
};
use tonic::server::{Grpc, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::RuntimeApi;
use super::container_service::to_list_item;
use super::sandbox_service;

/// The number of the repeated item field in both ListContainersResponse and
/// ListPodSandboxResponse.
const ITEMS: u32 = 1;

/// A list response whose items are already encoded.
#[derive(Debug, Default)]
pub struct EncodedItems(pub Vec<Bytes>);

impl prost::Message for EncodedItems {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for item in &self.0 {
            encode_key(ITEMS, WireType::LengthDelimited, buf);
            encode_varint(item.len() as u64, buf);
            buf.put_slice(item);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag == ITEMS {
            let mut item = Bytes::new();
            prost::encoding::bytes::merge(wire_type, &mut item, buf, ctx)?;
            self.0.push(item);
            Ok(())
        } else {
            skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        self.0
            .iter()
            .map(|item| key_len(ITEMS) + encoded_len_varint(item.len() as u64) + item.len())
            .sum()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// A list answered here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Containers,
    PodSandboxes,
}

/// The list a request path asks for, if it is one of those answered here.
pub fn route(path: &str) -> Option<List> {
    let method = path
        .strip_prefix("/runtime.v1.RuntimeService/")
        .or_else(|| path.strip_prefix("/runtime.v1alpha2.RuntimeService/"))?;
    match method {
        "ListContainers" => Some(List::Containers),
        "ListPodSandbox" => Some(List::PodSandboxes),
        _ => None,
    }
}

/// Answers one list request.
pub async fn serve(
    list: List,
    api: Arc<RuntimeApi>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<tonic::body::Body> {
    let max = Some(super::server::MAX_MESSAGE);
    match list {
        List::Containers => {
            Grpc::new(ProstCodec::default())
                .apply_max_message_size_config(max, max)
                .unary(Containers(api), req)
                .await
        }
        List::PodSandboxes => {
            Grpc::new(ProstCodec::default())
                .apply_max_message_size_config(max, max)
                .unary(PodSandboxes(api), req)
                .await
        }
    }
}

/// ListContainers from the records' cached items.
struct Containers(Arc<RuntimeApi>);

impl UnaryService<cri::ListContainersRequest> for Containers {
    type Response = EncodedItems;
    type Future = Ready<Result<Response<EncodedItems>, Status>>;

    fn call(&mut self, req: Request<cri::ListContainersRequest>) -> Self::Future {
        let items = container_items(&self.0, req.get_ref().filter.as_ref());
        ready(Ok(Response::new(EncodedItems(items))))
    }
}

/// ListPodSandbox from the records' cached items.
struct PodSandboxes(Arc<RuntimeApi>);

impl UnaryService<cri::ListPodSandboxRequest> for PodSandboxes {
    type Response = EncodedItems;
    type Future = Ready<Result<Response<EncodedItems>, Status>>;

    fn call(&mut self, req: Request<cri::ListPodSandboxRequest>) -> Self::Future {
        let items = sandbox_items(&self.0, req.get_ref().filter.as_ref());
        ready(items.map(|items| Response::new(EncodedItems(items))))
    }
}

/// The encoded list items of the containers `filter` selects.
pub fn container_items(api: &RuntimeApi, filter: Option<&cri::ContainerFilter>) -> Vec<Bytes> {
    api.containers()
        .list(filter)
        .iter()
        .map(|r| r.list_item.get(|| to_list_item(r)).clone())
        .collect()
}

/// The encoded list items of the pod sandboxes `filter` selects.
pub fn sandbox_items(
    api: &RuntimeApi,
    filter: Option<&cri::PodSandboxFilter>,
) -> Result<Vec<Bytes>, Status> {
    sandbox_service::listed(api.sandboxes(), filter).map(|recs| {
        recs.iter()
            .map(|r| r.list_item.get(|| sandbox_service::list_item(r)).clone())
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1alpha2 as a2;
    use prost::Message;
    use std::collections::HashMap;

    fn container(id: &str) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: "pod".into(),
            metadata: Some(cri::ContainerMetadata {
                name: format!("c-{id}"),
                attempt: 2,
            }),
            image: Some(cri::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            state: cri::ContainerState::ContainerRunning as i32,
            created_at: 17,
            labels: HashMap::from([("app".into(), "web".into())]),
            annotations: HashMap::from([("note".into(), "x".repeat(300))]),
            ..Default::default()
        }
    }

    #[test]
    fn items_encode_as_the_response_they_stand_for() {
        let items = vec![container("a"), container("b"), container("c")];
        let encoded = EncodedItems(
            items
                .iter()
                .map(|c| Bytes::from(c.encode_to_vec()))
                .collect(),
        );
        let bytes = encoded.encode_to_vec();
        assert_eq!(bytes.len(), encoded.encoded_len());
        let whole = cri::ListContainersResponse {
            containers: items.clone(),
        };
        assert_eq!(bytes, whole.encode_to_vec());
        // A v1alpha2 client reads the same bytes as its own response.
        let old = a2::ListContainersResponse::decode(bytes.as_slice()).expect("v1alpha2");
        assert_eq!(old.containers.len(), 3);
        assert_eq!(old.containers[1].id, "b");
        assert_eq!(old.containers[1].labels["app"], "web");
        // And it decodes back into the same items.
        let back = EncodedItems::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back.0, encoded.0);
    }

    #[test]
    fn routes_only_the_two_lists_of_both_versions() {
        assert_eq!(
            route("/runtime.v1.RuntimeService/ListContainers"),
            Some(List::Containers)
        );
        assert_eq!(
            route("/runtime.v1alpha2.RuntimeService/ListPodSandbox"),
            Some(List::PodSandboxes)
        );
        assert_eq!(route("/runtime.v1.RuntimeService/ListContainerStats"), None);
        assert_eq!(route("/runtime.v1.ImageService/ListImages"), None);
        assert_eq!(route("/runtime.v1.RuntimeService/ListContainers/x"), None);
    }
}
