//! Building a v1 PodStatus from what the agent observed through CRI.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A CRI timestamp (ns since the epoch) as a v1 Time; zero is none.
pub fn time_of(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    Timestamp::from_nanosecond(ns as i128).ok().map(Time)
}

/// Container names as the kubelet lists them in condition messages: `[a b]`.
pub fn name_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// The pod's own conditions its readiness gates name, as (type, status) pairs: others set them
/// in the API server and the Ready condition waits for them.
pub fn gate_conditions(pod: &Pod) -> Vec<(String, String)> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref());
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    gates
        .into_iter()
        .flatten()
        .filter_map(|g| {
            conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == g.condition_type)
                .map(|c| (c.type_.clone(), c.status.clone()))
        })
        .collect()
}

/// Why the pod's readiness gates hold it back, in the kubelet's words (None: every gate's
/// condition is True).
pub fn unready_gates(pod: &Pod) -> Option<String> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref())?;
    let present = gate_conditions(pod);
    let why: Vec<String> = gates
        .iter()
        .filter_map(
            |g| match present.iter().find(|(t, _)| *t == g.condition_type) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {:?} does not exist.",
                    g.condition_type
                )),
                Some((_, status)) if status != "True" => Some(format!(
                    "the status of pod readiness gate {:?} is not \"True\", but {status}",
                    g.condition_type
                )),
                Some(_) => None,
            },
        )
        .collect();
    (!why.is_empty()).then(|| why.join(", "))
}

/// Now, as a v1 Time.
pub fn now() -> Time {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    Time(Timestamp::from_nanosecond(ns).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// What the agent knows about one container beyond CRI.
pub struct ContainerView<'a> {
    /// The spec's name.
    pub name: &'a str,
    /// The spec's image.
    pub image: &'a str,
    /// Instances of this container, latest first.
    pub instances: &'a [cri::ContainerStatus],
    /// Why it is waiting (reason, message), if it is.
    pub waiting: Option<&'a (String, String)>,
    /// Readiness verdict.
    pub ready: bool,
    /// Startup verdict.
    pub started: bool,
    /// `<runtime>://` prefix of container IDs.
    pub runtime_name: &'a str,
    /// An init container: ready once it exited with 0, as the kubelet reports it.
    pub init: bool,
}

fn terminated(s: &cri::ContainerStatus, runtime: &str) -> ContainerState {
    let reason = if !s.reason.is_empty() {
        s.reason.clone()
    } else if s.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(format!("{runtime}://{}", s.id)),
            exit_code: s.exit_code,
            finished_at: time_of(s.finished_at),
            message: (!s.message.is_empty()).then(|| s.message.clone()),
            reason: Some(reason),
            started_at: time_of(s.started_at),
            signal: None,
        }),
        ..Default::default()
    }
}

/// All termination messages of a pod together hold at most this many bytes (the kubelet's
/// budget, shared evenly by its containers).
pub const POD_TERMINATION_MESSAGES_BYTES: usize = 12 * 1024;

/// Cuts each terminated state's message (current and last) to the pod's budget shared by its
/// containers, init containers included, as the kubelet's status manager does.
pub fn limit_termination_messages(init: &mut [ContainerStatus], regular: &mut [ContainerStatus]) {
    let count = init.len() + regular.len();
    if count == 0 {
        return;
    }
    let each = POD_TERMINATION_MESSAGES_BYTES / count;
    for st in init.iter_mut().chain(regular.iter_mut()) {
        for state in [st.state.as_mut(), st.last_state.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(m) = state.terminated.as_mut().and_then(|t| t.message.as_mut())
                && m.len() > each
            {
                let mut end = each;
                while !m.is_char_boundary(end) {
                    end -= 1;
                }
                m.truncate(end);
            }
        }
    }
}

/// Whether a CRI container is running.
pub fn is_running(s: &cri::ContainerStatus) -> bool {
    s.state == cri::ContainerState::ContainerRunning as i32
}

/// Whether a CRI container has exited.
pub fn is_exited(s: &cri::ContainerStatus) -> bool {
    s.state == cri::ContainerState::ContainerExited as i32
}

/// The v1 ContainerStatus of one container.
pub fn container_status(v: &ContainerView<'_>) -> ContainerStatus {
    let latest = v.instances.first();
    let previous = v.instances.get(1);
    let waiting = |reason: &str, message: &str| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
        }),
        ..Default::default()
    };
    let (state, last_state) = match (latest, v.waiting) {
        // Waiting to start again: the latest instance is the last termination.
        (Some(l), Some((r, m))) if is_exited(l) => {
            (waiting(r, m), Some(terminated(l, v.runtime_name)))
        }
        (_, Some((r, m))) => (
            waiting(r, m),
            previous.map(|p| terminated(p, v.runtime_name)),
        ),
        (Some(l), None) if is_running(l) => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: time_of(l.started_at),
                }),
                ..Default::default()
            },
            previous.map(|p| terminated(p, v.runtime_name)),
        ),
        (Some(l), None) if is_exited(l) => (
            terminated(l, v.runtime_name),
            previous.map(|p| terminated(p, v.runtime_name)),
        ),
        _ => (waiting("ContainerCreating", ""), None),
    };
    let running = latest.is_some_and(is_running) && v.waiting.is_none();
    ContainerStatus {
        name: v.name.to_string(),
        image: v.image.to_string(),
        image_id: latest.map(|l| l.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|l| format!("{}://{}", v.runtime_name, l.id)),
        restart_count: latest
            .and_then(|l| l.metadata.as_ref())
            .map(|m| m.attempt as i32)
            .unwrap_or(0),
        ready: if v.init {
            latest.is_some_and(|l| is_exited(l) && l.exit_code == 0)
        } else {
            running && v.ready
        },
        started: Some(running && v.started),
        state: Some(state),
        last_state: last_state.map(Some).unwrap_or_default(),
        ..Default::default()
    }
}

/// Counts used by [`phase`].
#[derive(Debug, Default)]
pub struct PhaseInput {
    /// Init containers not all done yet.
    pub init_pending: bool,
    /// An init container failed for good (restartPolicy Never).
    pub init_failed: bool,
    /// Main containers running.
    pub running: usize,
    /// Main containers never started yet.
    pub waiting: usize,
    /// Main containers that exited (or wait to restart after an exit).
    pub stopped: usize,
    /// Of those, exited 0.
    pub succeeded: usize,
}

/// The pod phase from its containers, as the kubelet computes it.
pub fn phase(restart_policy: &str, p: &PhaseInput) -> &'static str {
    if p.init_failed {
        return "Failed";
    }
    if p.init_pending {
        return "Pending";
    }
    if p.waiting > 0 {
        return "Pending";
    }
    if p.running > 0 {
        return "Running";
    }
    if p.stopped > 0 {
        return match restart_policy {
            "Always" => "Running",
            "OnFailure" if p.stopped == p.succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ if p.stopped == p.succeeded => "Succeeded",
            _ => "Failed",
        };
    }
    "Pending"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_init_container_is_ready_and_a_finished_container_is_not() {
        let exited = |code| cri::ContainerStatus {
            id: "c1".into(),
            state: cri::ContainerState::ContainerExited as i32,
            exit_code: code,
            ..Default::default()
        };
        let view = |instances: &[cri::ContainerStatus], init| {
            container_status(&ContainerView {
                name: "c",
                image: "busybox",
                instances,
                waiting: None,
                ready: true,
                started: true,
                runtime_name: "berth",
                init,
            })
            .ready
        };
        assert!(view(&[exited(0)], true));
        assert!(!view(&[exited(1)], true));
        assert!(!view(&[], true));
        assert!(!view(&[exited(0)], false));
    }

    #[test]
    fn termination_messages_share_the_pods_budget() {
        let term = |m: &str| ContainerStatus {
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    message: Some(m.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    message: Some(m.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let message = |s: &ContainerStatus| {
            let get = |st: &Option<ContainerState>| {
                st.as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.message.clone())
                    .unwrap_or_default()
            };
            (get(&s.state), get(&s.last_state))
        };
        let big = "é".repeat(4000);
        let mut init = vec![term(&big)];
        let mut regular = vec![term("short"), term(&big)];
        limit_termination_messages(&mut init, &mut regular);
        // 12 KiB over 3 containers: 4096 bytes each, cut on a character boundary.
        let (now, last) = message(&init[0]);
        assert_eq!((now.len(), last.len()), (4096, 4096));
        assert_eq!(message(&regular[0]), ("short".into(), "short".into()));
        assert_eq!(message(&regular[1]).0.len(), 4096);
        let mut alone = vec![term(&"x".repeat(20_000))];
        limit_termination_messages(&mut [], &mut alone);
        assert_eq!(message(&alone[0]).0.len(), POD_TERMINATION_MESSAGES_BYTES);
    }

    #[test]
    fn phases() {
        let p = |running, waiting, stopped, succeeded| PhaseInput {
            running,
            waiting,
            stopped,
            succeeded,
            ..Default::default()
        };
        assert_eq!(phase("Always", &p(1, 0, 0, 0)), "Running");
        assert_eq!(phase("Always", &p(0, 1, 0, 0)), "Pending");
        assert_eq!(phase("Always", &p(0, 0, 1, 0)), "Running");
        assert_eq!(phase("Never", &p(0, 0, 2, 1)), "Failed");
        assert_eq!(phase("Never", &p(0, 0, 2, 2)), "Succeeded");
        assert_eq!(phase("OnFailure", &p(0, 0, 1, 0)), "Running");
        assert_eq!(phase("OnFailure", &p(0, 0, 1, 1)), "Succeeded");
        let init = PhaseInput {
            init_pending: true,
            ..Default::default()
        };
        assert_eq!(phase("Always", &init), "Pending");
    }

    #[test]
    fn readiness_gates_name_what_holds_the_pod_back() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "readinessGates": [
                {"conditionType": "example.com/a"}, {"conditionType": "example.com/b"}]},
            "status": {"conditions": [
                {"type": "example.com/a", "status": "False"},
                {"type": "Ready", "status": "True"}]}
        }))
        .expect("pod");
        assert_eq!(
            gate_conditions(&pod),
            vec![("example.com/a".to_string(), "False".to_string())]
        );
        assert_eq!(
            unready_gates(&pod).as_deref(),
            Some(
                "the status of pod readiness gate \"example.com/a\" is not \"True\", but False, \
                 corresponding condition of pod readiness gate \"example.com/b\" does not exist."
            )
        );
        let mut all_true = pod.clone();
        all_true.status = serde_json::from_value(serde_json::json!({"conditions": [
            {"type": "example.com/a", "status": "True"},
            {"type": "example.com/b", "status": "True"}]}))
        .ok();
        assert_eq!(unready_gates(&all_true), None);
        let mut no_gates = pod;
        no_gates.spec.as_mut().expect("spec").readiness_gates = None;
        assert_eq!(unready_gates(&no_gates), None);
    }
}
