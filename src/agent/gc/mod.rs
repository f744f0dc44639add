//! Garbage collection (the kubelet's rules): the loop, its counters and the node-level reclaim
//! before disk-pressure evictions; containers and sandboxes in `containers`, images in
//! `images`.

pub mod containers;
pub mod images;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::agent::AgentContext;

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
    pub(crate) images: std::sync::Mutex<images::ImageTracker>,
    pub(crate) container_passes: AtomicU64,
    pub(crate) containers_removed: AtomicU64,
    pub(crate) sandboxes_removed: AtomicU64,
    pub(crate) image_passes: AtomicU64,
    pub(crate) images_removed: AtomicU64,
    pub(crate) image_bytes_freed: AtomicU64,
    pub(crate) last_container_pass_micros: AtomicU64,
    pub(crate) last_image_pass_micros: AtomicU64,
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

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn micros_since(start: Instant) -> u64 {
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
            containers::container_pass(&ctx).await;
            next_container = tokio::time::Instant::now() + container_period;
        }
        if tokio::time::Instant::now() >= next_image {
            images::image_pass(&ctx).await;
            next_image = tokio::time::Instant::now() + image_period;
        }
    }
}

/// Node-level reclaim before evicting pods for disk pressure, as the kubelet does: a container
/// GC pass, then every unused image old enough (whatever the image GC thresholds say).
/// Returns the image bytes freed.
pub async fn reclaim_disk(ctx: &AgentContext) -> u64 {
    containers::container_pass(ctx).await;
    match images::detect_images(ctx).await {
        Ok(candidates) if !candidates.is_empty() => {
            let freed = images::remove_images(ctx, candidates, u64::MAX).await;
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

/// Containers and id sets for the GC modules' unit tests.
#[cfg(test)]
pub(crate) mod test_fixtures {
    use std::collections::HashSet;

    use k8s_cri::v1 as cri;

    /// One second in nanoseconds.
    pub const SEC: i64 = 1_000_000_000;

    /// A container `id` of `sandbox` named `name`, created `created_secs` after the epoch.
    pub fn ctr(
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

    /// The ids as a set.
    pub fn set(v: &[&str]) -> HashSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }
}
