//! Writing a volume's files as the kubelet's atomic writer does: the files go to a new
//! timestamped directory, one rename swaps the `..data` symlink to it, and each top-level name
//! is a symlink through `..data`; a container reading the volume never sees half an update,
//! and an unchanged set of files is not written again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::downward::check_item_path;

/// The name of the symlink to the current files.
const DATA: &str = "..data";

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    /// Path inside the volume (relative, inside it).
    pub path: String,
    /// The content.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// Makes `dir` hold exactly `files`; returns whether anything changed. A bad path fails the
/// whole write before anything is written.
pub fn write(dir: &Path, files: &[VolumeFile]) -> Result<bool, String> {
    for f in files {
        check_item_path(&f.path).map_err(|e| format!("item {:?}: {e}", f.path))?;
    }
    let io = |what: &str, e: std::io::Error| format!("{what} in {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| io("creating the volume", e))?;
    let current = std::fs::read_link(dir.join(DATA)).ok();
    if let Some(cur) = &current
        && same_files(&dir.join(cur), files)
    {
        return Ok(false);
    }
    let stamp = format!("..{}", timestamp());
    let new = dir.join(&stamp);
    std::fs::create_dir(&new).map_err(|e| io("creating a data dir", e))?;
    let _ = std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755));
    let tmp = dir.join("..data_tmp");
    let swapped = files
        .iter()
        .try_for_each(|f| write_file(&new, f).map_err(|e| format!("writing {:?}: {e}", f.path)))
        .and_then(|()| {
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&stamp, &tmp).map_err(|e| io("linking the data dir", e))?;
            std::fs::rename(&tmp, dir.join(DATA)).map_err(|e| io("swapping the data dir", e))
        });
    if let Err(e) = swapped {
        // Nothing half-written stays: the current files are untouched.
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir_all(&new);
        return Err(e);
    }
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.path.trim_start_matches("./").split('/').next())
        .map(str::to_string)
        .collect();
    for t in &tops {
        let link = dir.join(t);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("{DATA}/{t}"), &link)
                .map_err(|e| io("linking a file", e))?;
        }
    }
    // Names no longer in the volume, and the previous data dir.
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("..") && !tops.contains(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if let Some(cur) = current
        && cur != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(cur));
    }
    Ok(true)
}

/// Whether `data` holds exactly `files` (content and mode).
fn same_files(data: &Path, files: &[VolumeFile]) -> bool {
    let mut have = BTreeMap::new();
    if !walk(data, "", &mut have) {
        return false;
    }
    let want: BTreeMap<String, (&[u8], u32)> = files
        .iter()
        .map(|f| {
            (
                f.path.trim_start_matches("./").to_string(),
                (f.data.as_slice(), f.mode & 0o7777),
            )
        })
        .collect();
    have.len() == want.len()
        && want.iter().all(|(p, (d, m))| {
            have.get(p)
                .is_some_and(|(hd, hm): &(Vec<u8>, u32)| hd.as_slice() == *d && hm == m)
        })
}

/// Reads every file below `dir` into `out` (path → content and mode); false if unreadable.
fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, (Vec<u8>, u32)>) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(meta) = e.metadata() else {
            return false;
        };
        if meta.is_dir() {
            if !walk(&e.path(), &rel, out) {
                return false;
            }
        } else {
            let Ok(data) = std::fs::read(e.path()) else {
                return false;
            };
            out.insert(rel, (data, meta.permissions().mode() & 0o7777));
        }
    }
    true
}

fn write_file(dir: &Path, f: &VolumeFile) -> std::io::Result<()> {
    let target = dir.join(f.path.trim_start_matches("./"));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(f.mode)
        .open(&target)?;
    out.write_all(&f.data)?;
    // The mode given to open is masked by the umask; set it exactly.
    out.set_permissions(std::fs::Permissions::from_mode(f.mode))
}

/// `YYYY_MM_DD_HH_MM_SS.nnnnnnnnn` in UTC, as the kubelet names its data dirs.
fn timestamp() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "{}.{:09}",
        now.strftime("%Y_%m_%d_%H_%M_%S"),
        now.subsec_nanosecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &str, mode: u32) -> VolumeFile {
        VolumeFile {
            path: path.into(),
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    #[test]
    fn files_are_swapped_in_whole_and_unchanged_ones_left_alone() {
        let dir = std::env::temp_dir().join(format!("berth-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let v1 = [file("a", "one", 0o644), file("sub/b", "two", 0o600)];
        assert!(write(&dir, &v1).expect("write"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "one");
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/b")).expect("b"),
            "two"
        );
        assert!(
            std::fs::symlink_metadata(dir.join("a"))
                .expect("link")
                .is_symlink()
        );
        let first = std::fs::read_link(dir.join(DATA)).expect("data link");
        // The same files again: nothing written.
        assert!(!write(&dir, &v1).expect("rewrite"));
        assert_eq!(
            std::fs::read_link(dir.join(DATA)).expect("data link"),
            first
        );
        // A change: a new data dir, the old one gone, a removed name unlinked.
        let v2 = [file("a", "uno", 0o644), file("c", "three", 0o400)];
        assert!(write(&dir, &v2).expect("update"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "uno");
        assert!(!dir.join("sub").exists());
        assert!(!dir.join(&first).exists());
        let mode = std::fs::metadata(dir.join("c"))
            .expect("c")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        // A path leaving the volume writes nothing.
        let before = std::fs::read_link(dir.join(DATA)).expect("data link");
        assert!(write(&dir, &[file("../x", "no", 0o644)]).is_err());
        assert_eq!(
            std::fs::read_link(dir.join(DATA)).expect("data link"),
            before
        );
        // A write that fails half-way ("a" is a file, so "a/b" cannot be) leaves no data dir.
        assert!(write(&dir, &[file("a", "x", 0o644), file("a/b", "y", 0o644)]).is_err());
        assert_eq!(
            std::fs::read_link(dir.join(DATA)).expect("data link"),
            before
        );
        let stamps = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("..2"))
            .count();
        assert_eq!(stamps, 1, "a half-written data dir stayed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
