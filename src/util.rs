//! Small helpers shared across modules: random ids, disk usage, time.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    // getrandom only fails when the kernel has no entropy source at all; fall back to time+pid.
    if getrandom::fill(&mut buf).is_err() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
            ^ u128::from(std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8;
        }
    }
    hex::encode(buf)
}

/// Bytes on disk (st_blocks × 512) and inodes under `dir` (itself included), each inode counted
/// once, without following symlinks or entering other filesystems mounted below it (a tmpfs
/// emptyDir or a bind mount is not this filesystem's usage). A missing `dir` is (0, 0).
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let mut seen = HashSet::new();
    seen.insert((root.dev(), root.ino()));
    let mut bytes = root.blocks() * 512;
    let mut stack = if root.is_dir() {
        vec![dir.to_owned()]
    } else {
        Vec::new()
    };
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            // Stat relative to the open directory: no walk of the whole path per entry.
            let Ok(meta) = e.metadata() else {
                continue;
            };
            if meta.dev() != root.dev() {
                continue;
            }
            if seen.insert((meta.dev(), meta.ino())) {
                bytes += meta.blocks() * 512;
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, seen.len() as u64)
}

/// Now as Unix seconds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// Now as Unix nanoseconds.
pub fn unix_nanos_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// Caps glibc's malloc arenas: without a cap every thread that allocates gets its own arena,
/// and a pull's short-lived buffers on many threads leave tens of MiB of RSS behind.
pub fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tunables; it is called once at start-up, before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands freed heap memory back to the kernel (after a pull's buffers are gone).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim walks glibc's own arenas under their locks; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Raises the open-file soft limit to the hard limit, as containerd does: berthd holds two
/// pidfds per container (its init and its shim), unpacking holds a descriptor per path
/// component, and several layers unpack at once.
pub fn raise_nofile_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match rustix::process::setrlimit(rustix::process::Resource::Nofile, raised) {
            Ok(()) => tracing::info!(
                from = ?limit.current,
                to = ?limit.maximum,
                "raised the open-file limit"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
    }
}

/// Writes `bytes` to `path` with permissions `mode` through a file beside it and a rename, so a
/// reader never sees it half-written (the directory is made when missing).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    // A fresh file, so `mode` holds: a temporary one a crash left may have had another.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A scratch directory for unit tests, removed (with everything in it) when dropped, also when
/// the test fails.
#[cfg(test)]
pub struct ScratchDir(std::path::PathBuf);

#[cfg(test)]
impl ScratchDir {
    /// A fresh, empty `<temp>/berth-<name>-<pid>`.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("berth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        Self(dir)
    }
}

#[cfg(test)]
impl std::ops::Deref for ScratchDir {
    type Target = std::path::PathBuf;
    fn deref(&self) -> &std::path::PathBuf {
        &self.0
    }
}

#[cfg(test)]
impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_has_its_mode_even_over_a_stale_temporary_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = ScratchDir::new("write-atomic");
        let key = dir.join("key");
        std::fs::write(dir.join("key.tmp"), b"stale").expect("stale");
        std::fs::set_permissions(dir.join("key.tmp"), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        write_atomic(&key, b"secret", 0o600).expect("write");
        let meta = std::fs::metadata(&key).expect("key");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&key).expect("read"), b"secret");
        assert!(!dir.join("key.tmp").exists());
    }

    #[test]
    fn disk_usage_counts_the_tree_once() {
        let dir = std::env::temp_dir().join(format!("berth-du-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).expect("dir");
        std::fs::write(dir.join("a/f"), vec![1u8; 10_000]).expect("file");
        std::fs::hard_link(dir.join("a/f"), dir.join("g")).expect("link");
        let (bytes, inodes) = disk_usage(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        // dir, a, and f (g is f again).
        assert_eq!(inodes, 3);
        assert!((10_000..30_000).contains(&bytes), "{bytes}");
        assert_eq!(disk_usage(Path::new("/nonexistent/berth")), (0, 0));
    }
}
