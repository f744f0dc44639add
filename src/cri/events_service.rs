//! CRI GetContainerEvents: the runtime's container events as a stream, each with its pod
//! sandbox's status and the statuses of the pod's containers at the time of the event.
//!
//! One task per subscriber turns events into CRI messages and hands them to the gRPC stream
//! through a small buffer. A subscriber that does not read falls behind the event channel and
//! is dropped (with a log line and a final RESOURCE_EXHAUSTED status); one that disconnects
//! ends its task at once.

use std::pin::Pin;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;
use super::{container_service, sandbox_service};
use crate::image::ImageManager;
use crate::runtime::events::{ContainerEvent, EventBus, EventKind};
use crate::runtime::sandbox::SandboxManager;

/// Messages buffered per subscriber before it counts as not reading.
const STREAM_BUFFER: usize = 64;

/// The stream type of GetContainerEvents.
pub type EventStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>>;

/// What an event is turned into CRI messages with.
#[derive(Clone)]
pub struct EventSource {
    pub bus: Arc<EventBus>,
    pub sandboxes: Arc<SandboxManager>,
    pub images: ImageManager,
}

impl EventSource {
    /// A new subscription as a gRPC stream.
    pub fn stream(&self) -> EventStream {
        let (kept, mut rx) = self.bus.subscribe();
        let (tx, out) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        let source = self.clone();
        tokio::spawn(async move {
            for event in kept {
                if tx.send(Ok(source.response(&event))).await.is_err() {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    () = tx.closed() => return,
                    next = rx.recv() => next,
                };
                match next {
                    Ok(event) => {
                        if tx.send(Ok(source.response(&event))).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "GetContainerEvents: dropping a subscriber that fell behind"
                        );
                        let _ = tx.try_send(Err(Status::resource_exhausted(format!(
                            "GetContainerEvents: this subscriber fell {missed} events behind and was dropped; subscribe again and relist"
                        ))));
                        return;
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))
    }

    /// The CRI message of `event`.
    pub fn response(&self, event: &ContainerEvent) -> cri::ContainerEventResponse {
        let kind = match event.kind {
            EventKind::Created => cri::ContainerEventType::ContainerCreatedEvent,
            EventKind::Started => cri::ContainerEventType::ContainerStartedEvent,
            EventKind::Stopped => cri::ContainerEventType::ContainerStoppedEvent,
            EventKind::Deleted => cri::ContainerEventType::ContainerDeletedEvent,
        };
        let sandbox = self
            .sandboxes
            .find(&event.sandbox_id)
            .ok()
            .and_then(|s| sandbox_service::status(&s, false, None).status);
        cri::ContainerEventResponse {
            container_id: event.id.clone(),
            container_event_type: kind as i32,
            created_at: event.at,
            pod_sandbox_status: sandbox,
            containers_statuses: event
                .pod
                .iter()
                .filter_map(|c| container_service::status(c, &self.images, false).status)
                .collect(),
        }
    }
}

pub(super) async fn get_container_events(
    api: &RuntimeApi,
    _request: Request<cri::GetEventsRequest>,
) -> Result<Response<super::events_service::EventStream>, Status> {
    Ok(Response::new(api.events.stream()))
}
