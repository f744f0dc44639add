//! Which devices each container of a pod gets, as the kubelet's device manager chooses them:
//! init containers run one after another, so each may take the devices of the one before;
//! app containers (and restartable init containers, which run beside them) take those left
//! by the init containers first, then free ones. Devices a container already holds stay its.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::agent::runtime::resources::parse_quantity;

/// Device IDs by resource name.
pub type DeviceIds = BTreeMap<String, Vec<String>>;

/// How many devices of each device-plugin resource one container asks for (its limits; the
/// API requires an extended resource's request to equal its limit).
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// The container's name.
    pub container: String,
    /// An init container that runs to completion before the next one starts.
    pub sequential_init: bool,
    /// Devices wanted by resource.
    pub wants: BTreeMap<String, usize>,
}

/// The demands of `pod`'s containers for the resources `is_device_resource` accepts, init
/// containers first, in the order they run; containers asking for none are left out.
pub fn demands(pod: &Pod, is_device_resource: impl Fn(&str) -> bool) -> Vec<Demand> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let of = |c: &Container, init: bool| {
        let wants: BTreeMap<String, usize> = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref().or(r.requests.as_ref()))
            .into_iter()
            .flatten()
            .filter(|(name, _)| is_device_resource(name))
            .filter_map(|(name, q)| {
                let n = parse_quantity(&q.0)?;
                (n >= 1.0).then(|| (name.clone(), n as usize))
            })
            .collect();
        let restartable = c.restart_policy.as_deref() == Some("Always");
        Demand {
            container: c.name.clone(),
            sequential_init: init && !restartable,
            wants,
        }
    };
    spec.init_containers
        .iter()
        .flatten()
        .map(|c| of(c, true))
        .chain(spec.containers.iter().map(|c| of(c, false)))
        .filter(|d| !d.wants.is_empty())
        .collect()
}

/// Not enough devices of a resource for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortage {
    pub resource: String,
    pub requested: usize,
    pub available: usize,
}

/// Chooses each container's devices: `held` is what the pod's containers hold already, `free`
/// the healthy devices of each resource no other pod holds.
pub fn assign(
    demands: &[Demand],
    held: &BTreeMap<String, DeviceIds>,
    free: &BTreeMap<String, BTreeSet<String>>,
) -> Result<BTreeMap<String, DeviceIds>, Shortage> {
    let mut free = free.clone();
    // Devices held by this pod are not free for its other containers unless reused.
    for ids in held.values().flat_map(|d| d.values()).flatten() {
        for set in free.values_mut() {
            set.remove(ids);
        }
    }
    let mut reusable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut chosen: BTreeMap<String, DeviceIds> = BTreeMap::new();
    for d in demands {
        let mut mine = DeviceIds::new();
        for (resource, &want) in &d.wants {
            let reuse = reusable.entry(resource.clone()).or_default();
            let pool = free.entry(resource.clone()).or_default();
            let ids: Vec<String> = match held.get(&d.container).and_then(|h| h.get(resource)) {
                Some(ids) if ids.len() == want => ids.clone(),
                _ => {
                    if reuse.len() + pool.len() < want {
                        return Err(Shortage {
                            resource: resource.clone(),
                            requested: want,
                            available: reuse.len() + pool.len(),
                        });
                    }
                    let mut ids: Vec<String> = reuse.iter().take(want).cloned().collect();
                    let rest = want - ids.len();
                    ids.extend(pool.iter().take(rest).cloned());
                    ids
                }
            };
            for id in &ids {
                pool.remove(id);
                reuse.remove(id);
            }
            if d.sequential_init {
                // The next container may take them: this one has ended by the time it starts.
                reuse.extend(ids.iter().cloned());
            }
            mine.insert(resource.clone(), ids);
        }
        chosen.insert(d.container.clone(), mine);
    }
    Ok(chosen)
}

/// Whether a plugin's preferred devices can be taken: `size` distinct devices, each of the
/// `available` ones.
pub fn preference_fits(preferred: &[String], available: &[String], size: usize) -> bool {
    let distinct: BTreeSet<&String> = preferred.iter().collect();
    preferred.len() == size
        && distinct.len() == size
        && preferred.iter().all(|id| available.contains(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preference_is_taken_only_as_many_distinct_available_devices() {
        let available: Vec<String> = ["g0", "g1", "g2"].map(String::from).to_vec();
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(preference_fits(&ids(&["g2", "g0"]), &available, 2));
        assert!(!preference_fits(&ids(&["g2"]), &available, 2), "too few");
        assert!(
            !preference_fits(&ids(&["g2", "g2"]), &available, 2),
            "twice the same"
        );
        assert!(
            !preference_fits(&ids(&["g2", "g9"]), &available, 2),
            "not available"
        );
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    fn gpu(name: &str, n: u32) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"limits": {"example.com/gpu": n.to_string()}}})
    }

    fn free(ids: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
        [(
            "example.com/gpu".to_string(),
            ids.iter().map(|s| s.to_string()).collect(),
        )]
        .into()
    }

    fn ids(chosen: &BTreeMap<String, DeviceIds>, c: &str) -> Vec<String> {
        chosen[c]["example.com/gpu"].clone()
    }

    #[test]
    fn containers_get_distinct_devices_and_a_shortage_names_the_resource() {
        let p = pod(serde_json::json!({"containers": [gpu("a", 1), gpu("b", 2), {"name": "c"}]}));
        let d = demands(&p, |r| r == "example.com/gpu");
        assert_eq!(d.len(), 2, "a container without devices has no demand");
        let chosen = assign(&d, &BTreeMap::new(), &free(&["g0", "g1", "g2"])).expect("fits");
        assert_eq!(ids(&chosen, "a"), ["g0"]);
        assert_eq!(ids(&chosen, "b"), ["g1", "g2"]);
        let short = assign(&d, &BTreeMap::new(), &free(&["g0", "g1"])).expect_err("too few");
        assert_eq!(
            short,
            Shortage {
                resource: "example.com/gpu".into(),
                requested: 2,
                available: 1
            }
        );
    }

    #[test]
    fn init_containers_pass_their_devices_on_and_sidecars_keep_theirs() {
        let mut sidecar = gpu("sidecar", 1);
        sidecar["restartPolicy"] = "Always".into();
        let p = pod(serde_json::json!({
            "initContainers": [gpu("i1", 2), gpu("i2", 1), sidecar],
            "containers": [gpu("app", 2)],
        }));
        let d = demands(&p, |r| r == "example.com/gpu");
        let chosen = assign(&d, &BTreeMap::new(), &free(&["g0", "g1", "g2"])).expect("fits");
        assert_eq!(ids(&chosen, "i1"), ["g0", "g1"]);
        assert_eq!(
            ids(&chosen, "i2"),
            ["g0"],
            "reuses the first init container's"
        );
        // i2 has ended when the sidecar starts, but the sidecar runs on beside the app.
        assert_eq!(ids(&chosen, "sidecar"), ["g0"]);
        assert_eq!(ids(&chosen, "app"), ["g1", "g2"]);
    }

    #[test]
    fn held_devices_stay_with_their_container() {
        let p = pod(serde_json::json!({"containers": [gpu("a", 1), gpu("b", 1)]}));
        let d = demands(&p, |r| r == "example.com/gpu");
        let held: BTreeMap<String, DeviceIds> = [(
            "b".to_string(),
            [("example.com/gpu".to_string(), vec!["g0".to_string()])].into(),
        )]
        .into();
        let chosen = assign(&d, &held, &free(&["g0", "g1"])).expect("fits");
        assert_eq!(ids(&chosen, "b"), ["g0"]);
        assert_eq!(ids(&chosen, "a"), ["g1"]);
        // Held devices need not be free (healthy and unheld) any more.
        let chosen = assign(&d, &held, &free(&["g1"])).expect("fits");
        assert_eq!(ids(&chosen, "b"), ["g0"]);
    }

    #[test]
    fn other_resources_are_not_device_demands() {
        let p = pod(serde_json::json!({"containers": [{
            "name": "a",
            "resources": {"limits": {"cpu": "1", "example.com/other": "1", "example.com/gpu": "0"}},
        }]}));
        assert!(demands(&p, |r| r == "example.com/gpu").is_empty());
    }
}
