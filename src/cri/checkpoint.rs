//! CRI CheckpointContainer: checkpoints need CRIU, present and able to run on this kernel;
//! until then the call answers FailedPrecondition with CRIU's reason.

use std::sync::OnceLock;

use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;

/// Why CRIU cannot checkpoint here, in words for the caller: it is not installed, or
/// `criu check` fails (its last error line). Asked once per berthd. Blocking.
pub fn criu_unusable() -> String {
    static REASON: OnceLock<String> = OnceLock::new();
    REASON
        .get_or_init(|| {
            match std::process::Command::new("criu")
                .arg("check")
                .stdin(std::process::Stdio::null())
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    "criu is not installed on this node".to_string()
                }
                Err(e) => format!("criu could not be started: {e}"),
                Ok(out) => {
                    let text = String::from_utf8_lossy(&out.stderr).into_owned()
                        + &String::from_utf8_lossy(&out.stdout);
                    let last = text
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("no output")
                        .trim()
                        .to_string();
                    if out.status.success() {
                        // CRIU works, but Berth does not drive it yet.
                        "Berth does not drive CRIU yet".to_string()
                    } else {
                        format!("`criu check` fails on this node: {last}")
                    }
                }
            }
        })
        .clone()
}

pub(super) async fn checkpoint_container(
    api: &RuntimeApi,
    request: Request<cri::CheckpointContainerRequest>,
) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
    let id = &request.get_ref().container_id;
    let rec = api.containers.running(id, "CheckpointContainer")?;
    let reason = tokio::task::spawn_blocking(criu_unusable)
        .await
        .map_err(|e| Status::internal(format!("CheckpointContainer: {e}")))?;
    Err(Status::failed_precondition(format!(
        "CheckpointContainer {}: checkpoints need CRIU, and {reason}",
        rec.id
    )))
}
