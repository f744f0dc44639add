//! A pod worker's published status: phase, conditions, container statuses, readiness verdicts.

use k8s_openapi::api::core::v1::{Container, HostIP, PodCondition, PodIP, PodStatus};

use super::PodWorker;
use crate::agent::pods::status::{self, ContainerView, PhaseInput, is_exited};
use crate::agent::probes::{ProbeHandle, ProbeResult};

impl PodWorker {
    /// Readiness and startup verdicts of the running instance of `c`: a container with a probe
    /// whose probing has not begun for this instance is neither started nor ready yet.
    pub(super) fn verdicts(&self, c: &Container) -> (bool, bool) {
        let track = self.tracks.get(&c.name);
        let current = track
            .and_then(|t| t.instances.first())
            .map(|l| l.id.as_str());
        let probes = track
            .and_then(|t| t.probes.as_ref())
            .filter(|p| Some(p.id.as_str()) == current);
        let passed = |handle: Option<&ProbeHandle>, has: bool| match handle {
            Some(h) => h.get() == ProbeResult::Success,
            None => !has,
        };
        let started = passed(
            probes.and_then(|p| p.startup.as_ref()),
            c.startup_probe.is_some(),
        );
        let ready = started
            && passed(
                probes.and_then(|p| p.readiness.as_ref()),
                c.readiness_probe.is_some(),
            );
        (ready, started)
    }

    pub(super) fn condition(&mut self, kind: &'static str, ok: bool) -> PodCondition {
        let now = status::now();
        let entry = self.transitions.entry(kind).or_insert((ok, now.clone()));
        if entry.0 != ok {
            *entry = (ok, now);
        }
        PodCondition {
            type_: kind.to_string(),
            status: if ok { "True" } else { "False" }.to_string(),
            last_transition_time: Some(entry.1.clone()),
            ..Default::default()
        }
    }

    /// Initialized as the kubelet words it: true once every init container has succeeded (or the
    /// pod has completed), else false naming the init containers not done.
    fn initialized_condition(&mut self, phase: &str, incomplete: &[&str]) -> PodCondition {
        let done = incomplete.is_empty() || phase == "Succeeded";
        let mut c = self.condition("Initialized", done);
        if phase == "Succeeded" {
            c.reason = Some("PodCompleted".into());
        } else if !done {
            c.reason = Some("ContainersNotInitialized".into());
            c.message = Some(format!(
                "containers with incomplete status: {}",
                status::name_list(incomplete)
            ));
        }
        c
    }

    /// Ready and ContainersReady as the kubelet words them: true while the pod runs with every
    /// container ready (and, for Ready, every readiness gate's condition True); a completed pod
    /// says PodCompleted, else the unready containers or gates are named.
    fn ready_condition(
        &mut self,
        kind: &'static str,
        phase: &str,
        unready: &[&str],
    ) -> PodCondition {
        let containers_ready = unready.is_empty() && phase == "Running";
        // Ready also waits for the conditions the pod's readiness gates name.
        let gates = (kind == "Ready" && containers_ready)
            .then(|| status::unready_gates(self.pod()))
            .flatten();
        let mut c = self.condition(kind, containers_ready && gates.is_none());
        if phase == "Succeeded" {
            c.reason = Some("PodCompleted".into());
        } else if !unready.is_empty() {
            c.reason = Some("ContainersNotReady".into());
            c.message = Some(format!(
                "containers with unready status: {}",
                status::name_list(unready)
            ));
        } else if let Some(why) = gates {
            c.reason = Some("ReadinessGatesNotReady".into());
            c.message = Some(why);
        }
        c
    }

    /// Puts the pod (spec and current status) where the status endpoint reads it.
    pub(super) fn publish(&mut self) {
        let spec = self.spec();
        let policy = self.restart_policy();
        let runtime = self.ctx.runtime_name.clone();
        let mut init_statuses = Vec::new();
        let mut init_incomplete = Vec::new();
        // In a pod with init containers, a container that has not started yet waits with
        // PodInitializing (ContainerCreating otherwise), as the kubelet reports it.
        let has_init = spec.init_containers.as_ref().is_some_and(|i| !i.is_empty());
        let initializing = ("PodInitializing".to_string(), String::new());
        for ic in spec.init_containers.iter().flatten() {
            let t = self.tracks.get(&ic.name);
            let instances = t.map(|t| t.instances.as_slice()).unwrap_or_default();
            let done = instances
                .first()
                .is_some_and(|l| is_exited(l) && l.exit_code == 0);
            if !done {
                init_incomplete.push(ic.name.as_str());
            }
            let waiting = t
                .and_then(|t| t.waiting.as_ref())
                .or((instances.is_empty()).then_some(&initializing));
            init_statuses.push(status::container_status(&ContainerView {
                name: &ic.name,
                image: ic.image.as_deref().unwrap_or_default(),
                instances,
                waiting,
                ready: done,
                started: false,
                runtime_name: &runtime,
                init: true,
            }));
        }
        let init_pending = !init_incomplete.is_empty();
        let mut statuses = Vec::new();
        let mut unready = Vec::new();
        let mut counts = PhaseInput {
            init_pending,
            init_failed: self.init_failed,
            ..Default::default()
        };
        for c in &spec.containers {
            let (ready, started) = self.verdicts(c);
            let t = self.tracks.get(&c.name);
            let instances = t.map(|t| t.instances.as_slice()).unwrap_or_default();
            let mut waiting = t.and_then(|t| t.waiting.as_ref()).cloned();
            if has_init && instances.is_empty() && waiting.is_none() {
                waiting = Some(initializing.clone());
            }
            let st = status::container_status(&ContainerView {
                name: &c.name,
                image: c.image.as_deref().unwrap_or_default(),
                instances,
                waiting: waiting.as_ref(),
                ready,
                started,
                runtime_name: &runtime,
                init: false,
            });
            let state = st.state.clone().unwrap_or_default();
            // Stopped: terminated now, or waiting after a terminated instance.
            let terminated = state
                .terminated
                .as_ref()
                .or_else(|| st.last_state.as_ref().and_then(|l| l.terminated.as_ref()));
            if state.running.is_some() {
                counts.running += 1;
            } else if let Some(term) = terminated {
                counts.stopped += 1;
                if term.exit_code == 0 {
                    counts.succeeded += 1;
                }
            } else {
                counts.waiting += 1;
            }
            if !st.ready {
                unready.push(c.name.as_str());
            }
            statuses.push(st);
        }
        let phase = if self.ended.is_some() {
            "Failed"
        } else {
            status::phase(&policy, &counts)
        };
        let sandbox_ready = self.sandbox.is_some();
        let mut conditions = vec![
            self.condition("PodReadyToStartContainers", sandbox_ready),
            self.initialized_condition(phase, &init_incomplete),
            self.ready_condition("Ready", phase, &unready),
            self.ready_condition("ContainersReady", phase, &unready),
            self.condition("PodScheduled", true),
        ];
        if let Some((reason, message)) = self.ended.clone()
            && (reason == "Evicted" || reason == crate::agent::shutdown::REASON)
            && self.admitted
        {
            // The kubelet marks pods it ends itself as disrupted.
            let mut c = self.condition("DisruptionTarget", true);
            c.reason = Some("TerminationByKubelet".into());
            c.message = Some(message);
            conditions.push(c);
        }
        let host_ip = self.ctx.node.internal_ip.clone();
        let pod_ip = if self.host_network() {
            host_ip.clone()
        } else {
            self.pod_ip.clone()
        };
        status::limit_termination_messages(&mut init_statuses, &mut statuses);
        let mut pod = self.pod().clone();
        pod.spec.get_or_insert_default().node_name = Some(self.ctx.node.name.clone());
        pod.metadata.creation_timestamp = Some(self.start_time.clone());
        pod.status = Some(PodStatus {
            phase: Some(phase.to_string()),
            conditions: Some(conditions),
            container_statuses: Some(statuses),
            init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
            host_ip: (!host_ip.is_empty()).then(|| host_ip.clone()),
            host_ips: (!host_ip.is_empty()).then(|| {
                vec![HostIP {
                    ip: host_ip.clone(),
                }]
            }),
            pod_ip: (!pod_ip.is_empty()).then(|| pod_ip.clone()),
            pod_ips: (!pod_ip.is_empty()).then(|| vec![PodIP { ip: pod_ip.clone() }]),
            qos_class: Some(crate::agent::runtime::resources::qos_class(&spec).to_string()),
            start_time: Some(self.start_time.clone()),
            message: match &self.ended {
                Some((_, m)) => Some(m.clone()),
                None => self.message.clone(),
            },
            reason: self.ended.as_ref().map(|(r, _)| r.clone()),
            ..Default::default()
        });
        self.ctx
            .pods
            .insert(crate::agent::sources::manifest::key_of(self.pod()), pod);
    }
}
