//! CRI calls that run processes or open streams: ExecSync, Exec, Attach and PortForward (the
//! last three answer a one-time URL on the streaming server).

use std::sync::Arc;

use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;
use crate::runtime::sandbox::SandboxState;

fn stream_server(api: &RuntimeApi) -> Result<&Arc<crate::stream::StreamServer>, Status> {
    api.stream
        .as_ref()
        .ok_or_else(|| Status::unavailable("the streaming server is not running"))
}

/// Checks the streams asked for by Exec and Attach, as the kubelet does.
fn check_streams(
    call: &str,
    tty: bool,
    stdin: bool,
    stdout: bool,
    stderr: bool,
) -> Result<(), Status> {
    if !(stdin || stdout || stderr) {
        return Err(Status::invalid_argument(format!(
            "{call}: one of stdin, stdout or stderr must be set"
        )));
    }
    if tty && stderr {
        return Err(Status::invalid_argument(format!(
            "{call}: tty and stderr cannot both be set (a tty merges stderr into stdout)"
        )));
    }
    Ok(())
}

pub(super) async fn exec_sync(
    api: &RuntimeApi,
    request: Request<cri::ExecSyncRequest>,
) -> Result<Response<cri::ExecSyncResponse>, Status> {
    let req = request.get_ref();
    let r = api
        .containers
        .exec_sync(&req.container_id, &req.cmd, req.timeout)
        .await?;
    Ok(Response::new(cri::ExecSyncResponse {
        stdout: r.stdout,
        stderr: r.stderr,
        exit_code: r.exit_code,
    }))
}

pub(super) async fn exec(
    api: &RuntimeApi,
    request: Request<cri::ExecRequest>,
) -> Result<Response<cri::ExecResponse>, Status> {
    let req = request.into_inner();
    let server = stream_server(api)?;
    if req.cmd.is_empty() {
        return Err(Status::invalid_argument("Exec: cmd is empty"));
    }
    check_streams("Exec", req.tty, req.stdin, req.stdout, req.stderr)?;
    let rec = api.containers.running(&req.container_id, "Exec")?;
    // The client connects to the URL at once and the process will join the container's
    // cgroups: the head start on the cgroup-attach lock.
    crate::runtime::cgroup_attach::prime();
    let url = issue(
        server,
        crate::stream::Pending::Exec(cri::ExecRequest {
            container_id: rec.id.clone(),
            ..req
        }),
    )?;
    Ok(Response::new(cri::ExecResponse { url }))
}

pub(super) async fn attach(
    api: &RuntimeApi,
    request: Request<cri::AttachRequest>,
) -> Result<Response<cri::AttachResponse>, Status> {
    let req = request.into_inner();
    let server = stream_server(api)?;
    check_streams("Attach", req.tty, req.stdin, req.stdout, req.stderr)?;
    let rec = api.containers.running(&req.container_id, "Attach")?;
    let url = issue(
        server,
        crate::stream::Pending::Attach(cri::AttachRequest {
            container_id: rec.id.clone(),
            ..req
        }),
    )?;
    Ok(Response::new(cri::AttachResponse { url }))
}

pub(super) async fn port_forward(
    api: &RuntimeApi,
    request: Request<cri::PortForwardRequest>,
) -> Result<Response<cri::PortForwardResponse>, Status> {
    let req = request.into_inner();
    let server = stream_server(api)?;
    if let Some(p) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
        return Err(Status::invalid_argument(format!(
            "PortForward: invalid port {p}"
        )));
    }
    let rec = api.sandboxes.get(&req.pod_sandbox_id)?;
    if rec.state != SandboxState::Ready {
        return Err(Status::failed_precondition(format!(
            "PortForward: pod sandbox {} is not ready",
            rec.id
        )));
    }
    let url = issue(
        server,
        crate::stream::Pending::PortForward(cri::PortForwardRequest {
            pod_sandbox_id: rec.id,
            port: req.port,
        }),
    )?;
    Ok(Response::new(cri::PortForwardResponse { url }))
}

/// A one-time URL for `pending`, or Unavailable when no unguessable token can be made.
fn issue(
    server: &crate::stream::StreamServer,
    pending: crate::stream::Pending,
) -> Result<String, Status> {
    server.url_for(pending).ok_or_else(|| {
        Status::unavailable("streaming: the kernel gave no randomness for a one-time token")
    })
}
