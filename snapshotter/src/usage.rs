//! Disk usage of one snapshot's own directory, counted like `du`: hard links once.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Space and inodes used by a snapshot's own filesystem directory (not its parents).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Bytes allocated on disk (`st_blocks * 512`), each inode counted once.
    pub bytes: u64,
    /// Number of distinct inodes, the directory itself included.
    pub inodes: u64,
}

/// Walks `dir` without following symlinks or leaving it for other mounts below it.
pub(crate) fn disk_usage(key: &str, dir: &Path) -> Result<Usage> {
    let context = || format!("measure usage of snapshot {key:?}");
    let root = dir.symlink_metadata().io(context, dir)?;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut usage = Usage::default();
    let mut count = |meta: &std::fs::Metadata| {
        if seen.insert((meta.dev(), meta.ino())) {
            usage.bytes += meta.blocks() * 512;
            usage.inodes += 1;
        }
    };
    count(&root);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).io(context, &current)? {
            let entry = entry.io(context, &current)?;
            // Stat relative to the open directory: no walk of the whole path per entry.
            let meta = entry.metadata().io(context, &entry.path())?;
            count(&meta);
            if meta.is_dir() && meta.dev() == root.dev() {
                pending.push(entry.path());
            }
        }
    }
    Ok(usage)
}
