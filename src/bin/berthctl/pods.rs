//! Pod and container commands: runp, create, start, stop, rm, stopp, rmp, ps, pods.

use std::path::Path;

use anyhow::Context;
use berth::client::CriClient;
use k8s_cri::v1 as cri;

use crate::config;
use crate::{print_json, status_message};

/// RunPodSandbox from a pod config file; prints the sandbox id.
pub async fn run_pod(c: &CriClient, pod_config: &Path, handler: &str) -> anyhow::Result<String> {
    let config = config::pod_config(&config::read_object(pod_config)?)
        .with_context(|| format!("pod config {}", pod_config.display()))?;
    let id = c
        .runtime()
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: handler.to_string(),
        })
        .await
        .map_err(status_message)
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id;
    Ok(id)
}

/// CreateContainer in a pod from a container and a pod config file; prints the container id.
pub async fn create(
    c: &CriClient,
    pod_id: &str,
    container_config: &Path,
    pod_config: &Path,
) -> anyhow::Result<String> {
    let config = config::container_config(&config::read_object(container_config)?)
        .with_context(|| format!("container config {}", container_config.display()))?;
    let sandbox = config::pod_config(&config::read_object(pod_config)?)
        .with_context(|| format!("pod config {}", pod_config.display()))?;
    let id = c
        .runtime()
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        })
        .await
        .map_err(status_message)
        .context("CreateContainer")?
        .into_inner()
        .container_id;
    Ok(id)
}

/// Runs `op` on each id, printing each id done (as crictl does); stops at the first error.
pub async fn each<F, Fut>(ids: &[String], json: bool, what: &str, op: F) -> anyhow::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    for id in ids {
        op(id.clone())
            .await
            .map_err(status_message)
            .with_context(|| format!("{what} {id}"))?;
        if !json {
            println!("{id}");
        }
    }
    Ok(())
}

pub async fn start(c: &CriClient, id: String) -> Result<(), tonic::Status> {
    c.runtime()
        .start_container(cri::StartContainerRequest { container_id: id })
        .await
        .map(drop)
}

pub async fn stop(c: &CriClient, id: String, timeout: i64) -> Result<(), tonic::Status> {
    c.runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id,
            timeout,
        })
        .await
        .map(drop)
}

pub async fn update(
    c: &CriClient,
    id: String,
    linux: cri::LinuxContainerResources,
) -> Result<(), tonic::Status> {
    c.runtime()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id,
            linux: Some(linux),
            ..Default::default()
        })
        .await
        .map(drop)
}

pub async fn remove(c: &CriClient, id: String) -> Result<(), tonic::Status> {
    c.runtime()
        .remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .map(drop)
}

pub async fn stop_pod(c: &CriClient, id: String) -> Result<(), tonic::Status> {
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
        .await
        .map(drop)
}

pub async fn remove_pod(c: &CriClient, id: String) -> Result<(), tonic::Status> {
    c.runtime()
        .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .map(drop)
}

/// What `ps` lists.
pub struct PsArgs {
    pub all: bool,
    pub pod: Option<String>,
    pub quiet: bool,
}

pub async fn ps(c: &CriClient, args: PsArgs, json: bool) -> anyhow::Result<()> {
    let filter = cri::ContainerFilter {
        pod_sandbox_id: args.pod.unwrap_or_default(),
        state: (!args.all).then_some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let mut list = c
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .map_err(status_message)
        .context("ListContainers")?
        .into_inner();
    list.containers
        .sort_by_key(|c| std::cmp::Reverse(c.created_at));
    if json {
        return print_json(&list);
    }
    if args.quiet {
        for ct in &list.containers {
            println!("{}", ct.id);
        }
        return Ok(());
    }
    println!(
        "{:<13}  {:<30}  {:<14}  {:<17}  {:<20}  {:<7}  {:<13}",
        "CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID"
    );
    for ct in &list.containers {
        let state = cri::ContainerState::try_from(ct.state)
            .map(|s| s.as_str_name())
            .unwrap_or("UNKNOWN");
        let (name, attempt) = ct
            .metadata
            .as_ref()
            .map(|m| (m.name.as_str(), m.attempt))
            .unwrap_or_default();
        let image = ct.image.as_ref().map(|i| i.image.as_str()).unwrap_or("");
        println!(
            "{:<13}  {:<30}  {:<14}  {:<17}  {:<20}  {:<7}  {:<13}",
            short(&ct.id),
            image,
            age(ct.created_at),
            state,
            name,
            attempt,
            short(&ct.pod_sandbox_id)
        );
    }
    Ok(())
}

pub async fn pods(c: &CriClient, ready_only: bool, quiet: bool, json: bool) -> anyhow::Result<()> {
    let filter = ready_only.then(|| cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    });
    let mut list = c
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
        .await
        .map_err(status_message)
        .context("ListPodSandbox")?
        .into_inner();
    list.items.sort_by_key(|p| std::cmp::Reverse(p.created_at));
    if json {
        return print_json(&list);
    }
    if quiet {
        for p in &list.items {
            println!("{}", p.id);
        }
        return Ok(());
    }
    println!(
        "{:<13}  {:<14}  {:<13}  {:<30}  {:<20}  {:<7}  {:<15}",
        "POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "IP"
    );
    for p in &list.items {
        // ListPodSandbox carries no IP: the pod's status does.
        let ip = c
            .runtime()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: p.id.clone(),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().status)
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .unwrap_or_else(|| "-".into());
        let state = cri::PodSandboxState::try_from(p.state)
            .map(|s| s.as_str_name())
            .unwrap_or("UNKNOWN");
        let (name, ns, attempt) = p
            .metadata
            .as_ref()
            .map(|m| (m.name.as_str(), m.namespace.as_str(), m.attempt))
            .unwrap_or_default();
        println!(
            "{:<13}  {:<14}  {:<13}  {:<30}  {:<20}  {:<7}  {:<15}",
            short(&p.id),
            age(p.created_at),
            state,
            name,
            ns,
            attempt,
            ip
        );
    }
    Ok(())
}

/// `berthctl inspectp`: each pod's status and verbose info as JSON, as `crictl inspectp` prints
/// them (`{"status": …, "info": …}`).
pub async fn inspect_pods(c: &CriClient, ids: &[String]) -> anyhow::Result<()> {
    for id in ids {
        let r = c
            .runtime()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            })
            .await
            .map_err(status_message)
            .with_context(|| format!("PodSandboxStatus {id}"))?
            .into_inner();
        print_json(&with_info(serde_json::to_value(&r.status)?, &r.info))?;
    }
    Ok(())
}

/// `berthctl inspect`: each container's status and verbose info as JSON, as `crictl inspect`
/// prints them.
pub async fn inspect_containers(c: &CriClient, ids: &[String]) -> anyhow::Result<()> {
    for id in ids {
        let r = c
            .runtime()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: true,
            })
            .await
            .map_err(status_message)
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner();
        print_json(&with_info(serde_json::to_value(&r.status)?, &r.info))?;
    }
    Ok(())
}

/// `{"status": status, "info": {key: value parsed as JSON where it is JSON}}`.
fn with_info(
    status: serde_json::Value,
    info: &std::collections::HashMap<String, String>,
) -> serde_json::Value {
    let info: serde_json::Map<String, serde_json::Value> = info
        .iter()
        .map(|(k, v)| {
            let v =
                serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.clone()));
            (k.clone(), v)
        })
        .collect();
    serde_json::json!({ "status": status, "info": info })
}

/// The first 13 characters of an id, as crictl shows them.
fn short(id: &str) -> &str {
    id.get(..13).unwrap_or(id)
}

/// "42 seconds ago" from a creation time in Unix nanoseconds.
fn age(created_ns: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let secs = (now - created_ns / 1_000_000_000).max(0);
    match secs {
        s if s < 60 => format!("{s} seconds ago"),
        s if s < 3600 => format!("{} minutes ago", s / 60),
        s if s < 86400 => format!("{} hours ago", s / 3600),
        s => format!("{} days ago", s / 86400),
    }
}
