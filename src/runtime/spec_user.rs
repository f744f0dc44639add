//! Resolution of a container's user and groups through the rootfs' /etc/passwd and /etc/group.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::spec::SpecError;

/// Files larger than this in the image are refused rather than read whole.
const MAX_DB_FILE: u64 = 8 << 20;
/// Symlink hops allowed while resolving a path inside the rootfs.
const MAX_SYMLINKS: usize = 40;

/// The identity the container's process runs with, reported back in ContainerStatus.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EffectiveUser {
    pub uid: u32,
    pub gid: u32,
    /// Additional groups, the primary gid first (as containerd reports them).
    pub supplemental_groups: Vec<u32>,
}

/// What the request and the image say about the user.
#[derive(Clone, Debug, Default)]
pub struct UserRequest<'a> {
    pub run_as_user: Option<i64>,
    pub run_as_username: &'a str,
    pub run_as_group: Option<i64>,
    /// The image config's `User` ("", "uid", "uid:gid", "name", "name:group", ...).
    pub image_user: &'a str,
    pub supplemental_groups: &'a [i64],
    /// `true` for SupplementalGroupsPolicy Strict: the rootfs' /etc/group is not consulted.
    pub strict: bool,
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// Resolves the effective user of a container whose root filesystem is `rootfs`.
pub fn resolve_user(rootfs: &Path, req: &UserRequest<'_>) -> Result<EffectiveUser, SpecError> {
    if req.run_as_group.is_some() && req.run_as_user.is_none() && req.run_as_username.is_empty() {
        return Err(SpecError::invalid(
            "run_as_group",
            "is set without run_as_user or run_as_username",
        ));
    }
    let passwd = read_passwd(rootfs)?;
    let (uid, mut gid, name) = if let Some(uid) = req.run_as_user {
        let uid = id_from_i64(uid, "run_as_user")?;
        user_by_uid(&passwd, uid)
    } else if !req.run_as_username.is_empty() {
        let entry = passwd
            .iter()
            .find(|p| p.name == req.run_as_username)
            .ok_or_else(|| {
                SpecError::invalid(
                    "run_as_username",
                    format!(
                        "user {:?} not found in the image's /etc/passwd",
                        req.run_as_username
                    ),
                )
            })?;
        (entry.uid, entry.gid, Some(entry.name.clone()))
    } else {
        image_user(rootfs, &passwd, req.image_user)?
    };
    if let Some(g) = req.run_as_group {
        gid = id_from_i64(g, "run_as_group")?;
    }

    let mut groups = vec![gid];
    if !req.strict
        && let Some(name) = &name
    {
        for g in read_group(rootfs)? {
            if g.members.iter().any(|m| m == name) && !groups.contains(&g.gid) {
                groups.push(g.gid);
            }
        }
    }
    for &g in req.supplemental_groups {
        let g = id_from_i64(g, "supplemental_groups")?;
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    Ok(EffectiveUser {
        uid,
        gid,
        supplemental_groups: groups,
    })
}

fn id_from_i64(v: i64, field: &str) -> Result<u32, SpecError> {
    u32::try_from(v)
        .ok()
        .filter(|&id| id != u32::MAX)
        .ok_or_else(|| SpecError::invalid(field, format!("{v} is not a valid id")))
}

/// uid → (uid, primary gid from passwd or 0, name if known).
fn user_by_uid(passwd: &[PasswdEntry], uid: u32) -> (u32, u32, Option<String>) {
    match passwd.iter().find(|p| p.uid == uid) {
        Some(p) => (uid, p.gid, Some(p.name.clone())),
        None => (uid, 0, None),
    }
}

fn image_user(
    rootfs: &Path,
    passwd: &[PasswdEntry],
    spec: &str,
) -> Result<(u32, u32, Option<String>), SpecError> {
    let spec = spec.trim();
    if spec.is_empty() {
        let (uid, gid, name) = user_by_uid(passwd, 0);
        return Ok((uid, gid, name.or_else(|| Some("root".to_string()))));
    }
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let (uid, mut gid, name) = match user.parse::<u32>() {
        Ok(uid) => user_by_uid(passwd, uid),
        Err(_) => {
            let entry = passwd.iter().find(|p| p.name == user).ok_or_else(|| {
                SpecError::invalid(
                    "image user",
                    format!("user {user:?} not found in the image's /etc/passwd"),
                )
            })?;
            (entry.uid, entry.gid, Some(entry.name.clone()))
        }
    };
    if let Some(group) = group.filter(|g| !g.is_empty()) {
        gid = match group.parse::<u32>() {
            Ok(g) => g,
            Err(_) => {
                let groups = read_group(rootfs)?;
                groups
                    .iter()
                    .find(|g| g.name == group)
                    .map(|g| g.gid)
                    .ok_or_else(|| {
                        SpecError::invalid(
                            "image user",
                            format!("group {group:?} not found in the image's /etc/group"),
                        )
                    })?
            }
        };
    }
    Ok((uid, gid, name))
}

fn read_passwd(rootfs: &Path) -> Result<Vec<PasswdEntry>, SpecError> {
    let text = read_db(rootfs, "etc/passwd")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 4 || f[0].is_empty() || line.starts_with('#') {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].trim().parse().ok()?,
                gid: f[3].trim().parse().ok()?,
            })
        })
        .collect())
}

fn read_group(rootfs: &Path) -> Result<Vec<GroupEntry>, SpecError> {
    let text = read_db(rootfs, "etc/group")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 3 || f[0].is_empty() || line.starts_with('#') {
                return None;
            }
            Some(GroupEntry {
                name: f[0].to_string(),
                gid: f[2].trim().parse().ok()?,
                members: f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect())
}

/// Reads a small text file of the image; a missing file reads as empty.
fn read_db(rootfs: &Path, rel: &str) -> Result<String, SpecError> {
    let Some(path) = resolve_in_root(rootfs, Path::new(rel))? else {
        return Ok(String::new());
    };
    let io_err = |source| SpecError::Io {
        path: path.clone(),
        source,
    };
    let meta = std::fs::metadata(&path).map_err(io_err)?;
    if !meta.is_file() {
        return Ok(String::new());
    }
    let file = std::fs::File::open(&path).map_err(io_err)?;
    let mut buf = Vec::new();
    file.take(MAX_DB_FILE)
        .read_to_end(&mut buf)
        .map_err(io_err)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Resolves `rel` inside `root` following symlinks as if `root` were `/`, so an image's
/// `/etc/passwd -> /host/file` symlink can never escape the rootfs. `None` if absent.
pub(crate) fn resolve_in_root(root: &Path, rel: &Path) -> Result<Option<PathBuf>, SpecError> {
    let mut pending: Vec<std::ffi::OsString> = rel
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut current: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            current.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(current.iter());
        candidate.push(&part);
        match std::fs::symlink_metadata(&candidate) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SpecError::Io {
                    path: candidate,
                    source,
                });
            }
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Ok(None);
                }
                let target = std::fs::read_link(&candidate).map_err(|source| SpecError::Io {
                    path: candidate.clone(),
                    source,
                })?;
                if target.is_absolute() {
                    current.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(s) => pending.push(s.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            Ok(_) => current.push(part),
        }
    }
    let mut out = root.to_path_buf();
    out.extend(current.iter());
    Ok(Some(out))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rootfs(tag: &str) -> crate::util::ScratchDir {
        let dir = crate::util::ScratchDir::new(&format!("spec-user-{tag}"));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(
            dir.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n\
             # comment\n\
             daemon:x:1:1::/:/sbin/nologin\n\
             app:x:1000:1000:App:/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("etc/group"),
            "root:x:0:\nwheel:x:10:root,app\napp:x:1000:\nstaff:x:50:app, daemon\n",
        )
        .unwrap();
        dir
    }

    fn req<'a>() -> UserRequest<'a> {
        UserRequest::default()
    }

    #[test]
    fn default_is_root_with_groups() {
        let r = rootfs("default");
        let u = resolve_user(&r, &req()).unwrap();
        assert_eq!((u.uid, u.gid), (0, 0));
        assert_eq!(u.supplemental_groups, vec![0, 10]);
    }

    #[test]
    fn image_user_forms() {
        let r = rootfs("forms");
        let mut q = req();
        q.image_user = "app";
        let u = resolve_user(&r, &q).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.supplemental_groups, vec![1000, 10, 50]);
        q.image_user = "1000";
        assert_eq!(resolve_user(&r, &q).unwrap().gid, 1000);
        q.image_user = "4242";
        let u = resolve_user(&r, &q).unwrap();
        assert_eq!((u.uid, u.gid, u.supplemental_groups), (4242, 0, vec![0]));
        q.image_user = "1000:50";
        assert_eq!(resolve_user(&r, &q).unwrap().gid, 50);
        q.image_user = "app:wheel";
        assert_eq!(resolve_user(&r, &q).unwrap().gid, 10);
        q.image_user = "app:nogroup";
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(e.is_invalid_argument() && e.to_string().contains("nogroup"));
        q.image_user = "ghost";
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(e.is_invalid_argument() && e.to_string().contains("ghost"));
    }

    #[test]
    fn run_as_user_overrides_image_and_group_overrides_gid() {
        let r = rootfs("runas");
        let mut q = req();
        q.image_user = "daemon";
        q.run_as_user = Some(1000);
        q.run_as_group = Some(3000);
        let u = resolve_user(&r, &q).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 3000));
        assert_eq!(u.supplemental_groups, vec![3000, 10, 50]);
        q.run_as_user = Some(-1);
        assert!(resolve_user(&r, &q).unwrap_err().is_invalid_argument());
    }

    #[test]
    fn run_as_group_needs_a_user() {
        let r = rootfs("group-alone");
        let mut q = req();
        q.run_as_group = Some(1002);
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("run_as_group"),
            "{e}"
        );
        q.run_as_username = "app";
        let u = resolve_user(&r, &q).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1002));
    }

    #[test]
    fn run_as_username() {
        let r = rootfs("username");
        let mut q = req();
        q.run_as_username = "app";
        assert_eq!(resolve_user(&r, &q).unwrap().uid, 1000);
        q.run_as_username = "nobody-here";
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(e.is_invalid_argument());
        assert!(e.to_string().contains("run_as_username"));
    }

    #[test]
    fn supplemental_groups_merge_and_strict() {
        let r = rootfs("policy");
        let mut q = req();
        q.run_as_user = Some(1000);
        q.supplemental_groups = &[4000, 50];
        let merged = resolve_user(&r, &q).unwrap();
        assert_eq!(merged.supplemental_groups, vec![1000, 10, 50, 4000]);
        q.strict = true;
        let strict = resolve_user(&r, &q).unwrap();
        assert_eq!(strict.supplemental_groups, vec![1000, 4000, 50]);
    }

    #[test]
    fn symlinked_passwd_stays_inside_rootfs() {
        let r = rootfs("symlink");
        std::fs::create_dir_all(r.join("real")).unwrap();
        std::fs::rename(r.join("etc/passwd"), r.join("real/pw")).unwrap();
        std::os::unix::fs::symlink("/real/pw", r.join("etc/passwd")).unwrap();
        let mut q = req();
        q.image_user = "app";
        assert_eq!(resolve_user(&r, &q).unwrap().uid, 1000);
        // An absolute link to the host's /etc/passwd resolves inside the rootfs.
        std::fs::remove_file(r.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/../../../../etc/shadow", r.join("etc/passwd")).unwrap();
        let p = resolve_in_root(&r, Path::new("etc/passwd")).unwrap();
        assert!(p.is_none());
    }

    #[test]
    fn missing_passwd_numeric_user_ok_named_user_refused() {
        let dir = crate::util::ScratchDir::new("spec-user-empty");
        let mut q = req();
        q.image_user = "1234:99";
        let u = resolve_user(&dir, &q).unwrap();
        assert_eq!((u.uid, u.gid), (1234, 99));
        q.image_user = "app";
        assert!(resolve_user(&dir, &q).unwrap_err().is_invalid_argument());
    }
}
