//! Image garbage collection: unused images, least recently used first, once the image
//! filesystem is above its high threshold (the kubelet's rules).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use super::containers::all_containers;
use super::{add, micros_since};
use crate::agent::AgentContext;

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
pub(crate) async fn image_fs_mountpoint(ctx: &AgentContext) -> Result<String, String> {
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
pub(crate) async fn image_pass(ctx: &AgentContext) {
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
pub(crate) async fn detect_images(ctx: &AgentContext) -> Result<Vec<ImageCandidate>, String> {
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
    let space = crate::agent::eviction::signals::fs_stats(std::path::Path::new(&mountpoint))
        .ok_or_else(|| format!("statvfs of the image filesystem {mountpoint} failed"))?
        .bytes;
    let (capacity, available) = (space.capacity, space.available);
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

/// Removes candidates in order until `amount` bytes are freed; returns the bytes freed.
pub(crate) async fn remove_images(
    ctx: &AgentContext,
    candidates: Vec<ImageCandidate>,
    amount: u64,
) -> u64 {
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
    use crate::agent::gc::test_fixtures::{ctr, set};

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    use cri::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};

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
