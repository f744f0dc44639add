//! The import directory: image archives put there are imported when berthd starts and when
//! they are added, each once (a file is imported again only if it changes).
//!
//! A file is taken once it has stopped changing: its size and mtime are the same on two looks
//! a poll apart, or it was last modified more than a poll ago. Names starting with `.` are
//! ignored, so a copy can be made under a dot name and renamed into place. What was imported
//! (or failed) is remembered in a state file beside the directory's records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::ImageManager;

/// How often the directory is looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// What is known of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    size: u64,
    mtime_ns: i128,
    /// `imported` or why the import failed.
    outcome: String,
}

/// A file's size and mtime, and how long ago it was modified.
fn identity(path: &Path) -> Option<(u64, i128, Duration)> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mtime = meta.modified().ok()?;
    let ns = match mtime.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    let age = SystemTime::now()
        .duration_since(mtime)
        .unwrap_or(Duration::ZERO);
    Some((meta.len(), ns, age))
}

fn load(state: &Path) -> BTreeMap<String, Seen> {
    match std::fs::read(state) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %state.display(), error = %e, "import directory state unreadable; starting afresh");
            BTreeMap::new()
        }),
        Err(_) => BTreeMap::new(),
    }
}

fn save(state: &Path, seen: &BTreeMap<String, Seen>) {
    let tmp = state.with_extension("tmp");
    let written = serde_json::to_vec_pretty(seen)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, state));
    if let Err(e) = written {
        tracing::warn!(path = %state.display(), error = %e, "saving the import directory's state");
    }
}

/// Watches `dir` (created if missing) for the life of berthd, remembering in `state`.
pub fn spawn(images: ImageManager, dir: PathBuf, state: PathBuf) {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the image import directory; not watching it");
        return;
    }
    tokio::spawn(async move {
        let mut seen = load(&state);
        // Sizes and mtimes at the previous look, for files not taken yet.
        let mut last: BTreeMap<String, (u64, i128)> = BTreeMap::new();
        loop {
            scan(&images, &dir, &state, &mut seen, &mut last).await;
            tokio::time::sleep(POLL).await;
        }
    });
}

async fn scan(
    images: &ImageManager,
    dir: &Path,
    state: &Path,
    seen: &mut BTreeMap<String, Seen>,
    last: &mut BTreeMap<String, (u64, i128)>,
) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "reading the import directory");
            return;
        }
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut now: BTreeMap<String, (u64, i128)> = BTreeMap::new();
    for name in names {
        let path = dir.join(&name);
        let Some((size, mtime_ns, age)) = identity(&path) else {
            continue;
        };
        if seen
            .get(&name)
            .is_some_and(|s| s.size == size && s.mtime_ns == mtime_ns)
        {
            continue;
        }
        let stable = age > POLL || last.get(&name) == Some(&(size, mtime_ns));
        if !stable {
            now.insert(name, (size, mtime_ns));
            continue;
        }
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "opening an archive to import");
                continue;
            }
        };
        let outcome = match images.import(path.display().to_string(), file).await {
            Ok(views) => {
                let tags: Vec<&str> = views
                    .iter()
                    .flat_map(|v| v.record.repo_tags.iter().map(String::as_str))
                    .collect();
                tracing::info!(file = %path.display(), images = views.len(), ?tags, "imported from the import directory");
                "imported".to_string()
            }
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "importing from the import directory failed; it is tried again when the file changes");
                format!("failed: {e}")
            }
        };
        seen.insert(
            name,
            Seen {
                size,
                mtime_ns,
                outcome,
            },
        );
        save(state, seen);
    }
    *last = now;
}
