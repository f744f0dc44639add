//! `berthctl events`: the runtime's container events (CRI GetContainerEvents) as they happen,
//! one line each (or one JSON object each with `-o json`), until interrupted.

use anyhow::Context;
use berth::client::CriClient;
use futures_util::StreamExt as _;
use k8s_cri::v1 as cri;

pub async fn follow(c: &CriClient, json: bool) -> anyhow::Result<()> {
    let mut events = c
        .runtime()
        .get_container_events(cri::GetEventsRequest {})
        .await
        .map_err(crate::status_message)
        .context("GetContainerEvents")?
        .into_inner();
    while let Some(event) = events.next().await {
        let event = event
            .map_err(crate::status_message)
            .context("event stream")?;
        let kind = cri::ContainerEventType::try_from(event.container_event_type)
            .map(|k| k.as_str_name())
            .unwrap_or("UNKNOWN");
        if json {
            let line = serde_json::json!({
                "container_id": event.container_id,
                "type": kind,
                "created_at": event.created_at,
                "pod_sandbox_id": event.pod_sandbox_status.as_ref().map(|p| p.id.clone()),
            });
            println!("{line}");
        } else {
            let when = k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(event.created_at))
                .map(|t| t.to_string())
                .unwrap_or_default();
            println!("{when}  {kind:<24}  {}", event.container_id);
        }
    }
    Ok(())
}
