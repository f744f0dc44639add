//! Labels and annotations the agent puts on CRI objects, as the kubelet names them.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest, Sha256};

/// Pod name label.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod UID label.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Container spec hash annotation.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Restart count annotation.
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Termination message path annotation.
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Termination message policy annotation.
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Pod grace period annotation.
pub const POD_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Marks sandboxes this agent made (so it never touches a kubelet's or crictl's).
pub const MANAGED_BY: &str = "berth.io/managed-by";
/// Value of [`MANAGED_BY`].
pub const AGENT: &str = "berth-agent";
/// Hash of the manifest's pod (static pods carry it as the kubelet does).
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// Where the pod came from.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";

/// Labels of a pod sandbox: the pod's own labels plus the kubelet's.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    l.insert(
        POD_NAME.into(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    l.insert(
        POD_NAMESPACE.into(),
        pod.metadata.namespace.clone().unwrap_or_default(),
    );
    l.insert(POD_UID.into(), pod.metadata.uid.clone().unwrap_or_default());
    l.insert(MANAGED_BY.into(), AGENT.into());
    l
}

/// Annotations of a pod sandbox: the pod's own plus the static-pod source and hash.
pub fn sandbox_annotations(pod: &Pod, hash: &str) -> HashMap<String, String> {
    let mut a: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    a.insert(CONFIG_HASH.into(), hash.into());
    a.insert(CONFIG_SOURCE.into(), "file".into());
    a
}

/// Labels of a container.
pub fn container_labels(pod: &Pod, c: &Container) -> HashMap<String, String> {
    let mut l = HashMap::new();
    l.insert(
        POD_NAME.into(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    l.insert(
        POD_NAMESPACE.into(),
        pod.metadata.namespace.clone().unwrap_or_default(),
    );
    l.insert(POD_UID.into(), pod.metadata.uid.clone().unwrap_or_default());
    l.insert(CONTAINER_NAME.into(), c.name.clone());
    l
}

/// Annotations of a container.
pub fn container_annotations(
    c: &Container,
    restart_count: u32,
    grace_secs: i64,
) -> HashMap<String, String> {
    let mut a = HashMap::new();
    a.insert(CONTAINER_HASH.into(), container_hash(c));
    a.insert(RESTART_COUNT.into(), restart_count.to_string());
    a.insert(
        TERMINATION_MESSAGE_PATH.into(),
        c.termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
    );
    a.insert(
        TERMINATION_MESSAGE_POLICY.into(),
        c.termination_message_policy
            .clone()
            .unwrap_or_else(|| "File".into()),
    );
    a.insert(POD_GRACE.into(), grace_secs.to_string());
    a
}

/// A short hash of the container's spec.
pub fn container_hash(c: &Container) -> String {
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..4])
}
