//! Garbage collection of dead containers, dead sandboxes and unused images (the kubelet's GC rules).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1 as cri;

use super::{AgentContext, labels};

/// What GC has done since berthd started (for the status endpoint and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcCounters {
    /// Container GC passes run.
    pub container_passes: u64,
    /// Dead containers removed.
    pub containers_removed: u64,
    /// Dead sandboxes removed.
    pub sandboxes_removed: u64,
    /// Image GC passes run.
    pub image_passes: u64,
    /// Images removed.
    pub images_removed: u64,
    /// Bytes the removed images took (their CRI size).
    pub image_bytes_freed: u64,
    /// Duration of the last container GC pass, in microseconds.
    pub last_container_pass_micros: u64,
    /// Duration of the last image GC pass, in microseconds.
    pub last_image_pass_micros: u64,
}

/// The GC's running state: counters and the image tracker (one per agent).
#[derive(Default)]
pub struct Counters {
    /// When each image was first seen and last used (shared by image GC passes and the
    /// eviction manager's reclaim).
    images: std::sync::Mutex<ImageTracker>,
    container_passes: AtomicU64,
    containers_removed: AtomicU64,
    sandboxes_removed: AtomicU64,
    image_passes: AtomicU64,
    images_removed: AtomicU64,
    image_bytes_freed: AtomicU64,
    last_container_pass_micros: AtomicU64,
    last_image_pass_micros: AtomicU64,
}

/// The GC counters so far.
pub fn counters(c: &Counters) -> GcCounters {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    GcCounters {
        container_passes: get(&c.container_passes),
        containers_removed: get(&c.containers_removed),
        sandboxes_removed: get(&c.sandboxes_removed),
        image_passes: get(&c.image_passes),
        images_removed: get(&c.images_removed),
        image_bytes_freed: get(&c.image_bytes_freed),
        last_container_pass_micros: get(&c.last_container_pass_micros),
        last_image_pass_micros: get(&c.last_image_pass_micros),
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn micros_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Runs container GC and image GC at their configured periods, forever. Images are detected
/// at once (their unused age counts from agent start); the first container GC pass waits one
/// period, so the manifest source has published its pods by then.
pub async fn run(ctx: Arc<AgentContext>) {
    let container_period = Duration::from_secs_f64(ctx.config.container_gc_period_secs);
    let image_period = Duration::from_secs_f64(ctx.config.image_gc_period_secs);
    let mut next_container = tokio::time::Instant::now() + container_period;
    let mut next_image = tokio::time::Instant::now();
    loop {
        tokio::time::sleep_until(next_container.min(next_image)).await;
        if tokio::time::Instant::now() >= next_container {
            container_pass(&ctx).await;
            next_container = tokio::time::Instant::now() + container_period;
        }
        if tokio::time::Instant::now() >= next_image {
            image_pass(&ctx).await;
            next_image = tokio::time::Instant::now() + image_period;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Container and sandbox GC

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
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| c.labels.get(labels::CONTAINER_NAME).cloned())
            .unwrap_or_default();
        units
            .entry((uid.clone(), name))
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

fn sort_newest_first(v: &mut [DeadContainer]) {
    v.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.id.cmp(&b.id))
    });
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
        list.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.id.cmp(&b.id))
        });
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

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
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

async fn all_containers(ctx: &AgentContext) -> Result<Vec<cri::Container>, tonic::Status> {
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
async fn container_pass(ctx: &AgentContext) {
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
    let units = evictable_containers(&containers, &uids, now_ns(), policy.min_age);
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

/// Removes a dead container; true when it is gone (NotFound counts as gone, not as removed).
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
    let mut newest: HashMap<(String, String), (i64, String)> = HashMap::new();
    for c in containers {
        let Some(uid) = sandbox_uids.get(&c.pod_sandbox_id) else {
            continue;
        };
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let key = (uid.clone(), name);
        if !init_names.contains(&key) {
            continue;
        }
        let e = newest.entry(key).or_insert((c.created_at, c.id.clone()));
        if c.created_at > e.0 {
            *e = (c.created_at, c.id.clone());
        }
    }
    newest.into_values().map(|(_, id)| id).collect()
}

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

// ---------------------------------------------------------------------------------------------
// Image GC

/// Bytes to free so usage falls to `low` percent of `capacity`, once usage (the filesystem's,
/// from its free space, as the kubelet computes it) reached `high` percent; else 0.
pub fn bytes_to_free(capacity: u64, available: u64, high: u8, low: u8) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let available = available.min(capacity);
    let used_percent = 100 - (u128::from(available) * 100 / u128::from(capacity)) as u64;
    if used_percent < u64::from(high) {
        return 0;
    }
    let target_available =
        (u128::from(capacity) * u128::from(100 - u64::from(low.min(100))) / 100) as u64;
    target_available.saturating_sub(available)
}

/// What the agent remembers of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageRecord {
    /// When the agent first saw the image.
    first_detected: Instant,
    /// When a pass last saw a container using it (None: never).
    last_used: Option<Instant>,
    /// Since when it has been unused, as seen by passes (None: in use).
    unused_since: Option<Instant>,
}

/// An image image GC may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageCandidate {
    /// Image id.
    pub id: String,
    /// Size in bytes (CRI's).
    pub size: u64,
    /// Its tags, for the log.
    pub tags: Vec<String>,
}

/// The images seen since agent start: when each was first seen, last used and became unused.
#[derive(Debug, Default)]
pub struct ImageTracker {
    records: HashMap<String, ImageRecord>,
}

impl ImageTracker {
    /// Records one detection: `images` on the node at `now`, `in_use` their ids containers use.
    pub fn observe(&mut self, images: &[cri::Image], in_use: &HashSet<String>, now: Instant) {
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let r = self.records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: None,
                unused_since: None,
            });
            if in_use.contains(&image.id) {
                r.last_used = Some(now);
                r.unused_since = None;
            } else if r.unused_since.is_none() {
                r.unused_since = Some(now);
            }
        }
    }

    /// Images that may go, least recently used first (then oldest detected): not pinned, not
    /// in use, unused for at least `min_age` by `now`.
    pub fn candidates(
        &self,
        images: &[cri::Image],
        in_use: &HashSet<String>,
        now: Instant,
        min_age: Duration,
    ) -> Vec<ImageCandidate> {
        let mut list: Vec<(ImageRecord, ImageCandidate)> = images
            .iter()
            .filter(|i| !i.pinned && !in_use.contains(&i.id))
            .filter_map(|i| {
                let r = *self.records.get(&i.id)?;
                let unused_for = now.saturating_duration_since(r.unused_since?);
                (unused_for >= min_age).then(|| {
                    let c = ImageCandidate {
                        id: i.id.clone(),
                        size: i.size,
                        tags: i.repo_tags.clone(),
                    };
                    (r, c)
                })
            })
            .collect();
        list.sort_by(|(a, ai), (b, bi)| {
            (a.last_used, a.first_detected, &ai.id).cmp(&(b.last_used, b.first_detected, &bi.id))
        });
        list.into_iter().map(|(_, c)| c).collect()
    }
}

/// Ids of the images some container (any state) uses, matched by id, tag or digest.
pub fn images_in_use(images: &[cri::Image], containers: &[cri::Container]) -> HashSet<String> {
    let mut by_ref: HashMap<&str, &str> = HashMap::new();
    for i in images {
        by_ref.insert(i.id.as_str(), i.id.as_str());
        for r in i.repo_tags.iter().chain(&i.repo_digests) {
            by_ref.insert(r.as_str(), i.id.as_str());
        }
    }
    let mut used = HashSet::new();
    for c in containers {
        let spec = c.image.as_ref().map(|s| s.image.as_str()).unwrap_or("");
        for r in [c.image_ref.as_str(), spec] {
            if let Some(id) = by_ref.get(r) {
                used.insert(id.to_string());
            }
        }
    }
    used
}

/// The image filesystem's mount point, from CRI ImageFsInfo.
async fn image_fs_mountpoint(ctx: &AgentContext) -> Result<String, String> {
    let info = ctx
        .client
        .images()
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .map_err(|e| format!("ImageFsInfo: {}", e.message()))?
        .into_inner();
    info.image_filesystems
        .into_iter()
        .find_map(|f| f.fs_id.map(|id| id.mountpoint))
        .filter(|m| !m.is_empty())
        .ok_or_else(|| "ImageFsInfo named no image filesystem".to_string())
}

/// Capacity and available bytes of the filesystem holding `path`.
fn fs_space(path: &str) -> Result<(u64, u64), String> {
    let st = rustix::fs::statvfs(path).map_err(|e| format!("statvfs {path}: {e}"))?;
    Ok((
        st.f_blocks.saturating_mul(st.f_frsize),
        st.f_bavail.saturating_mul(st.f_frsize),
    ))
}

async fn list_images(ctx: &AgentContext) -> Result<Vec<cri::Image>, String> {
    Ok(ctx
        .client
        .images()
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .map_err(|e| format!("ListImages: {}", e.message()))?
        .into_inner()
        .images)
}

/// One image GC pass: detect images, then free space if the image filesystem is too full.
async fn image_pass(ctx: &AgentContext) {
    let started = Instant::now();
    if let Err(e) = image_pass_inner(ctx).await {
        tracing::warn!(error = %e, "image GC pass failed");
    }
    add(&ctx.gc.image_passes, 1);
    ctx.gc
        .last_image_pass_micros
        .store(micros_since(started), Ordering::Relaxed);
}

/// Lists images and the containers' use of them, records that in the tracker, and returns the
/// images that may go now (oldest unused first).
async fn detect_images(ctx: &AgentContext) -> Result<Vec<ImageCandidate>, String> {
    let images = list_images(ctx).await?;
    let containers = all_containers(ctx)
        .await
        .map_err(|e| format!("ListContainers: {}", e.message()))?;
    let in_use = images_in_use(&images, &containers);
    let now = Instant::now();
    let min_age = Duration::from_secs_f64(ctx.config.image_minimum_gc_age_secs);
    let mut tracker = ctx
        .gc
        .images
        .lock()
        .map_err(|_| "image tracker lock poisoned".to_string())?;
    tracker.observe(&images, &in_use, now);
    Ok(tracker.candidates(&images, &in_use, now, min_age))
}

async fn image_pass_inner(ctx: &AgentContext) -> Result<(), String> {
    let candidates = detect_images(ctx).await?;
    let mountpoint = image_fs_mountpoint(ctx).await?;
    let (capacity, available) = fs_space(&mountpoint)?;
    let cfg = &ctx.config;
    let amount = bytes_to_free(
        capacity,
        available,
        cfg.image_gc_high_threshold_percent,
        cfg.image_gc_low_threshold_percent,
    );
    if amount == 0 {
        return Ok(());
    }
    let freed = remove_images(ctx, candidates, amount).await;
    tracing::info!(
        filesystem = %mountpoint,
        capacity,
        available,
        wanted = amount,
        freed,
        "image GC: image filesystem above {}% used",
        cfg.image_gc_high_threshold_percent
    );
    if freed < amount {
        tracing::warn!(
            wanted = amount,
            freed,
            "image GC freed less than wanted (no more unused images old enough)"
        );
    }
    Ok(())
}

/// Node-level reclaim before evicting pods for disk pressure, as the kubelet does: a container
/// GC pass, then every unused image old enough (whatever the image GC thresholds say).
/// Returns the image bytes freed.
pub async fn reclaim_disk(ctx: &AgentContext) -> u64 {
    container_pass(ctx).await;
    match detect_images(ctx).await {
        Ok(candidates) if !candidates.is_empty() => {
            let freed = remove_images(ctx, candidates, u64::MAX).await;
            tracing::info!(
                freed,
                "disk pressure: removed unused images before evicting pods"
            );
            freed
        }
        Ok(_) => 0,
        Err(e) => {
            tracing::warn!(error = %e, "disk pressure: listing images to reclaim failed");
            0
        }
    }
}

/// Removes candidates in order until `amount` bytes are freed; returns the bytes freed.
async fn remove_images(ctx: &AgentContext, candidates: Vec<ImageCandidate>, amount: u64) -> u64 {
    let mut freed = 0u64;
    for c in candidates {
        if freed >= amount {
            break;
        }
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: c.id.clone(),
                ..Default::default()
            }),
        };
        match ctx.client.images().remove_image(req).await {
            Ok(_) => {
                tracing::info!(image = %c.id, tags = ?c.tags, size = c.size, "image GC: removed unused image");
                freed = freed.saturating_add(c.size);
                add(&ctx.gc.images_removed, 1);
                add(&ctx.gc.image_bytes_freed, c.size);
            }
            Err(e) => {
                tracing::warn!(image = %c.id, tags = ?c.tags, error = %e.message(), "image GC: removing image failed");
            }
        }
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000_000;

    fn ctr(
        id: &str,
        sandbox: &str,
        name: &str,
        state: cri::ContainerState,
        created_secs: i64,
    ) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: state as i32,
            created_at: created_secs * SEC,
            ..Default::default()
        }
    }

    fn ids(v: &[DeadContainer]) -> Vec<&str> {
        v.iter().map(|c| c.id.as_str()).collect()
    }

    fn set(v: &[&str]) -> HashSet<String> {
        v.iter().map(|s| s.to_string()).collect()
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

    #[test]
    fn frees_down_to_the_low_threshold_once_above_the_high_one() {
        let gib = 1u64 << 30;
        // 69% used: below the default 85%.
        assert_eq!(bytes_to_free(100 * gib, 31 * gib, 85, 80), 0);
        // At 85% used: down to 80% (20% available).
        assert_eq!(bytes_to_free(100 * gib, 15 * gib, 85, 80), 5 * gib);
        assert_eq!(bytes_to_free(100 * gib, 31 * gib, 1, 0), 69 * gib);
        assert_eq!(bytes_to_free(0, 0, 1, 0), 0);
    }

    fn image(id: &str, size: u64, pinned: bool, tag: &str) -> cri::Image {
        cri::Image {
            id: id.into(),
            size,
            pinned,
            repo_tags: vec![tag.into()],
            ..Default::default()
        }
    }

    fn candidate_ids(c: &[ImageCandidate]) -> Vec<&str> {
        c.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn unused_images_go_least_recently_used_first_after_their_minimum_age() {
        let t0 = Instant::now();
        let sec = Duration::from_secs(1);
        let min_age = 10 * sec;
        let all = [
            image("never-used", 1, false, "r/never:1"),
            image("used-early", 2, false, "r/early:1"),
            image("used-late", 3, false, "r/late:1"),
            image("pinned", 4, true, "r/pause:1"),
            image("busy", 5, false, "r/busy:1"),
        ];
        let mut t = ImageTracker::default();
        t.observe(&all, &set(&["used-early", "used-late", "busy"]), t0);
        t.observe(&all, &set(&["used-late", "busy"]), t0 + sec);
        t.observe(&all, &set(&["busy"]), t0 + 2 * sec);
        let in_use = set(&["busy"]);
        // Not yet unused for 10 s: nothing.
        assert!(
            t.candidates(&all, &in_use, t0 + 5 * sec, min_age)
                .is_empty()
        );
        // The never-used one reached its age first.
        assert_eq!(
            candidate_ids(&t.candidates(&all, &in_use, t0 + 10 * sec, min_age)),
            ["never-used"]
        );
        assert_eq!(
            candidate_ids(&t.candidates(&all, &in_use, t0 + 20 * sec, min_age)),
            ["never-used", "used-early", "used-late"],
            "least recently used first; pinned and in-use images never"
        );
        // Used again: its unused age starts over.
        t.observe(&all, &set(&["busy", "never-used"]), t0 + 30 * sec);
        assert_eq!(
            candidate_ids(&t.candidates(&all, &in_use, t0 + 35 * sec, min_age)),
            ["used-early", "used-late"]
        );
        // Images gone from the node are forgotten.
        t.observe(&all[..1], &set(&[]), t0 + 40 * sec);
        assert_eq!(t.records.len(), 1);
    }

    #[test]
    fn containers_use_images_by_id_tag_or_digest() {
        let mut with_digest = image("sha256:b", 1, false, "r/b:1");
        with_digest.repo_digests = vec!["r/b@sha256:d".into()];
        let images = [
            image("sha256:a", 1, false, "r/a:1"),
            with_digest,
            image("sha256:c", 1, false, "r/c:1"),
        ];
        let mut by_tag = ctr("1", "s", "m", Exited, 1);
        by_tag.image = Some(cri::ImageSpec {
            image: "r/a:1".into(),
            ..Default::default()
        });
        let mut by_digest = ctr("2", "s", "m", Running, 1);
        by_digest.image_ref = "r/b@sha256:d".into();
        assert_eq!(
            sorted(
                images_in_use(&images, &[by_tag, by_digest])
                    .into_iter()
                    .collect()
            ),
            ["sha256:a", "sha256:b"]
        );
    }
}
