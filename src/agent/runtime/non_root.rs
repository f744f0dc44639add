//! The `runAsNonRoot` check made before a container is created (the kubelet's rules and messages).

use k8s_openapi::api::core::v1::{Container, Pod};

/// The largest user id the kubelet accepts (`math.MaxInt32`).
const MAX_USER_ID: i64 = i32::MAX as i64;

/// Whether `c` of `pod` must not run as root (its `runAsNonRoot` over the pod's), and the user it
/// is told to run as (its `runAsUser` over the pod's).
pub fn non_root_policy(pod: &Pod, c: &Container) -> (bool, Option<i64>) {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    let user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|p| p.run_as_user));
    (non_root, user)
}

/// Whether the image's user must be read to decide (`runAsNonRoot` without a `runAsUser`).
pub fn needs_image_user(pod: &Pod, c: &Container) -> bool {
    matches!(non_root_policy(pod, c), (true, None))
}

/// Checks `runAsNonRoot` for `c` of `pod` (named `pod_ref`, `name_namespace(uid)`), the image's
/// user being `image_uid` or else `image_username` (neither: root). The error is the kubelet's
/// message, shown as the container's `CreateContainerConfigError`.
pub fn verify(
    pod: &Pod,
    c: &Container,
    pod_ref: &str,
    image_uid: Option<i64>,
    image_username: &str,
) -> Result<(), String> {
    let (non_root, user) = non_root_policy(pod, c);
    if !non_root {
        return Ok(());
    }
    let whose = format!("(pod: {pod_ref:?}, container: {})", c.name);
    if let Some(uid) = user {
        if uid == 0 {
            return Err(format!(
                "container's runAsUser breaks non-root policy {whose}"
            ));
        }
        return Ok(());
    }
    match image_uid {
        None if !image_username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({image_username}), cannot verify user is non-root {whose}"
        )),
        None | Some(0) => Err(format!(
            "container has runAsNonRoot and image will run as root {whose}"
        )),
        Some(uid) if !(0..=MAX_USER_ID).contains(&uid) => Err(format!(
            "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({MAX_USER_ID})): must be between 0 and {MAX_USER_ID}, inclusive {whose}"
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(pod_sc: serde_json::Value, container_sc: serde_json::Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "securityContext": pod_sc,
                "containers": [{"name": "c", "securityContext": container_sc}]
            }
        }))
        .expect("pod");
        let c = pod.spec.as_ref().expect("spec").containers[0].clone();
        (pod, c)
    }

    const REF: &str = "p_default(u1)";

    #[test]
    fn run_as_user_zero_breaks_the_policy_whichever_level_sets_it() {
        let (p, c) = pod(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({"runAsUser": 0}),
        );
        assert!(!needs_image_user(&p, &c));
        assert_eq!(
            verify(&p, &c, REF, Some(1000), ""),
            Err("container's runAsUser breaks non-root policy (pod: \"p_default(u1)\", container: c)".into())
        );
        // The container's runAsUser overrides the pod's.
        let (p, c) = pod(
            serde_json::json!({"runAsNonRoot": true, "runAsUser": 0}),
            serde_json::json!({"runAsUser": 1000}),
        );
        assert_eq!(verify(&p, &c, REF, Some(0), ""), Ok(()));
        // The container's runAsNonRoot: false overrides the pod's true.
        let (p, c) = pod(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({"runAsNonRoot": false}),
        );
        assert!(!needs_image_user(&p, &c));
        assert_eq!(verify(&p, &c, REF, None, ""), Ok(()));
    }

    #[test]
    fn the_image_user_decides_without_run_as_user() {
        let (p, c) = pod(
            serde_json::json!({}),
            serde_json::json!({"runAsNonRoot": true}),
        );
        assert!(needs_image_user(&p, &c));
        let root = "container has runAsNonRoot and image will run as root (pod: \"p_default(u1)\", container: c)";
        assert_eq!(verify(&p, &c, REF, None, ""), Err(root.into()));
        assert_eq!(verify(&p, &c, REF, Some(0), ""), Err(root.into()));
        assert_eq!(
            verify(&p, &c, REF, None, "nobody"),
            Err("container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"p_default(u1)\", container: c)".into())
        );
        assert!(
            verify(&p, &c, REF, Some(1 << 40), "")
                .is_err_and(|e| e.contains("invalid user id (1099511627776)"))
        );
        assert_eq!(verify(&p, &c, REF, Some(65534), ""), Ok(()));
        // Without the policy, root images run.
        let (p, c) = pod(serde_json::json!({}), serde_json::json!({}));
        assert_eq!(verify(&p, &c, REF, None, ""), Ok(()));
    }
}
