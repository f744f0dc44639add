//! inotify on a directory the agent rescans (static pod manifests, the plugin registry): wakes
//! the rescan as soon as a file changes (the periodic rescan stays as the safety net for what
//! inotify misses).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::inotify;
use tokio::sync::Notify;

/// Watches `dir` (the `what` directory, for logs and the thread's name) from a thread of its
/// own, calling `notify` on every change in it. A missing directory is watched for again every
/// few seconds.
pub fn spawn(dir: PathBuf, notify: Arc<Notify>, what: &'static str) {
    let spawned = std::thread::Builder::new()
        .name(format!("berth-{what}-watch"))
        .spawn(move || {
            loop {
                if let Err(e) = watch(&dir, &notify) {
                    tracing::debug!(dir = %dir.display(), error = %e, "{what} dir not watched (rescans continue)");
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the {what} watcher; rescans continue");
    }
}

/// Watches until the directory goes away (or an error).
fn watch(dir: &std::path::Path, notify: &Notify) -> rustix::io::Result<()> {
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC)?;
    let mask = inotify::WatchFlags::CLOSE_WRITE
        | inotify::WatchFlags::CREATE
        | inotify::WatchFlags::DELETE
        | inotify::WatchFlags::MODIFY
        | inotify::WatchFlags::MOVED_FROM
        | inotify::WatchFlags::MOVED_TO
        | inotify::WatchFlags::DELETE_SELF
        | inotify::WatchFlags::MOVE_SELF
        | inotify::WatchFlags::ATTRIB;
    inotify::add_watch(&fd, dir, mask)?;
    // The directory may have changed before the watch was in place.
    notify.notify_one();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(&fd, &mut buf);
    loop {
        let ev = reader.next()?;
        let flags = ev.events();
        notify.notify_one();
        if flags.intersects(
            inotify::ReadFlags::IGNORED
                | inotify::ReadFlags::DELETE_SELF
                | inotify::ReadFlags::MOVE_SELF,
        ) {
            return Ok(());
        }
    }
}
