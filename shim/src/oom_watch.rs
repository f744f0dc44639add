//! The OOM-kill counter of a cgroup that may vanish before the exit is read: a systemd scope
//! is removed by systemd as soon as its last process is gone, taking `memory.events` with it.
//! The file's change notifications (inotify) are one more descriptor of the shim's poll loop,
//! which reads the count at each one and keeps the highest seen; the shim stays one thread.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The `oom_kill` count in `memory.events` text.
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .find_map(|v| v.trim().parse().ok())
}

/// Follows one cgroup v2 `memory.events` until its cgroup is removed.
pub struct OomWatch {
    inotify: Inotify,
    file: PathBuf,
    seen: u64,
    /// The cgroup is gone (or the watch was dropped): nothing more will come.
    ended: bool,
}

impl OomWatch {
    /// Watches `<dir>/memory.events`; the watch is in place before the first read, so no
    /// change is missed.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        let file = dir.join("memory.events");
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        inotify.add_watch(&file, AddWatchFlags::IN_MODIFY)?;
        let mut w = Self {
            inotify,
            file,
            seen: 0,
            ended: false,
        };
        w.read();
        Ok(w)
    }

    /// The descriptor to poll while the cgroup lives.
    pub fn poll_fd(&self) -> Option<RawFd> {
        (!self.ended).then(|| self.inotify.as_fd().as_raw_fd())
    }

    /// Takes the pending notifications and reads the count again; never blocks.
    pub fn refresh(&mut self) {
        if self.ended {
            return;
        }
        loop {
            match self.inotify.read_events() {
                Ok(events) => {
                    if events
                        .iter()
                        .any(|e| e.mask.contains(AddWatchFlags::IN_IGNORED))
                    {
                        self.ended = true;
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    tracing::warn!("following {}: {e}", self.file.display());
                    self.ended = true;
                    break;
                }
            }
        }
        self.read();
    }

    /// The highest count seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    fn read(&mut self) {
        if let Some(n) = read_count(&self.file) {
            self.seen = self.seen.max(n);
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
        let mut w = OomWatch::new(&dir).expect("watch");
        assert_eq!(w.seen(), 0);
        let fd = w.poll_fd().expect("a descriptor to poll");
        fs::write(dir.join("memory.events"), "oom_kill 2\n").expect("write");
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
        assert_eq!(n, 1, "the change is reported to poll");
        w.refresh();
        assert_eq!(w.seen(), 2, "a change was followed");
        // The file gone (as a removed cgroup's), the highest count stays and the watch ends.
        fs::remove_dir_all(&dir).expect("remove");
        w.refresh();
        assert_eq!(w.seen(), 2);
        assert!(w.poll_fd().is_none(), "nothing left to poll");
    }
}
