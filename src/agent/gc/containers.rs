//! Container and sandbox garbage collection: dead containers beyond the per-container and node
//! limits, dead sandboxes that are not their pod's newest (the kubelet's rules).

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use super::{add, micros_since};
use crate::agent::AgentContext;
use crate::agent::runtime::labels;

/// The container GC settings.
#[derive(Debug, Clone, Copy)]
pub struct ContainerPolicy {
    /// Dead containers younger than this (by creation) stay.
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); -1: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; -1: no limit.
    pub max_containers: i32,
}

/// A dead container GC may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadContainer {
    /// Container id.
    pub id: String,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
}

/// The kubelet's evict unit: a pod uid and a container name.
pub type EvictUnit = (String, String);

/// Exited containers of the agent's sandboxes created at least `min_age` before `now_ns`, by
/// evict unit, newest first. `sandbox_uids` maps the agent's sandbox ids to pod uids.
pub fn evictable_containers(
    containers: &[cri::Container],
    sandbox_uids: &HashMap<String, String>,
    now_ns: i64,
    min_age: Duration,
) -> BTreeMap<EvictUnit, Vec<DeadContainer>> {
    let newest_evictable =
        now_ns.saturating_sub(i64::try_from(min_age.as_nanos()).unwrap_or(i64::MAX));
    let mut units: BTreeMap<EvictUnit, Vec<DeadContainer>> = BTreeMap::new();
    for c in containers {
        if c.state != cri::ContainerState::ContainerExited as i32 || c.created_at > newest_evictable
        {
            continue;
        }
        let Some(uid) = sandbox_uids.get(&c.pod_sandbox_id) else {
            continue;
        };
        let name = container_name(c).unwrap_or_default();
        units
            .entry((uid.clone(), name.to_string()))
            .or_default()
            .push(DeadContainer {
                id: c.id.clone(),
                created_at: c.created_at,
            });
    }
    for unit in units.values_mut() {
        sort_newest_first(unit);
    }
    units
}

/// A container's name: its CRI metadata's, else the agent's container-name label (None when
/// it has neither).
fn container_name(c: &cri::Container) -> Option<&str> {
    c.metadata
        .as_ref()
        .map(|m| m.name.as_str())
        .filter(|n| !n.is_empty())
        .or_else(|| c.labels.get(labels::CONTAINER_NAME).map(String::as_str))
}

/// The order of GC lists: newest creation time first, ties by id (stable across passes).
fn newest_first(a: (i64, &str), b: (i64, &str)) -> CmpOrdering {
    b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

/// Sorts dead containers newest first (see [`newest_first`]).
fn sort_newest_first(v: &mut [DeadContainer]) {
    v.sort_by(|a, b| newest_first((a.created_at, &a.id), (b.created_at, &b.id)));
}

/// Which dead containers to remove: all of pods no longer published, then the oldest beyond
/// `max_per_pod_container` in each unit, then beyond `max_containers` on the node (first evenly
/// across units, at least one each, then the oldest anywhere).
pub fn containers_to_remove(
    mut units: BTreeMap<EvictUnit, Vec<DeadContainer>>,
    published_uids: &HashSet<String>,
    policy: &ContainerPolicy,
) -> Vec<String> {
    let mut remove = Vec::new();
    units.retain(|(uid, _), unit| {
        let published = published_uids.contains(uid);
        if !published {
            remove.extend(unit.drain(..).map(|c| c.id));
        }
        published
    });
    if policy.max_per_pod_container >= 0 {
        keep_newest_per_unit(
            &mut units,
            policy.max_per_pod_container as usize,
            &mut remove,
        );
    }
    let total =
        |u: &BTreeMap<EvictUnit, Vec<DeadContainer>>| u.values().map(Vec::len).sum::<usize>();
    if policy.max_containers >= 0 && total(&units) > policy.max_containers as usize {
        let max = policy.max_containers as usize;
        let non_empty = units.values().filter(|u| !u.is_empty()).count().max(1);
        keep_newest_per_unit(&mut units, (max / non_empty).max(1), &mut remove);
        let excess = total(&units).saturating_sub(max);
        if excess > 0 {
            let mut all: Vec<DeadContainer> = units.into_values().flatten().collect();
            sort_newest_first(&mut all);
            let keep = all.len() - excess;
            remove.extend(all.drain(keep..).map(|c| c.id));
        }
    }
    remove
}

fn keep_newest_per_unit(
    units: &mut BTreeMap<EvictUnit, Vec<DeadContainer>>,
    keep: usize,
    remove: &mut Vec<String>,
) {
    for unit in units.values_mut() {
        if unit.len() > keep {
            remove.extend(unit.drain(keep..).map(|c| c.id));
        }
    }
}

/// A sandbox as sandbox GC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// Sandbox id.
    pub id: String,
    /// Its pod's uid.
    pub uid: String,
    /// Creation time, ns since the epoch.
    pub created_at: i64,
    /// Ready, or still holding containers: never removed.
    pub active: bool,
}

/// Which sandboxes to remove: the inactive ones of each published pod except its newest
/// sandbox, and every inactive one of pods no longer published.
pub fn sandboxes_to_remove(
    sandboxes: &[SandboxInfo],
    published_uids: &HashSet<String>,
) -> Vec<String> {
    let mut by_pod: BTreeMap<&str, Vec<&SandboxInfo>> = BTreeMap::new();
    for s in sandboxes {
        by_pod.entry(s.uid.as_str()).or_default().push(s);
    }
    let mut remove = Vec::new();
    for (uid, mut list) in by_pod {
        list.sort_by(|a, b| newest_first((a.created_at, &a.id), (b.created_at, &b.id)));
        let keep = usize::from(published_uids.contains(uid));
        remove.extend(
            list.into_iter()
                .skip(keep)
                .filter(|s| !s.active)
                .map(|s| s.id.clone()),
        );
    }
    remove
}

fn container_policy(ctx: &AgentContext) -> ContainerPolicy {
    ContainerPolicy {
        min_age: Duration::from_secs_f64(ctx.config.minimum_container_ttl_secs),
        max_per_pod_container: ctx.config.max_per_pod_container,
        max_containers: ctx.config.max_containers,
    }
}

fn published_uids(ctx: &AgentContext) -> HashSet<String> {
    ctx.pods
        .list()
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect()
}

async fn agent_sandboxes(ctx: &AgentContext) -> Result<Vec<cri::PodSandbox>, tonic::Status> {
    let filter = cri::PodSandboxFilter {
        label_selector: [(labels::MANAGED_BY.to_string(), labels::AGENT.to_string())].into(),
        ..Default::default()
    };
    Ok(ctx
        .client
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await?
        .into_inner()
        .items)
}

pub(crate) async fn all_containers(
    ctx: &AgentContext,
) -> Result<Vec<cri::Container>, tonic::Status> {
    Ok(ctx
        .client
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers)
}

fn sandbox_uid(s: &cri::PodSandbox) -> String {
    s.metadata
        .as_ref()
        .map(|m| m.uid.clone())
        .filter(|u| !u.is_empty())
        .or_else(|| s.labels.get(labels::POD_UID).cloned())
        .unwrap_or_default()
}

/// One container GC pass, then sandbox GC; errors are logged.
pub(crate) async fn container_pass(ctx: &AgentContext) {
    let started = Instant::now();
    let (sandboxes, containers) = match tokio::try_join!(agent_sandboxes(ctx), all_containers(ctx))
    {
        Ok(lists) => lists,
        Err(e) => {
            tracing::warn!(error = %e.message(), "container GC: listing sandboxes and containers failed");
            return;
        }
    };
    let published = published_uids(ctx);
    let uids: HashMap<String, String> = sandboxes
        .iter()
        .map(|s| (s.id.clone(), sandbox_uid(s)))
        .collect();
    let policy = container_policy(ctx);
    let units = evictable_containers(
        &containers,
        &uids,
        crate::util::unix_nanos_now(),
        policy.min_age,
    );
    let protected = newest_init_containers(ctx, &containers, &uids);
    let doomed: Vec<String> = containers_to_remove(units, &published, &policy)
        .into_iter()
        .filter(|id| !protected.contains(id))
        .collect();
    let mut removed: HashSet<String> = HashSet::new();
    for id in doomed {
        if remove_container(ctx, &id).await {
            removed.insert(id);
        }
    }
    let holding: HashSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(&c.id))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let infos: Vec<SandboxInfo> = sandboxes
        .iter()
        .map(|s| SandboxInfo {
            id: s.id.clone(),
            uid: sandbox_uid(s),
            created_at: s.created_at,
            active: s.state == cri::PodSandboxState::SandboxReady as i32
                || holding.contains(s.id.as_str()),
        })
        .collect();
    let mut sandboxes_removed = 0;
    for id in sandboxes_to_remove(&infos, &published) {
        sandboxes_removed += u64::from(remove_sandbox(ctx, &id).await);
    }
    add(&ctx.gc.container_passes, 1);
    add(&ctx.gc.containers_removed, removed.len() as u64);
    add(&ctx.gc.sandboxes_removed, sandboxes_removed);
    ctx.gc
        .last_container_pass_micros
        .store(micros_since(started), Ordering::Relaxed);
    if !removed.is_empty() || sandboxes_removed > 0 {
        tracing::info!(
            containers = removed.len(),
            sandboxes = sandboxes_removed,
            micros = micros_since(started),
            "container GC removed dead containers and sandboxes"
        );
    }
}

/// The newest instance of every init container of a published pod: its worker reads it to
/// know the init container is done, and would run it again if it were gone.
fn newest_init_containers(
    ctx: &AgentContext,
    containers: &[cri::Container],
    sandbox_uids: &HashMap<String, String>,
) -> HashSet<String> {
    let mut init_names: HashSet<(String, String)> = HashSet::new();
    for pod in ctx.pods.list() {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for ic in pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
        {
            init_names.insert((uid.clone(), ic.name.clone()));
        }
    }
    newest_named(containers, sandbox_uids, &init_names)
}

/// Of the containers of the agent's sandboxes (`sandbox_uids`: sandbox id to pod uid), the id
/// of the newest instance of each (pod uid, container name) in `wanted`.
fn newest_named(
    containers: &[cri::Container],
    sandbox_uids: &HashMap<String, String>,
    wanted: &HashSet<(String, String)>,
) -> HashSet<String> {
    let mut newest: HashMap<(String, String), (i64, String)> = HashMap::new();
    for c in containers {
        let Some(uid) = sandbox_uids.get(&c.pod_sandbox_id) else {
            continue;
        };
        let Some(name) = container_name(c) else {
            continue;
        };
        let key = (uid.clone(), name.to_string());
        if !wanted.contains(&key) {
            continue;
        }
        let e = newest.entry(key).or_insert((c.created_at, c.id.clone()));
        if c.created_at > e.0 {
            *e = (c.created_at, c.id.clone());
        }
    }
    newest.into_values().map(|(_, id)| id).collect()
}

/// Removes a dead container; true when this call removed it (NotFound: someone else did).
async fn remove_container(ctx: &AgentContext, id: &str) -> bool {
    let req = cri::RemoveContainerRequest {
        container_id: id.to_string(),
    };
    removed(
        ctx.client.runtime().remove_container(req).await,
        "container",
        id,
    )
}

/// Removes a dead sandbox; true when this call removed it.
async fn remove_sandbox(ctx: &AgentContext, id: &str) -> bool {
    let req = cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    };
    removed(
        ctx.client.runtime().remove_pod_sandbox(req).await,
        "sandbox",
        id,
    )
}

/// Whether a removal call removed `kind` `id` (NotFound: someone else did); failures logged.
fn removed<T>(result: Result<T, tonic::Status>, kind: &str, id: &str) -> bool {
    match result {
        Ok(_) => {
            tracing::debug!(kind, id, "container GC: removed dead {kind}");
            true
        }
        Err(e) if e.code() == tonic::Code::NotFound => false,
        Err(e) => {
            tracing::warn!(kind, id, error = %e.message(), "container GC: removing dead {kind} failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gc::test_fixtures::{SEC, ctr, set};

    fn ids(v: &[DeadContainer]) -> Vec<&str> {
        v.iter().map(|c| c.id.as_str()).collect()
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    use cri::ContainerState::{
        ContainerCreated as Created, ContainerExited as Exited, ContainerRunning as Running,
    };

    #[test]
    fn only_old_enough_exited_containers_of_agent_sandboxes_are_evictable() {
        let uids: HashMap<String, String> = [("s1".to_string(), "u1".to_string())].into();
        let containers = [
            ctr("old", "s1", "main", Exited, 10),
            ctr("newer", "s1", "main", Exited, 20),
            ctr("young", "s1", "main", Exited, 95),
            ctr("running", "s1", "main", Running, 1),
            ctr("created", "s1", "main", Created, 1),
            ctr("side", "s1", "side", Exited, 5),
            ctr("foreign", "s9", "main", Exited, 1),
        ];
        let units = evictable_containers(&containers, &uids, 100 * SEC, Duration::from_secs(10));
        let main = &units[&("u1".to_string(), "main".to_string())];
        assert_eq!(
            ids(main),
            ["newer", "old"],
            "newest first, young/running/created left out"
        );
        assert_eq!(
            ids(&units[&("u1".to_string(), "side".to_string())]),
            ["side"]
        );
        assert_eq!(
            units.len(),
            2,
            "containers of other sandboxes are not the agent's"
        );
    }

    fn unit(uid: &str, name: &str, created: &[i64]) -> (EvictUnit, Vec<DeadContainer>) {
        let mut v: Vec<DeadContainer> = created
            .iter()
            .map(|t| DeadContainer {
                id: format!("{uid}-{name}-{t}"),
                created_at: *t,
            })
            .collect();
        sort_newest_first(&mut v);
        ((uid.into(), name.into()), v)
    }

    fn policy(max_per_pod_container: i32, max_containers: i32) -> ContainerPolicy {
        ContainerPolicy {
            min_age: Duration::ZERO,
            max_per_pod_container,
            max_containers,
        }
    }

    #[test]
    fn keeps_the_newest_dead_containers_per_unit() {
        let units: BTreeMap<_, _> = [unit("u1", "a", &[1, 2, 3]), unit("u1", "b", &[4])].into();
        let published = set(&["u1"]);
        assert_eq!(
            sorted(containers_to_remove(
                units.clone(),
                &published,
                &policy(1, -1)
            )),
            ["u1-a-1", "u1-a-2"]
        );
        assert!(containers_to_remove(units.clone(), &published, &policy(-1, -1)).is_empty());
        assert_eq!(
            containers_to_remove(units.clone(), &published, &policy(0, -1)).len(),
            4
        );
        // A pod no longer published loses all its dead containers.
        assert_eq!(
            containers_to_remove(units, &set(&[]), &policy(-1, -1)).len(),
            4
        );
    }

    #[test]
    fn node_limit_is_spread_evenly_then_oldest_first() {
        let units: BTreeMap<_, _> = [
            unit("u1", "a", &[1, 2, 3, 4]),
            unit("u2", "a", &[5, 6]),
            unit("u3", "a", &[7]),
        ]
        .into();
        let published = set(&["u1", "u2", "u3"]);
        // 7 dead, 3 allowed: one per unit (3 / 3) keeps the newest of each.
        assert_eq!(
            sorted(containers_to_remove(
                units.clone(),
                &published,
                &policy(-1, 3)
            )),
            ["u1-a-1", "u1-a-2", "u1-a-3", "u2-a-5"]
        );
        // 2 allowed over 3 units: one each (the minimum), then the oldest of those goes.
        assert_eq!(
            sorted(containers_to_remove(
                units.clone(),
                &published,
                &policy(-1, 2)
            )),
            ["u1-a-1", "u1-a-2", "u1-a-3", "u1-a-4", "u2-a-5"]
        );
        // 6 allowed: two per unit, which is already within the limit.
        assert_eq!(
            sorted(containers_to_remove(units, &published, &policy(-1, 6))),
            ["u1-a-1", "u1-a-2"]
        );
    }

    #[test]
    fn an_init_container_named_only_by_its_label_is_protected() {
        let uids: HashMap<String, String> = [("s1".to_string(), "u1".to_string())].into();
        let mut old = ctr("init-old", "s1", "", Exited, 1);
        old.labels
            .insert(labels::CONTAINER_NAME.into(), "setup".into());
        let mut new = ctr("init-new", "s1", "", Exited, 2);
        new.metadata = None;
        new.labels
            .insert(labels::CONTAINER_NAME.into(), "setup".into());
        let other = ctr("main", "s1", "main", Exited, 3);
        let wanted: HashSet<(String, String)> = [("u1".to_string(), "setup".to_string())].into();
        assert_eq!(
            newest_named(&[old.clone(), new.clone(), other], &uids, &wanted),
            set(&["init-new"])
        );
        let units = evictable_containers(&[old, new], &uids, 10 * SEC, Duration::ZERO);
        assert_eq!(
            ids(&units[&("u1".to_string(), "setup".to_string())]),
            ["init-new", "init-old"]
        );
    }

    fn sandbox(id: &str, uid: &str, created_at: i64, active: bool) -> SandboxInfo {
        SandboxInfo {
            id: id.into(),
            uid: uid.into(),
            created_at,
            active,
        }
    }

    #[test]
    fn dead_sandboxes_go_except_the_newest_of_a_published_pod() {
        let sandboxes = [
            sandbox("p1-old", "u1", 1, false),
            sandbox("p1-mid", "u1", 2, true),
            sandbox("p1-new", "u1", 3, false),
            sandbox("gone-old", "u2", 1, false),
            sandbox("gone-new", "u2", 2, false),
            sandbox("gone-busy", "u2", 3, true),
        ];
        assert_eq!(
            sorted(sandboxes_to_remove(&sandboxes, &set(&["u1"]))),
            ["gone-new", "gone-old", "p1-old"]
        );
    }
}
