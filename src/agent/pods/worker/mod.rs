//! One pod's worker: a loop that compares the pod's manifest with what CRI shows and acts
//! (sandbox, images, init containers in order, main containers, restarts with back-off, probes),
//! then publishes the pod's status; on stop it terminates the pod within its grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

mod publish;
mod pull_progress;
mod stop;

use super::backoff::Backoff;
use super::status::{self, is_exited, is_running};
use crate::agent::AgentContext;
use crate::agent::cluster::events::EventType;
use crate::agent::probes::{self as probe, ProbeHandle, ProbeKind, ProbeResult, ProbeTarget};
use crate::agent::runtime::container_config::{ContainerContext, container_config};
use crate::agent::runtime::etc_hosts;
use crate::agent::runtime::labels;
use crate::agent::runtime::non_root;
use crate::agent::runtime::sandbox_config::{ClusterDns, missing_cluster_dns};
use crate::agent::runtime::sandbox_config::{log_directory, sandbox_config};
use crate::agent::sources::manifest::DesiredPod;
use crate::agent::volumes::downward::NodeAllocatable;
use crate::agent::volumes::objects::ApiObjects;
use crate::agent::volumes::{ApiVolumeFiles, MountError, PreparedVolumes};

/// Probes of one running container instance.
struct Probes {
    id: String,
    startup: Option<ProbeHandle>,
    liveness: Option<ProbeHandle>,
    readiness: Option<ProbeHandle>,
}

/// What the worker keeps per container name.
#[derive(Default)]
struct ContainerTrack {
    /// Instances seen in the last sync, latest attempt first.
    instances: Vec<cri::ContainerStatus>,
    /// Why it waits (reason, message).
    waiting: Option<(String, String)>,
    probes: Option<Probes>,
}

/// The pod's worker.
pub struct PodWorker {
    desired: DesiredPod,
    ctx: Arc<AgentContext>,
    sandbox: Option<(String, u32)>,
    pod_ip: String,
    next_attempt: u32,
    tracks: HashMap<String, ContainerTrack>,
    backoff: Backoff,
    pull_backoff: Backoff,
    pull_failed: HashMap<String, (Instant, String)>,
    status_cache: HashMap<String, cri::ContainerStatus>,
    start_time: Time,
    /// When the worker began (the pod's start time): activeDeadlineSeconds counts from it.
    started: Instant,
    transitions: HashMap<&'static str, (bool, Time)>,
    init_failed: bool,
    message: Option<String>,
    sandbox_failed: Option<Instant>,
    /// Containers whose last creation failed (config, volumes, CreateContainer or
    /// StartContainer), and when: retried a back-off base later (10 s by default, as the
    /// kubelet requeues a failed pod sync), not with a new bundle and shim every sync period.
    create_failed: HashMap<String, Instant>,
    /// The pod's volumes as made ready for the current sandbox (on its first container start):
    /// not made again per container, which rewrote downward files and reset emptyDir modes.
    volumes: Option<PreparedVolumes>,
    /// The last sync started or stopped something.
    acted: bool,
    /// The last sync called a CRI method that changes containers or the sandbox.
    mutated: bool,
    /// When the last such call ended: relists older than this are stale for this pod.
    last_action: Instant,
    /// When the current sandbox was made or adopted.
    sandbox_since: Instant,
    /// The pod IP was read for the current sandbox.
    ip_known: bool,
    /// The pod passed admission (or was adopted running).
    admitted: bool,
    /// The pod was ended for good before its manifest was (evicted, refused, node shutdown):
    /// reason and message of its Failed phase.
    ended: Option<(String, String)>,
    /// Reads of the API server for the pod's volumes and env (None without one).
    api: Option<ApiObjects>,
    /// When the volumes of API objects were last written.
    volumes_refreshed: Instant,
    /// The pod's own user namespace (`hostUsers: false`), once allocated.
    userns: Option<cri::UserNamespace>,
}

/// What a pod's source asks of its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Desire {
    /// Keep the pod running.
    Run,
    /// Stop it within `grace_secs` (None: the pod's terminationGracePeriodSeconds).
    Stop { grace_secs: Option<i64> },
}

/// Puts the pod's own user namespace (if it has one) in a sandbox's namespace options.
fn with_userns(sc: &mut cri::LinuxSandboxSecurityContext, userns: &Option<cri::UserNamespace>) {
    if userns.is_some() {
        sc.namespace_options
            .get_or_insert_with(Default::default)
            .userns_options
            .clone_from(userns);
    }
}

/// Whether `a` and `b` are the same to a running worker: labels, annotations, spec and the
/// conditions its readiness gates name (not the resource version or the rest of the status,
/// which the pod's own status updates change).
pub fn same_for_worker(a: &Pod, b: &Pod) -> bool {
    a.metadata.labels == b.metadata.labels
        && a.metadata.annotations == b.metadata.annotations
        && a.spec == b.spec
        && status::gate_conditions(a) == status::gate_conditions(b)
}

/// Back-off key of sandbox creation (container names cannot contain '/').
const SANDBOX_KEY: &str = "/sandbox";

impl PodWorker {
    /// A worker for `desired` (nothing runs until [`PodWorker::run`]).
    pub fn new(desired: DesiredPod, ctx: Arc<AgentContext>) -> Self {
        let policy = ctx.backoff;
        let ctx_cluster = ctx.cluster.clone();
        Self {
            desired,
            ctx,
            sandbox: None,
            pod_ip: String::new(),
            next_attempt: 0,
            tracks: HashMap::new(),
            backoff: Backoff::new(policy),
            pull_backoff: Backoff::new(policy),
            pull_failed: HashMap::new(),
            status_cache: HashMap::new(),
            start_time: status::now(),
            started: Instant::now(),
            transitions: HashMap::new(),
            init_failed: false,
            message: None,
            sandbox_failed: None,
            create_failed: HashMap::new(),
            volumes: None,
            acted: false,
            mutated: false,
            last_action: Instant::now(),
            sandbox_since: Instant::now(),
            ip_known: false,
            admitted: false,
            ended: None,
            api: ctx_cluster.map(ApiObjects::new),
            volumes_refreshed: Instant::now(),
            userns: None,
        }
    }

    fn pod(&self) -> &Pod {
        &self.desired.pod
    }

    fn spec(&self) -> k8s_openapi::api::core::v1::PodSpec {
        self.pod().spec.clone().unwrap_or_default()
    }

    fn restart_policy(&self) -> String {
        self.pod()
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn host_network(&self) -> bool {
        self.pod()
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    fn grace(&self) -> i64 {
        self.pod()
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0)
    }

    /// Where probes and hooks reach the pod: loopback for host-network pods, else the pod IP
    /// (empty without a pod network: network handlers then fail instead of reaching the host).
    fn probe_host(&self) -> String {
        if self.host_network() {
            "127.0.0.1".to_string()
        } else {
            self.pod_ip.clone()
        }
    }

    fn target(&self, c: &Container, id: &str) -> ProbeTarget {
        // A probe's warnings become ProbeWarning events on the pod, naming the container.
        let on_warning = self.ctx.events.clone().map(|events| {
            let (pod, name) = (self.pod().clone(), c.name.clone());
            let tell = move |message: String| {
                events.pod(
                    &pod,
                    Some(&name),
                    EventType::Warning,
                    "ProbeWarning",
                    message,
                );
            };
            Arc::new(tell) as Arc<dyn Fn(String) + Send + Sync>
        });
        ProbeTarget {
            client: self.ctx.client.clone(),
            container_id: id.to_string(),
            host: self.probe_host(),
            container: c.clone(),
            on_warning,
        }
    }
    /// The node's cluster DNS settings.
    fn cluster_dns(&self) -> ClusterDns<'_> {
        ClusterDns {
            servers: &self.ctx.config.cluster_dns,
            domain: &self.ctx.config.cluster_domain,
        }
    }

    /// Records an event on the pod (on its container `container`) when in a cluster.
    fn event(&self, container: Option<&str>, kind: EventType, reason: &str, message: String) {
        if let Some(r) = &self.ctx.events {
            r.pod(self.pod(), container, kind, reason, message);
        }
    }

    fn pod_ref(&self) -> String {
        let m = &self.pod().metadata;
        format!(
            "{}_{}({})",
            m.name.as_deref().unwrap_or_default(),
            m.namespace.as_deref().unwrap_or_default(),
            self.desired.uid
        )
    }

    /// Syncs until `stop` asks it to stop, then terminates the pod (within the grace period
    /// asked, else the pod's own); returns the pod's final status (every container stopped).
    pub async fn run(
        mut self,
        mut stop: watch::Receiver<Desire>,
        mut updates: watch::Receiver<Pod>,
    ) -> Option<PodStatus> {
        let pod = self.pod_ref();
        tracing::info!(pod = %pod, file = %self.desired.file.display(), "starting pod worker");
        let period = self.ctx.sync_period;
        loop {
            if *stop.borrow() != Desire::Run {
                break;
            }
            self.take_update(&mut updates);
            if self.ended.is_none()
                && let Some(t) = self.ctx.terminations.requested(&self.desired.uid)
            {
                self.end(&t.reason, &t.message, t.grace_secs).await;
            }
            if self.ended.is_none() && self.deadline_left() == Some(Duration::ZERO) {
                let message = "Pod was active on the node longer than the specified deadline";
                tracing::info!(pod = %pod, "active deadline exceeded");
                self.event(None, EventType::Normal, "DeadlineExceeded", message.into());
                // Failed at once, as the kubelet reports it, while the containers get their
                // grace period.
                self.ended = Some(("DeadlineExceeded".into(), message.into()));
                self.publish();
                self.end("DeadlineExceeded", message, None).await;
            }
            if self.ended.is_some() {
                self.publish();
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(period * 10) => {}
                }
                continue;
            }
            self.acted = false;
            self.mutated = false;
            let synced = self.sync().await;
            if self.mutated {
                self.last_action = Instant::now();
            }
            if self.acted {
                // Show what was just started (or stopped) now, not a sync period later.
                if let Err(e) = self.observe().await {
                    tracing::debug!(pod = %pod, error = %e, "observing after a sync");
                }
            }
            match synced {
                Ok(()) => self.message = None,
                Err(e) => {
                    if self.message.as_ref() != Some(&e) {
                        tracing::warn!(pod = %pod, error = %e, "pod sync failed");
                    }
                    self.message = Some(e);
                }
            }
            self.publish();
            // A change to the pod's containers (an exit) wakes the worker at once.
            let changed = self
                .sandbox
                .as_ref()
                .map(|(id, _)| self.ctx.relist.waker(id));
            let pod_changed = async {
                match &changed {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            let wait = self.deadline_left().map_or(period, |left| left.min(period));
            let updated = async {
                // A source gone (the manager forgot the pod) sends nothing more.
                if updates.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
                () = updated => {}
                _ = self.termination_requested() => {}
                () = pod_changed => {}
            }
        }
        let grace = match *stop.borrow() {
            Desire::Stop { grace_secs } => grace_secs,
            Desire::Run => None,
        };
        tracing::info!(pod = %pod, grace_secs = ?grace, "terminating pod");
        self.terminate(grace).await;
        self.publish();
        let key = crate::agent::sources::manifest::key_of(self.pod());
        let last = self.ctx.pods.get(&key).and_then(|p| p.status);
        self.ctx.terminations.forget(&self.desired.uid);
        crate::agent::volumes::cleanup(&self.ctx.pods_dir.join(&self.desired.uid));
        // The pod is gone for good: so are its logs (the kubelet removes them too).
        let dir = log_directory(&self.ctx.pod_log_dir, self.pod());
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "removing the pod's log directory");
        }
        self.ctx.pods.remove(&key);
        tracing::info!(pod = %pod, "pod removed");
        last
    }

    /// Writes the pod's managed /etc/hosts for address `ip` (afresh at each container start, as
    /// the kubelet does) and returns its mount.
    fn write_etc_hosts(&self, ip: &str) -> Result<cri::Mount, String> {
        let pod = self.pod();
        let hostname = crate::agent::runtime::sandbox_config::hostname_of(pod, &self.ctx.node.name);
        let domain = etc_hosts::pod_domain(pod, &self.ctx.config.cluster_domain);
        let node_hosts = if self.host_network() {
            std::fs::read_to_string("/etc/hosts")
                .map_err(|e| format!("reading the node's /etc/hosts: {e}"))?
        } else {
            String::new()
        };
        let content = etc_hosts::content(pod, &[ip], &hostname, domain.as_deref(), &node_hosts);
        etc_hosts::write(&self.ctx.pods_dir.join(&self.desired.uid), &content)
            .map_err(|e| format!("writing the pod's /etc/hosts: {e}"))
    }

    /// Takes the source's latest version of the pod (same hash: labels, annotations,
    /// activeDeadlineSeconds); new labels or annotations are written to the downward API
    /// volumes at once, as the kubelet's next sync writes them.
    fn take_update(&mut self, updates: &mut watch::Receiver<Pod>) {
        // Compared, not `has_changed`: the wait on `changed()` has marked the value seen.
        let pod = {
            let latest = updates.borrow_and_update();
            if same_for_worker(&latest, &self.desired.pod) {
                return;
            }
            latest.clone()
        };
        let meta = |p: &Pod| (p.metadata.labels.clone(), p.metadata.annotations.clone());
        let relabelled = meta(&pod) != meta(&self.desired.pod);
        self.desired.pod = pod;
        if relabelled && self.volumes.is_some() && self.ended.is_none() {
            let pod_dir = self.ctx.pods_dir.join(&self.desired.uid);
            if let Err(e) = crate::agent::volumes::refresh_downward(self.pod(), &pod_dir) {
                tracing::warn!(pod = %self.pod_ref(), error = %e, "refreshing downward API volumes");
            }
            // Projected volumes that mix downward items with API objects: at the next sync.
            self.volumes_refreshed = Instant::now()
                .checked_sub(self.ctx.volume_refresh)
                .unwrap_or(self.volumes_refreshed);
        }
    }

    /// How long the pod may still run under its activeDeadlineSeconds (None: no deadline).
    fn deadline_left(&self) -> Option<Duration> {
        let secs = self.spec().active_deadline_seconds?;
        let deadline = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        Some(deadline.saturating_sub(self.started.elapsed()))
    }

    /// Resolves once a termination is requested for this pod (at once if one already is, say
    /// one that came during the last sync). Other pods' requests and completions, which also
    /// notify `terminations`, do not wake this worker into a sync.
    async fn termination_requested(&self) {
        loop {
            if self.ctx.terminations.is_requested(&self.desired.uid) {
                return;
            }
            self.ctx.terminations.changed().await;
        }
    }

    async fn sync(&mut self) -> Result<(), String> {
        self.ensure_sandbox().await?;
        self.refresh_volumes().await;
        if self.ended.is_some() {
            return Ok(());
        }
        self.observe().await?;
        let spec = self.spec();
        let policy = self.restart_policy();
        if self.init_failed {
            return Ok(());
        }
        for ic in spec.init_containers.iter().flatten() {
            let latest = self.latest(&ic.name);
            match latest {
                Some(l) if is_exited(&l) && l.exit_code == 0 => continue,
                Some(l) if is_exited(&l) => {
                    if policy == "Never" {
                        self.init_failed = true;
                        return Ok(());
                    }
                    self.start_container(ic, Some(&l)).await;
                    return Ok(());
                }
                Some(l) if is_running(&l) => return Ok(()),
                Some(l) => {
                    self.start_created(ic, &l).await;
                    return Ok(());
                }
                None => {
                    self.start_container(ic, None).await;
                    return Ok(());
                }
            }
        }
        for c in &spec.containers {
            match self.latest(&c.name) {
                None => self.start_container(c, None).await,
                Some(l) if is_running(&l) => self.check_probes(c, &l).await,
                Some(l) if is_exited(&l) => {
                    self.drop_probes(&c.name);
                    let restart = match policy.as_str() {
                        "Never" => false,
                        "OnFailure" => l.exit_code != 0,
                        _ => true,
                    };
                    if restart {
                        self.start_container(c, Some(&l)).await;
                    } else if let Some(t) = self.tracks.get_mut(&c.name) {
                        t.waiting = None;
                    }
                }
                Some(l) => self.start_created(c, &l).await,
            }
        }
        Ok(())
    }

    fn latest(&self, name: &str) -> Option<cri::ContainerStatus> {
        self.tracks
            .get(name)
            .and_then(|t| t.instances.first().cloned())
    }

    /// Finds or makes the pod's sandbox. On the first sync, a ready sandbox of this pod with the
    /// same manifest hash (a berthd restart) is adopted; any other of its sandboxes is removed.
    async fn ensure_sandbox(&mut self) -> Result<(), String> {
        let mut rt = self.ctx.client.runtime();
        if let Some((id, attempt)) = self.sandbox.clone() {
            let snap = self.ctx.relist.get();
            if self.ip_known
                && snap.newer_than(self.sandbox_since)
                && snap
                    .sandboxes
                    .get(&id)
                    .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            {
                return Ok(());
            }
            let st = rt
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id.clone(),
                    verbose: false,
                })
                .await;
            match st {
                Ok(r) => {
                    let s = r.into_inner().status.unwrap_or_default();
                    if s.state == cri::PodSandboxState::SandboxReady as i32 {
                        self.pod_ip = s.network.map(|n| n.ip).unwrap_or_default();
                        self.ip_known = true;
                        return Ok(());
                    }
                    tracing::warn!(pod = %self.pod_ref(), sandbox = %id, "pod sandbox is not ready: recreating the pod");
                }
                Err(e) if e.code() == tonic::Code::NotFound => {
                    tracing::warn!(pod = %self.pod_ref(), sandbox = %id, "pod sandbox is gone: recreating the pod");
                }
                Err(e) => return Err(format!("PodSandboxStatus: {}", e.message())),
            }
            self.remove_sandbox(&id, None).await;
            self.mutated = true;
            self.sandbox = None;
            self.ip_known = false;
            self.next_attempt = attempt + 1;
            self.drop_all_probes();
        } else {
            let found = rt
                .list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        label_selector: [(labels::POD_UID.to_string(), self.desired.uid.clone())]
                            .into(),
                        ..Default::default()
                    }),
                })
                .await
                .map_err(|e| format!("ListPodSandbox: {}", e.message()))?
                .into_inner()
                .items;
            for sb in found {
                let attempt = sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
                self.next_attempt = self.next_attempt.max(attempt + 1);
                let same = sb.annotations.get(labels::CONFIG_HASH) == Some(&self.desired.hash);
                if self.sandbox.is_none()
                    && same
                    && sb.state == cri::PodSandboxState::SandboxReady as i32
                {
                    tracing::info!(pod = %self.pod_ref(), sandbox = %sb.id, "adopting running pod");
                    self.sandbox = Some((sb.id.clone(), attempt));
                    self.sandbox_since = Instant::now();
                    self.ip_known = false;
                    self.next_attempt = self.next_attempt.max(attempt);
                } else {
                    tracing::info!(pod = %self.pod_ref(), sandbox = %sb.id, "removing an old sandbox of this pod");
                    self.remove_sandbox(&sb.id, None).await;
                }
            }
            if self.sandbox.is_some() {
                self.admitted = true;
                return Box::pin(self.ensure_sandbox()).await;
            }
        }
        if !self.admitted && self.ctx.terminations.is_shutting_down() {
            self.ended = Some((
                "NodeShutdown".into(),
                "Pod was rejected as the node is shutting down.".into(),
            ));
            return Ok(());
        }
        if !self.admitted {
            let qos = crate::agent::runtime::resources::qos_class(&self.spec());
            let critical = super::terminate::is_critical(self.pod());
            if let Some(why) = self.ctx.pressure.refusal(qos, critical) {
                tracing::warn!(pod = %self.pod_ref(), reason = %why, "pod not admitted");
                self.ended = Some(("Evicted".into(), why));
                return Ok(());
            }
            self.admitted = true;
        }
        let attempt = self.next_attempt;
        let now = Instant::now();
        if let Some(failed_at) = self.sandbox_failed
            && self
                .backoff
                .waiting_until(SANDBOX_KEY, failed_at, now)
                .is_some()
        {
            return Err(self
                .message
                .clone()
                .unwrap_or_else(|| "RunPodSandbox failed".into()));
        }
        if !super::userns::host_users(self.pod()) && self.userns.is_none() {
            self.userns = Some(super::userns::pod_user_namespace(
                &self.ctx.pods_dir,
                &self.desired.uid,
            )?);
        }
        let mut cfg = sandbox_config(
            self.pod(),
            &self.desired.hash,
            attempt,
            &self.ctx.pod_log_dir,
            &self.ctx.node.name,
            &self.ctx.cgroup_root,
            &self.cluster_dns(),
        );
        with_userns(
            cfg.linux
                .get_or_insert_with(Default::default)
                .security_context
                .get_or_insert_with(Default::default),
            &self.userns,
        );
        if let Some(policy) = missing_cluster_dns(&self.spec(), &self.cluster_dns()) {
            self.event(
                None,
                EventType::Warning,
                "MissingClusterDNS",
                format!(
                    "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} policy. Falling back to \"Default\" policy.",
                    self.pod_ref()
                ),
            );
        }
        let dir = log_directory(&self.ctx.pod_log_dir, self.pod());
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return Err(format!("creating log directory {}: {e}", dir.display()));
        }
        let id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: self.spec().runtime_class_name.clone().unwrap_or_default(),
            })
            .await
            .map_err(|e| {
                // Retried with back-off, as container restarts are.
                self.backoff.next(SANDBOX_KEY, now);
                self.sandbox_failed = Some(now);
                format!("RunPodSandbox: {}", e.message())
            })?
            .into_inner()
            .pod_sandbox_id;
        self.backoff.reset(SANDBOX_KEY);
        self.sandbox_failed = None;
        // A new sandbox: its containers are created afresh, not held back by the old one's.
        self.create_failed.clear();
        self.volumes = None;
        tracing::info!(pod = %self.pod_ref(), sandbox = %id, attempt, "pod sandbox running");
        self.sandbox = Some((id, attempt));
        self.sandbox_since = Instant::now();
        self.ip_known = false;
        self.mutated = true;
        self.tracks.clear();
        self.status_cache.clear();
        self.init_failed = false;
        Box::pin(self.ensure_sandbox()).await
    }
    /// Lists the sandbox's containers; asks ContainerStatus only for those whose state changed.
    async fn observe(&mut self) -> Result<(), String> {
        let Some((sandbox, _)) = self.sandbox.clone() else {
            return Ok(());
        };
        let mut rt = self.ctx.client.runtime();
        let snap = self.ctx.relist.get();
        let list = if snap.fresh_for(&sandbox, self.last_action)
            && snap.fresh_for(&sandbox, self.sandbox_since)
        {
            snap.containers.get(&sandbox).cloned().unwrap_or_default()
        } else {
            let began = Instant::now();
            let list = rt
                .list_containers(cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        pod_sandbox_id: sandbox.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .map_err(|e| format!("ListContainers: {}", e.message()))?
                .into_inner()
                .containers;
            self.ctx.relist.record(&sandbox, began, list.clone());
            list
        };
        let mut by_name: HashMap<String, Vec<cri::ContainerStatus>> = HashMap::new();
        let mut cache = HashMap::new();
        for c in list {
            let cached = self
                .status_cache
                .get(&c.id)
                .filter(|s| s.state == c.state)
                .cloned();
            let st = match cached {
                Some(s) => s,
                None => match rt
                    .container_status(cri::ContainerStatusRequest {
                        container_id: c.id.clone(),
                        verbose: false,
                    })
                    .await
                {
                    Ok(r) => {
                        let mut st = r.into_inner().status.unwrap_or_default();
                        fall_back_to_logs(&mut st);
                        st
                    }
                    Err(e) if e.code() == tonic::Code::NotFound => continue,
                    Err(e) => return Err(format!("ContainerStatus {}: {}", c.id, e.message())),
                },
            };
            let name = st
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            cache.insert(c.id.clone(), st.clone());
            by_name.entry(name).or_default().push(st);
        }
        self.status_cache = cache;
        for t in self.tracks.values_mut() {
            t.instances.clear();
        }
        for (name, mut v) in by_name {
            v.sort_by_key(|s| {
                std::cmp::Reverse((
                    s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                    s.created_at,
                ))
            });
            self.tracks.entry(name).or_default().instances = v;
        }
        Ok(())
    }

    fn set_waiting(&mut self, name: &str, reason: &str, message: String) {
        self.tracks.entry(name.to_string()).or_default().waiting =
            Some((reason.to_string(), message));
    }

    /// A container that cannot be created for its config (the kubelet's
    /// CreateContainerConfigError): logged, a Warning `Failed` event, the waiting reason, and
    /// its back-off from `now`.
    fn config_error(&mut self, container: &str, now: Instant, what: &str, e: String) {
        tracing::warn!(pod = %self.pod_ref(), container = %container, error = %e, "{what}");
        self.event(
            Some(container),
            EventType::Warning,
            "Failed",
            format!("Error: {e}"),
        );
        self.set_waiting(container, "CreateContainerConfigError", e);
        self.create_failed.insert(container.to_string(), now);
    }

    /// When a CRI timestamp (ns) happened, as an Instant.
    fn instant_of(ns: i64) -> Instant {
        let now_wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let then = Duration::from_nanos(ns.max(0) as u64);
        Instant::now()
            .checked_sub(now_wall.saturating_sub(then))
            .unwrap_or_else(Instant::now)
    }

    /// Creates and starts (restart number `previous.attempt + 1` of) container `c`, unless it is
    /// backing off, its image is not there, or creating it fails (each shown as a waiting reason).
    async fn start_container(&mut self, c: &Container, previous: Option<&cri::ContainerStatus>) {
        let now = Instant::now();
        let restart_count = previous
            .and_then(|p| p.metadata.as_ref())
            .map(|m| m.attempt + 1)
            .unwrap_or(0);
        if let Some(p) = previous {
            let failed_at = Self::instant_of(p.finished_at);
            if self
                .backoff
                .waiting_until(&c.name, failed_at, now)
                .is_some()
            {
                let msg = format!(
                    "back-off {}s restarting failed container={} pod={}",
                    self.backoff.delay(&c.name).as_secs(),
                    c.name,
                    self.pod_ref()
                );
                self.set_waiting(&c.name, "CrashLoopBackOff", msg);
                self.event(
                    Some(&c.name),
                    EventType::Warning,
                    "BackOff",
                    "Back-off restarting failed container".into(),
                );
                return;
            }
        }
        if let Some(failed_at) = self.create_failed.get(&c.name)
            && now.saturating_duration_since(*failed_at) < self.ctx.backoff.base
        {
            return;
        }
        let Some(image) = self.ensure_image(c).await else {
            return;
        };
        let Some((sandbox, _)) = self.sandbox.clone() else {
            return;
        };
        let qos = crate::agent::runtime::resources::qos_class(&self.spec());
        let host_ip = self.ctx.node.internal_ip.clone();
        let pod_ip = if self.host_network() {
            host_ip.clone()
        } else {
            self.pod_ip.clone()
        };
        let objects = match &self.api {
            Some(api) => match api
                .env_objects(
                    &self.desired.pod,
                    &[c],
                    !self.desired.file.as_os_str().is_empty(),
                )
                .await
            {
                Ok(o) => Some(o),
                Err(e) => {
                    tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "reading env objects");
                    self.set_waiting(&c.name, "CreateContainerConfigError", e);
                    self.create_failed.insert(c.name.clone(), now);
                    return;
                }
            },
            None => None,
        };
        let cctx = ContainerContext {
            qos,
            memory_capacity: self.ctx.node.memory_bytes as f64,
            pod_ip: &pod_ip,
            host_ip: &host_ip,
            node_name: &self.ctx.node.name,
            image: &image,
            swap: &self.ctx.swap,
            oom_group: self.ctx.swap.cgroup_v2 && !self.ctx.config.single_process_oom_kill,
            objects: objects.as_ref(),
        };
        let mut config = match container_config(self.pod(), c, restart_count, &cctx) {
            Ok(config) => config,
            Err(e) => {
                self.config_error(&c.name, now, "container config", e);
                return;
            }
        };
        let mounts = match self.prepared_volumes().await {
            Ok(paths) => crate::agent::volumes::mounts(c, paths, &config.envs),
            Err(e) => Err(MountError::Volume(e)),
        };
        match mounts {
            Ok(m) => config.mounts = m,
            // A subPath refused (leaving its volume) or not made ready: the kubelet's config
            // error, as for the rest of the container's config.
            Err(MountError::SubPath(e)) => {
                self.config_error(&c.name, now, "subPath refused", e);
                return;
            }
            Err(MountError::Volume(e)) => {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "volume setup failed");
                let message = mount_failure(&e);
                // The pod's event, as the kubelet's volume manager records each failed set-up.
                self.event(None, EventType::Warning, "FailedMount", message.clone());
                self.set_waiting(&c.name, "ContainerCreating", message);
                self.create_failed.insert(c.name.clone(), now);
                return;
            }
        }
        if !config
            .mounts
            .iter()
            .any(|m| m.container_path == etc_hosts::CONTAINER_PATH)
            && !pod_ip.is_empty()
        {
            match self.write_etc_hosts(&pod_ip) {
                Ok(m) => config.mounts.push(m),
                Err(e) => {
                    self.config_error(&c.name, now, "writing /etc/hosts", e);
                    return;
                }
            }
        }
        match self.ctx.devices.grant(&self.desired.uid, &c.name).await {
            Ok(Some(granted)) => crate::agent::devices::apply(&granted, &mut config),
            Ok(None) => {}
            Err(e) => {
                self.config_error(&c.name, now, "device allocation", e.to_string());
                return;
            }
        }
        if let Err(e) = self.check_non_root(c, &image).await {
            self.config_error(&c.name, now, "runAsNonRoot refused", e);
            return;
        }
        if !super::userns::host_users(self.pod()) && self.userns.is_none() {
            // A sandbox adopted after a restart: its range, as recorded.
            match super::userns::pod_user_namespace(&self.ctx.pods_dir, &self.desired.uid) {
                Ok(u) => self.userns = Some(u),
                Err(e) => {
                    self.set_waiting(&c.name, "CreateContainerConfigError", e);
                    self.create_failed.insert(c.name.clone(), now);
                    return;
                }
            }
        }
        let mut sandbox_config = sandbox_config(
            self.pod(),
            &self.desired.hash,
            self.sandbox.as_ref().map(|s| s.1).unwrap_or(0),
            &self.ctx.pod_log_dir,
            &self.ctx.node.name,
            &self.ctx.cgroup_root,
            &self.cluster_dns(),
        );
        with_userns(
            sandbox_config
                .linux
                .get_or_insert_with(Default::default)
                .security_context
                .get_or_insert_with(Default::default),
            &self.userns,
        );
        if let Some(sc) = config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .as_mut()
        {
            let ns = sc.namespace_options.get_or_insert_with(Default::default);
            ns.userns_options.clone_from(&self.userns);
        }
        if previous.is_some() {
            self.backoff.next(&c.name, now);
        }
        self.mutated = true;
        let mut rt = self.ctx.client.runtime();
        let id = match rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            })
            .await
        {
            Ok(r) => r.into_inner().container_id,
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e.message(), "CreateContainer failed");
                self.event(
                    Some(&c.name),
                    EventType::Warning,
                    "Failed",
                    format!("Error: {}", e.message()),
                );
                self.set_waiting(&c.name, "CreateContainerError", e.message().to_string());
                self.create_failed.insert(c.name.clone(), now);
                return;
            }
        };
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Created",
            format!("Created container {}", c.name),
        );
        if let Err(e) = rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            self.event(
                Some(&c.name),
                EventType::Warning,
                "Failed",
                format!("Error: {}", e.message()),
            );
            tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e.message(), "StartContainer failed");
            self.set_waiting(&c.name, "RunContainerError", e.message().to_string());
            self.create_failed.insert(c.name.clone(), now);
            return;
        }
        self.create_failed.remove(&c.name);
        tracing::info!(pod = %self.pod_ref(), container = %c.name, id = %id, restart_count, "container started");
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Started",
            format!("Started container {}", c.name),
        );
        self.acted = true;
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let budget = Duration::from_secs(self.grace().max(30) as u64);
            if let Err(e) = super::hooks::run(h, &self.target(c, &id), budget).await {
                tracing::warn!(pod = %self.pod_ref(), container = %c.name, error = %e, "postStart hook failed: killing the container");
                self.stop_with_hook(None, &id, self.grace()).await;
            }
        }
        if let Some(t) = self.tracks.get_mut(&c.name) {
            t.waiting = None;
            // Keep the newest dead instance (its logs and lastState); remove older ones.
            let old: Vec<String> = t
                .instances
                .iter()
                .skip(1)
                .filter(|s| is_exited(s))
                .map(|s| s.id.clone())
                .collect();
            for id in old {
                let _ = rt
                    .remove_container(cri::RemoveContainerRequest { container_id: id })
                    .await;
            }
        } else {
            self.tracks.entry(c.name.clone()).or_default();
        }
    }

    /// The kubelet's `runAsNonRoot` check of `c`, to run image `image`: without a `runAsUser`
    /// the image's user decides, as the runtime's ImageStatus reports it.
    async fn check_non_root(&self, c: &Container, image: &str) -> Result<(), String> {
        let (uid, username) = if non_root::needs_image_user(self.pod(), c) {
            let status = self
                .ctx
                .client
                .images()
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.to_string(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .map_err(|e| format!("failed to get image status {image:?}: {}", e.message()))?;
            // An image the runtime does not describe runs as root.
            match status.into_inner().image {
                Some(i) => (i.uid.map(|u| u.value), i.username),
                None => (None, String::new()),
            }
        } else {
            (None, String::new())
        };
        non_root::verify(self.pod(), c, &self.pod_ref(), uid, &username)
    }

    /// The pod's volumes, made ready on first use for the current sandbox and kept (a failure
    /// is not kept: the next container start tries again).
    async fn prepared_volumes(&mut self) -> Result<&PreparedVolumes, String> {
        let prepared = match self.volumes.take() {
            Some(v) => v,
            None => {
                let pod_dir = self.ctx.pods_dir.join(&self.desired.uid);
                let api = self.api_volume_files().await?;
                let v = crate::agent::volumes::prepare(self.pod(), &pod_dir, &api)?;
                self.volumes_refreshed = Instant::now();
                v
            }
        };
        Ok(self.volumes.insert(prepared))
    }

    /// The files of the pod's volumes of API objects, read now.
    async fn api_volume_files(&mut self) -> Result<ApiVolumeFiles, String> {
        let mut out = ApiVolumeFiles::new();
        let Some(api) = self.api.as_mut() else {
            return Ok(out);
        };
        let pod = &self.desired.pod;
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let pod_dir = self.ctx.pods_dir.join(&self.desired.uid);
        let mut node = None;
        for v in &volumes {
            let node = node.get_or_insert_with(|| NodeAllocatable::detect(&pod_dir));
            if let Some(files) = api.volume_files(pod, v, node).await? {
                out.insert(v.name.clone(), files);
            }
        }
        Ok(out)
    }

    /// Writes the volumes of API objects again when the refresh period passed (the containers
    /// see the new files through the `..data` swap, without a restart).
    async fn refresh_volumes(&mut self) {
        if self.volumes.is_none()
            || self.api.is_none()
            || self.volumes_refreshed.elapsed() < self.ctx.volume_refresh
        {
            return;
        }
        self.volumes_refreshed = Instant::now();
        let files = match self.api_volume_files().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), error = %e, "refreshing volumes");
                return;
            }
        };
        let pod_dir = self.ctx.pods_dir.join(&self.desired.uid);
        for v in self.spec().volumes.iter().flatten() {
            if let Some((f, tmpfs)) = files.get(&v.name)
                && let Err(e) =
                    crate::agent::volumes::refresh_object_volume(self.pod(), &pod_dir, v, f, *tmpfs)
            {
                tracing::warn!(pod = %self.pod_ref(), error = %e, "refreshing a volume");
            }
        }
    }

    /// A container created but never started (a start that failed): remove it and retry later.
    async fn start_created(&mut self, c: &Container, l: &cri::ContainerStatus) {
        self.mutated = true;
        let mut rt = self.ctx.client.runtime();
        let _ = rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: l.id.clone(),
            })
            .await;
        self.set_waiting(&c.name, "ContainerCreating", String::new());
    }

    /// The image to run for `c`, pulled as its pull policy says; None (with a waiting reason)
    /// when it cannot be had yet.
    async fn ensure_image(&mut self, c: &Container) -> Option<String> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| default_pull_policy(&image).to_string());
        let mut images = self.ctx.client.images();
        let spec = cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        if policy != "Always" {
            let present = images
                .image_status(cri::ImageStatusRequest {
                    image: Some(spec.clone()),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().image);
            if let Some(img) = present {
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Pulled",
                    format!("Container image \"{image}\" already present on machine"),
                );
                return Some(img.id);
            }
            if policy == "Never" {
                self.set_waiting(
                    &c.name,
                    "ErrImageNeverPull",
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                );
                return None;
            }
        }
        let now = Instant::now();
        if let Some((failed_at, why)) = self.pull_failed.get(&image).cloned()
            && self
                .pull_backoff
                .waiting_until(&image, failed_at, now)
                .is_some()
        {
            self.set_waiting(
                &c.name,
                "ImagePullBackOff",
                format!("Back-off pulling image \"{image}\": {why}"),
            );
            self.event(
                Some(&c.name),
                EventType::Normal,
                "BackOff",
                format!("Back-off pulling image \"{image}\""),
            );
            return None;
        }
        self.set_waiting(&c.name, "ContainerCreating", String::new());
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let pull_started = Instant::now();
        let mut puller = images.clone();
        let pull = puller.pull_image(cri::PullImageRequest {
            image: Some(spec),
            auth: None,
            sandbox_config: None,
        });
        tokio::pin!(pull);
        // A long pull says how far it has come, every so often.
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + pull_progress::EVERY,
            pull_progress::EVERY,
        );
        let pulled = loop {
            tokio::select! {
                r = &mut pull => break r,
                _ = ticker.tick() => {
                    if let Some((received, total)) = pull_progress::progress(&self.ctx.client, &image).await {
                        self.event(
                            Some(&c.name),
                            EventType::Normal,
                            "Pulling",
                            pull_progress::message(&image, received, total),
                        );
                    }
                }
            }
        };
        match pulled {
            Ok(r) => {
                let took = pull_started.elapsed();
                self.pull_backoff.reset(&image);
                self.pull_failed.remove(&image);
                let image_ref = r.into_inner().image_ref;
                // The size as the kubelet reports it: the image's, from ImageStatus.
                let size = images
                    .image_status(cri::ImageStatusRequest {
                        image: Some(cri::ImageSpec {
                            image: image_ref.clone(),
                            ..Default::default()
                        }),
                        verbose: false,
                    })
                    .await
                    .ok()
                    .and_then(|r| r.into_inner().image)
                    .map(|i| format!(" Image size: {} bytes.", i.size))
                    .unwrap_or_default();
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {took:?}.{size}"),
                );
                Some(image_ref)
            }
            Err(e) => {
                tracing::warn!(pod = %self.pod_ref(), image = %image, error = %e.message(), "image pull failed");
                self.pull_backoff.next(&image, now);
                self.pull_failed
                    .insert(image.clone(), (now, e.message().to_string()));
                let why = format!("failed to pull image \"{image}\": {}", e.message());
                self.event(Some(&c.name), EventType::Warning, "Failed", why.clone());
                self.set_waiting(&c.name, "ErrImagePull", why);
                None
            }
        }
    }

    /// Starts the probes of a newly running instance; kills it when liveness (or startup) failed.
    async fn check_probes(&mut self, c: &Container, l: &cri::ContainerStatus) {
        let target = self.target(c, &l.id);
        let pod_grace = self.grace();
        let pod_ref = self.pod_ref();
        let track = self.tracks.entry(c.name.clone()).or_default();
        track.waiting = None;
        if track.probes.as_ref().map(|p| p.id.as_str()) != Some(l.id.as_str()) {
            let startup = c
                .startup_probe
                .clone()
                .map(|p| probe::spawn(ProbeKind::Startup, p, target.clone(), None));
            let gate = startup.as_ref().map(|s| s.result.clone());
            let liveness = c
                .liveness_probe
                .clone()
                .map(|p| probe::spawn(ProbeKind::Liveness, p, target.clone(), gate.clone()));
            let readiness = c
                .readiness_probe
                .clone()
                .map(|p| probe::spawn(ProbeKind::Readiness, p, target.clone(), gate.clone()));
            track.probes = Some(Probes {
                id: l.id.clone(),
                startup,
                liveness,
                readiness,
            });
        }
        let Some(p) = &track.probes else { return };
        let failed = [(&p.startup, "startup"), (&p.liveness, "liveness")]
            .into_iter()
            .find(|(h, _)| h.as_ref().is_some_and(|h| h.get() == ProbeResult::Failure))
            .map(|(_, k)| k);
        if let Some(kind) = failed {
            let probe = if kind == "startup" {
                c.startup_probe.clone()
            } else {
                c.liveness_probe.clone()
            };
            let grace = probe
                .and_then(|p| p.termination_grace_period_seconds)
                .unwrap_or(pod_grace);
            tracing::info!(pod = %pod_ref, container = %c.name, "container failed {kind} probe, will be restarted");
            track.probes = None;
            let what = if kind == "startup" {
                "Startup"
            } else {
                "Liveness"
            };
            self.event(
                Some(&c.name),
                EventType::Warning,
                "Unhealthy",
                format!("{what} probe failed"),
            );
            self.event(
                Some(&c.name),
                EventType::Normal,
                "Killing",
                format!(
                    "Container {} failed {kind} probe, will be restarted",
                    c.name
                ),
            );
            self.stop_with_hook(Some(c), &l.id, grace).await;
            self.acted = true;
            self.mutated = true;
        }
    }

    fn drop_probes(&mut self, name: &str) {
        if let Some(t) = self.tracks.get_mut(name) {
            t.probes = None;
        }
    }

    fn drop_all_probes(&mut self) {
        for t in self.tracks.values_mut() {
            t.probes = None;
        }
    }
}

/// The kubelet's default pull policy: Always for `:latest` or no tag, else IfNotPresent.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// An exited container's termination message from the end of its log, as the kubelet: when its
/// policy is FallbackToLogsOnError, it failed, it ran (not ContainerCannotRun) and it wrote no
/// termination message file.
fn fall_back_to_logs(st: &mut cri::ContainerStatus) {
    let fallback = st.state == cri::ContainerState::ContainerExited as i32
        && st.exit_code != 0
        && st.reason != "ContainerCannotRun"
        && st.message.is_empty()
        && st
            .annotations
            .get(labels::TERMINATION_MESSAGE_POLICY)
            .is_some_and(|p| p == "FallbackToLogsOnError");
    if !fallback || st.log_path.is_empty() {
        return;
    }
    match crate::logs::termination_tail(std::path::Path::new(&st.log_path)) {
        Ok(tail) => st.message = tail,
        Err(e) => {
            tracing::warn!(container = %st.id, log = %st.log_path, error = %e, "reading the log for the termination message");
        }
    }
}

/// The kubelet's message for a volume that could not be set up: `MountVolume.SetUp failed for
/// volume "<name>" : <why>` (the volume code names the volume as `volume "<name>": <why>`).
fn mount_failure(e: &str) -> String {
    if e.starts_with("MountVolume.") {
        return e.to_string();
    }
    if let Some(rest) = e.strip_prefix("volume \"")
        && let Some((name, why)) = rest.split_once("\": ")
    {
        return format!("MountVolume.SetUp failed for volume \"{name}\" : {why}");
    }
    format!("MountVolume.SetUp failed: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_by_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("127.0.0.1:5050/busybox"), "Always");
        assert_eq!(
            default_pull_policy("127.0.0.1:5050/busybox:1.36"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn mount_failures_read_as_the_kubelets() {
        assert_eq!(
            mount_failure("volume \"info\": downwardAPI item \"x\": bad"),
            "MountVolume.SetUp failed for volume \"info\" : downwardAPI item \"x\": bad"
        );
        assert_eq!(
            mount_failure("MountVolume.SetUp failed for volume \"s\" : secret \"nope\" not found"),
            "MountVolume.SetUp failed for volume \"s\" : secret \"nope\" not found"
        );
        assert_eq!(mount_failure("odd"), "MountVolume.SetUp failed: odd");
    }
}
