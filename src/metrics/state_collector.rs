//! berthd's state at each scrape: containers and pod sandboxes by state, live shims, images,
//! and snapshots with their bytes (committed layers measured once, writable ones at most every
//! 10 s).

use std::sync::Arc;
use std::time::Duration;

use berth_snapshotter::Kind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::DiskCache;
use crate::image::ImageManager;
use crate::runtime::container::{ContainerManager, ContainerState};
use crate::runtime::sandbox::{SandboxManager, SandboxState};

/// Reads the managers' records when encoded.
pub struct StateCollector {
    pub containers: Arc<ContainerManager>,
    pub sandboxes: Arc<SandboxManager>,
    pub images: ImageManager,
    /// Committed snapshots never change: measured once (kept a day, as a bound on memory).
    committed: DiskCache<String, u64>,
    /// Writable snapshots: measured at most every 10 s.
    writable: DiskCache<String, u64>,
}

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateCollector")
    }
}

impl StateCollector {
    pub fn new(
        containers: Arc<ContainerManager>,
        sandboxes: Arc<SandboxManager>,
        images: ImageManager,
    ) -> Self {
        Self {
            containers,
            sandboxes,
            images,
            committed: DiskCache::with_ttl(Duration::from_secs(24 * 3600)),
            writable: DiskCache::default(),
        }
    }

    /// Snapshots and the bytes of their directories.
    fn snapshots(&self) -> (i64, i64) {
        let snapshotter = self.images.snapshotter();
        let Ok(list) = snapshotter.list() else {
            return (0, 0);
        };
        let mut bytes = 0u64;
        for info in &list {
            let cache = if info.kind == Kind::Committed {
                &self.committed
            } else {
                &self.writable
            };
            bytes += cache.usage(&info.name, || {
                snapshotter.usage(&info.name).map_or(0, |u| u.bytes)
            });
        }
        (list.len() as i64, i64::try_from(bytes).unwrap_or(i64::MAX))
    }
}

fn state_name(s: ContainerState) -> &'static str {
    match s {
        ContainerState::Creating => "creating",
        ContainerState::Created => "created",
        ContainerState::Running => "running",
        ContainerState::Exited => "exited",
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let containers = self.containers.stored().unwrap_or_default();
        let mut by_state = std::collections::BTreeMap::new();
        let mut shims = 0i64;
        for c in &containers {
            *by_state.entry(state_name(c.state)).or_insert(0i64) += 1;
            if c.is_active() && c.shim_process.is_some_and(|p| p.is_running()) {
                shims += 1;
            }
        }
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "containers",
            "Containers by state",
            None,
            gauge.metric_type(),
        )?;
        for state in ["creating", "created", "running", "exited"] {
            ConstGauge::new(by_state.get(state).copied().unwrap_or(0))
                .encode(family.encode_family(&[("state", state)])?)?;
        }
        let sandboxes = self.sandboxes.list().unwrap_or_default();
        let mut family = encoder.encode_descriptor(
            "pod_sandboxes",
            "Pod sandboxes by state",
            None,
            gauge.metric_type(),
        )?;
        for (name, state) in [
            ("creating", SandboxState::Creating),
            ("ready", SandboxState::Ready),
            ("notready", SandboxState::NotReady),
        ] {
            let n = sandboxes.iter().filter(|s| s.state == state).count() as i64;
            ConstGauge::new(n).encode(family.encode_family(&[("state", name)])?)?;
        }
        let images = self.images.list(None).map_or(0, |l| l.len() as i64);
        let (snapshots, snapshot_bytes) = self.snapshots();
        for (name, help, unit, value) in [
            ("shims", "Shims running", None, shims),
            ("images", "Images stored", None, images),
            (
                "snapshots",
                "Snapshots (image layers and writable layers)",
                None,
                snapshots,
            ),
            (
                "snapshots",
                "Bytes in snapshot directories",
                Some(Unit::Bytes),
                snapshot_bytes,
            ),
        ] {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
        }
        Ok(())
    }
}
