//! Local ephemeral storage limits: pods whose emptyDir volumes, containers or whole pod use more
//! disk than their sizeLimit or ephemeral-storage limits are evicted at once, as the kubelet
//! does with local storage capacity isolation.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::signals::PodUsage;
use crate::agent::runtime::resources::parse_quantity;

/// A limit a pod broke, and the kubelet's message for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Exceeded {
    /// Pod UID.
    pub uid: String,
    /// The eviction message.
    pub message: String,
}

/// Whether any pod has a local storage limit (else the check costs nothing).
pub fn any_limits(pods: &[Pod]) -> bool {
    pods.iter().any(|p| {
        !disk_empty_dir_limits(p).is_empty()
            || p.spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .any(|c| container_limit(c).is_some())
    })
}

/// emptyDir volumes on disk with a sizeLimit: (volume name, limit text, bytes).
fn disk_empty_dir_limits(pod: &Pod) -> Vec<(String, String, u64)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if e.medium.as_deref() == Some("Memory") {
                // A tmpfs sized by its limit: the kernel enforces it.
                return None;
            }
            let q = e.size_limit.as_ref()?;
            let bytes = parse_quantity(&q.0)?;
            Some((v.name.clone(), q.0.clone(), bytes.max(0.0) as u64))
        })
        .collect()
}

/// A container's ephemeral-storage limit in bytes.
fn container_limit(c: &k8s_openapi::api::core::v1::Container) -> Option<(String, u64)> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    Some((q.0.clone(), parse_quantity(&q.0)?.max(0.0) as u64))
}

/// The pod's ephemeral-storage limit: the sum of its containers' when every container has one.
fn pod_ephemeral_limit(pod: &Pod) -> Option<u64> {
    let containers = &pod.spec.as_ref()?.containers;
    let limits: Vec<u64> = containers
        .iter()
        .filter_map(|c| container_limit(c).map(|(_, b)| b))
        .collect();
    (!limits.is_empty() && limits.len() == containers.len()).then(|| limits.iter().sum())
}

/// Bytes used by each emptyDir with a sizeLimit, by volume name (read from the disk).
pub fn empty_dir_usage(pod: &Pod, pod_dir: &std::path::Path) -> HashMap<String, u64> {
    disk_empty_dir_limits(pod)
        .into_iter()
        .map(|(name, _, _)| {
            let bytes =
                crate::util::disk_usage(&crate::agent::volumes::empty_dir_path(pod_dir, &name)).0;
            (name, bytes)
        })
        .collect()
}

/// The first local storage limit `pod` breaks, in the kubelet's order: an emptyDir over its
/// sizeLimit, the pod over the sum of its containers' limits, a container over its own.
pub fn exceeded(
    pod: &Pod,
    usage: &PodUsage,
    empty_dirs: &HashMap<String, u64>,
) -> Option<Exceeded> {
    let uid = pod.metadata.uid.clone()?;
    let found = |message: String| {
        Some(Exceeded {
            uid: uid.clone(),
            message,
        })
    };
    for (name, limit_text, limit) in disk_empty_dir_limits(pod) {
        if empty_dirs.get(&name).is_some_and(|used| *used > limit) {
            return found(format!(
                "Usage of EmptyDir volume \"{name}\" exceeds the limit \"{limit_text}\". "
            ));
        }
    }
    if let Some(limit) = pod_ephemeral_limit(pod) {
        let used = usage.rootfs.0 + usage.logs.0 + usage.volumes.0;
        if used > limit {
            return found(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                super::policy::format_bytes(limit)
            ));
        }
    }
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let (Some((limit_text, limit)), Some(u)) =
            (container_limit(c), usage.containers.get(&c.name))
        else {
            continue;
        };
        if u.rootfs + u.logs > limit {
            return found(format!(
                "Container {} exceeded its local ephemeral storage limit \"{limit_text}\". ",
                c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::eviction::signals::ContainerUsage;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        });
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                spec.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn empty_dir_over_its_size_limit() {
        let p = pod(serde_json::json!({"volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
        ]}));
        assert!(any_limits(std::slice::from_ref(&p)));
        let usage = PodUsage::default();
        // The Memory emptyDir is far over its sizeLimit, but tmpfs enforces that itself.
        let mem_over = ("mem".to_string(), 8 << 20);
        let under: HashMap<String, u64> =
            [("scratch".to_string(), 1 << 20), mem_over.clone()].into();
        assert_eq!(exceeded(&p, &usage, &under), None);
        let over: HashMap<String, u64> =
            [("scratch".to_string(), (1 << 20) + 4096), mem_over].into();
        let e = exceeded(&p, &usage, &over).expect("exceeded");
        assert_eq!(
            e.message,
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
        );
    }

    #[test]
    fn container_and_pod_limits() {
        let mut p = pod(serde_json::json!({}));
        assert!(!any_limits(std::slice::from_ref(&p)));
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].resources =
                serde_json::from_value(serde_json::json!({"limits": {"ephemeral-storage": "2Mi"}}))
                    .ok();
            // With a container without a limit, only the other container's own limit applies.
            let mut side = spec.containers[0].clone();
            side.name = "side".into();
            side.resources = None;
            let mut two = p.clone();
            if let Some(s2) = two.spec.as_mut() {
                s2.containers.push(side);
            }
            assert!(any_limits(std::slice::from_ref(&two)));
            assert_eq!(pod_ephemeral_limit(&two), None);
        }
        let mut usage = PodUsage::default();
        usage.containers.insert(
            "c".into(),
            ContainerUsage {
                memory: None,
                rootfs: 1 << 20,
                logs: 1 << 19,
            },
        );
        usage.rootfs = (1 << 20, 0);
        usage.logs = (1 << 19, 0);
        assert_eq!(exceeded(&p, &usage, &HashMap::new()), None);
        // The pod's emptyDirs count for the pod's total, not for the container's.
        usage.volumes = (1 << 20, 0);
        let e = exceeded(&p, &usage, &HashMap::new()).expect("pod over");
        assert_eq!(
            e.message,
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
        );
        usage.volumes = (0, 0);
        usage.containers.get_mut("c").expect("c").rootfs = 3 << 20;
        usage.rootfs = (0, 0);
        usage.logs = (0, 0);
        let e = exceeded(&p, &usage, &HashMap::new()).expect("container over");
        assert_eq!(
            e.message,
            "Container c exceeded its local ephemeral storage limit \"2Mi\". "
        );
    }
}
