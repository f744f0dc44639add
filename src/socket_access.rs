//! Who may connect to Berth's unix sockets: mode 0660, root and one configurable group.
//!
//! A socket is bound inside a private directory (mode 0700), given its owner group and mode
//! there, and only then renamed into place: no client ever sees it with wider permissions.

use std::ffi::CString;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every socket Berth serves on.
pub const SOCKET_MODE: u32 = 0o660;

/// Why a socket could not be bound with its permissions.
#[derive(Debug, thiserror::Error)]
pub enum SocketAccessError {
    #[error("socket group {0:?}: no such group")]
    UnknownGroup(String),
    #[error("socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SocketAccessError + '_ {
    move |source| SocketAccessError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The gid of `group` (a name or a number); None for an empty string (root's group).
pub fn resolve_group(group: &str) -> Result<Option<u32>, SocketAccessError> {
    let group = group.trim();
    if group.is_empty() {
        return Ok(None);
    }
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(Some(gid));
    }
    let unknown = || SocketAccessError::UnknownGroup(group.to_string());
    let name = CString::new(group).map_err(|_| unknown())?;
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: `grp` is plain data getgrnam_r fills in; `buf` outlives the call and its length
    // is passed; `found` is written by the call before it is read.
    let (rc, found) = unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        (rc, (!found.is_null()).then_some(grp.gr_gid))
    };
    match (rc, found) {
        (0, Some(gid)) => Ok(Some(gid)),
        _ => Err(unknown()),
    }
}

/// Binds a unix socket at `path` (replacing nothing: the caller removes a stale one), owned by
/// root and `gid` (or root's group), mode 0660.
pub fn bind(path: &Path, gid: Option<u32>) -> Result<tokio::net::UnixListener, SocketAccessError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let private = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io(&private))?;
    let staged = private.join("s");
    let result = (|| {
        let listener = tokio::net::UnixListener::bind(&staged).map_err(io(&staged))?;
        if gid.is_some() {
            std::os::unix::fs::chown(&staged, Some(0), gid).map_err(io(&staged))?;
        }
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(io(&staged))?;
        std::fs::rename(&staged, path).map_err(io(path))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

/// The group that owns `path` (to give another socket the same access).
pub fn group_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.gid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn groups_resolve_by_name_and_number() {
        assert_eq!(resolve_group("").expect("empty"), None);
        assert_eq!(resolve_group("1234").expect("number"), Some(1234));
        assert_eq!(resolve_group("root").expect("root"), Some(0));
        let err = resolve_group("no-such-group-berth").expect_err("unknown");
        assert!(err.to_string().contains("no-such-group-berth"), "{err}");
    }

    #[tokio::test]
    async fn sockets_are_0660_with_their_group_and_leave_no_staging_dir() {
        let dir = tempfile_dir();
        let path = dir.join("t.sock");
        let _listener = bind(&path, Some(4321)).expect("bind");
        let meta = std::fs::metadata(&path).expect("socket");
        assert_eq!(meta.mode() & 0o7777, SOCKET_MODE);
        assert_eq!(meta.gid(), 4321);
        assert_eq!(group_of(&path), Some(4321));
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("t.sock")]);
        std::os::unix::net::UnixStream::connect(&path).expect("connect");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("berth-socket-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }
}
