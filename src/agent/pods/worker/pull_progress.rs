//! How far a pull has come, read from the runtime's verbose status (the pulls in progress, by
//! normalised reference, with each layer's bytes received and total), for the agent's Pulling
//! events during a long pull.

use std::time::Duration;

use k8s_cri::v1 as cri;

use crate::client::CriClient;
use crate::image::reference::ImageRef;

/// Time between two progress events of one pull (the first comes after as long).
pub const EVERY: Duration = Duration::from_secs(10);

/// Bytes received and bytes in all, over the layers of the pull of `image` in progress (None
/// when the runtime reports none for it, or does not report pulls).
pub async fn progress(client: &CriClient, image: &str) -> Option<(u64, u64)> {
    let wanted = ImageRef::parse(image).ok()?.to_string();
    let status = client
        .runtime()
        .status(cri::StatusRequest { verbose: true })
        .await
        .ok()?
        .into_inner();
    of_image(status.info.get("pulls")?, &wanted)
}

/// The totals of `wanted` in the verbose status's `pulls` value.
fn of_image(pulls: &str, wanted: &str) -> Option<(u64, u64)> {
    let pulls: serde_json::Value = serde_json::from_str(pulls).ok()?;
    let pull = pulls["inProgress"]
        .as_array()?
        .iter()
        .find(|p| p["image"].as_str() == Some(wanted))?;
    let layers = pull["layers"].as_array()?;
    let sum = |field: &str| layers.iter().filter_map(|l| l[field].as_u64()).sum::<u64>();
    let total = sum("total");
    (total > 0).then(|| (sum("received"), total))
}

/// The Pulling event's message for a pull under way.
pub fn message(image: &str, received: u64, total: u64) -> String {
    format!("Pulling image \"{image}\": {received} of {total} bytes received")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pulls_layers_add_up() {
        let pulls = serde_json::json!({"inProgress": [
            {"image": "docker.io/library/other:1", "layers": [{"digest": "a", "received": 9, "total": 9}]},
            {"image": "docker.io/library/busybox:latest", "layers": [
                {"digest": "b", "received": 100, "total": 400},
                {"digest": "c", "received": 0, "total": 600},
            ]},
        ]})
        .to_string();
        let wanted = ImageRef::parse("busybox").expect("ref").to_string();
        assert_eq!(of_image(&pulls, &wanted), Some((100, 1000)));
        assert_eq!(of_image(&pulls, "docker.io/library/none:1"), None);
        assert_eq!(of_image("not json", &wanted), None);
    }
}
