//! The OOM-kill counter of a cgroup that may vanish before the exit is read: a systemd scope
//! is removed by systemd as soon as its last process is gone, taking `memory.events` with it.
//! A thread follows the file's change notifications and keeps the highest `oom_kill` seen.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The watcher's thread stack: it reads one small file per notification.
const STACK: usize = 64 * 1024;

/// The highest `oom_kill` count seen in a cgroup v2 `memory.events`.
#[derive(Clone, Default)]
pub struct OomSeen(Arc<AtomicU64>);

impl OomSeen {
    /// The highest count seen so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn record(&self, n: u64) {
        self.0.fetch_max(n, Ordering::Relaxed);
    }
}

/// The `oom_kill` count in `memory.events` text.
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .find_map(|v| v.trim().parse().ok())
}

/// Follows `<dir>/memory.events` until the cgroup is removed; the watch is in place before the
/// first read, so no change is missed.
pub fn watch(dir: &Path) -> std::io::Result<OomSeen> {
    let file = dir.join("memory.events");
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(&file, AddWatchFlags::IN_MODIFY)?;
    let seen = OomSeen::default();
    read_into(&file, &seen);
    let keep = seen.clone();
    std::thread::Builder::new()
        .name("oom-watch".into())
        .stack_size(STACK)
        .spawn(move || follow(inotify, file, keep))?;
    Ok(seen)
}

fn follow(inotify: Inotify, file: PathBuf, seen: OomSeen) {
    loop {
        match inotify.read_events() {
            Ok(events) => {
                read_into(&file, &seen);
                // The file's cgroup is gone (or the watch was dropped): nothing more to see.
                if events
                    .iter()
                    .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
                {
                    return;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::warn!("following {}: {e}", file.display());
                return;
            }
        }
    }
}

/// The `oom_kill` count of the `memory.events` file `file`, if it can be read.
pub fn read_count(file: &Path) -> Option<u64> {
    fs::read_to_string(file)
        .ok()
        .as_deref()
        .and_then(oom_kill_count)
}

fn read_into(file: &Path, seen: &OomSeen) {
    if let Some(n) = read_count(file) {
        seen.record(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_read_and_only_grows() {
        assert_eq!(
            oom_kill_count("low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(oom_kill_count("low 0\n"), None);
        let dir = std::env::temp_dir().join(format!("berth-oom-watch-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        fs::write(dir.join("memory.events"), "oom_kill 0\n").expect("write");
        let seen = watch(&dir).expect("watch");
        assert_eq!(seen.get(), 0);
        fs::write(dir.join("memory.events"), "oom_kill 2\n").expect("write");
        for _ in 0..200 {
            if seen.get() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(seen.get(), 2, "a change was followed");
        // The file gone (as a removed cgroup's), the highest count stays.
        fs::remove_dir_all(&dir).expect("remove");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(seen.get(), 2);
    }
}
