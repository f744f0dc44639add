//! Resolution of a container's user and groups through the rootfs' /etc/passwd and /etc/group.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::spec::SpecError;

/// An image's /etc/passwd or /etc/group larger than this is refused rather than read.
pub const MAX_DB_FILE: u64 = 4 << 20;
/// The one id no process can hold: `setuid(4294967295)` and `setgid(4294967295)` mean "leave
/// the id as it is", so a process asked to become it stays root.
pub const RESERVED_ID: u32 = u32::MAX;
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
    /// The image as the request names it, for error messages.
    pub image_name: &'a str,
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
///
/// Every id must fit a `u32` other than [`RESERVED_ID`], wherever it comes from (the request,
/// the image's `User`, its /etc/passwd or /etc/group): a process told to take that id would
/// keep root's while the image reports a non-root user.
pub fn resolve_user(rootfs: &Path, req: &UserRequest<'_>) -> Result<EffectiveUser, SpecError> {
    if req.run_as_group.is_some() && req.run_as_user.is_none() && req.run_as_username.is_empty() {
        return Err(SpecError::invalid(
            "run_as_group",
            "is set without run_as_user or run_as_username",
        ));
    }
    let db = Db {
        rootfs,
        image: req.image_name,
    };
    let passwd = db.passwd()?;
    let (uid, mut gid, name) = if let Some(uid) = req.run_as_user {
        let uid = id_from_i64(uid, "run_as_user")?;
        db.user_by_uid(&passwd, uid)?
    } else if !req.run_as_username.is_empty() {
        let entry = passwd
            .iter()
            .find(|p| p.name == req.run_as_username)
            .ok_or_else(|| {
                SpecError::invalid(
                    "run_as_username",
                    format!(
                        "user {:?} not found in the /etc/passwd of image {}",
                        req.run_as_username, req.image_name
                    ),
                )
            })?;
        db.entry_ids(entry)?
    } else {
        db.image_user(&passwd, req.image_user)?
    };
    if let Some(g) = req.run_as_group {
        gid = id_from_i64(g, "run_as_group")?;
    }

    let mut groups = vec![gid];
    if !req.strict
        && let Some(name) = &name
    {
        for g in db.groups()? {
            if g.members.iter().any(|m| m == name) && !groups.contains(&g.gid) {
                groups.push(db.checked(g.gid, "/etc/group", &g.name)?);
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

/// A uid or gid of a request: it must fit a `u32` other than [`RESERVED_ID`].
fn id_from_i64(v: i64, field: &str) -> Result<u32, SpecError> {
    u32::try_from(v)
        .ok()
        .filter(|&id| id != RESERVED_ID)
        .ok_or_else(|| {
            SpecError::invalid(
                field,
                format!(
                    "{v} is not a valid id (ids run from 0 to {})",
                    RESERVED_ID - 1
                ),
            )
        })
}

/// How one part (user or group) of an image's `User` reads.
#[derive(Debug, PartialEq, Eq)]
enum IdPart<'a> {
    Empty,
    Id(u32),
    Name(&'a str),
}

/// Reads one part of an image's `User`: digits (with an optional sign) are an id that must fit
/// below [`RESERVED_ID`]; anything else is a name.
fn id_part(part: &str) -> Result<IdPart<'_>, String> {
    if part.is_empty() {
        return Ok(IdPart::Empty);
    }
    let digits = part.strip_prefix(['+', '-']).unwrap_or(part);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(IdPart::Name(part));
    }
    part.parse::<u32>()
        .ok()
        .filter(|&id| id != RESERVED_ID)
        .map(IdPart::Id)
        .ok_or_else(|| {
            format!(
                "{part} is not a valid id (ids run from 0 to {})",
                RESERVED_ID - 1
            )
        })
}

/// Checks an image config's `User` as a pull or an import takes the image: a numeric user or
/// group must be a valid id, so that the uid the image reports (and a kubelet's runAsNonRoot
/// check reads) is the one its containers would run as. `image` names the image in the error.
pub fn check_image_config_user(image: &str, user: Option<&str>) -> Result<(), String> {
    let Some(user) = user.map(str::trim) else {
        return Ok(());
    };
    let (u, g) = user.split_once(':').unwrap_or((user, ""));
    for part in [u, g] {
        id_part(part).map_err(|why| {
            format!("refusing image {image}: its config's User {user:?} is invalid: {why}")
        })?;
    }
    Ok(())
}

/// The container's rootfs, read for its user database.
struct Db<'a> {
    rootfs: &'a Path,
    image: &'a str,
}

impl Db<'_> {
    fn passwd(&self) -> Result<Vec<PasswdEntry>, SpecError> {
        let text = self.read("etc/passwd")?;
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

    fn groups(&self) -> Result<Vec<GroupEntry>, SpecError> {
        let text = self.read("etc/group")?;
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

    /// `id` from the image's `file` (entry `name`), refused if it is [`RESERVED_ID`].
    fn checked(&self, id: u32, file: &str, name: &str) -> Result<u32, SpecError> {
        if id == RESERVED_ID {
            return Err(SpecError::invalid(
                format!("{file} of image {}", self.image),
                format!("{name:?} has id {id}, which no process can take (it would stay root)"),
            ));
        }
        Ok(id)
    }

    /// (uid, gid, name) of a passwd entry, both ids checked.
    fn entry_ids(&self, p: &PasswdEntry) -> Result<(u32, u32, Option<String>), SpecError> {
        Ok((
            self.checked(p.uid, "/etc/passwd", &p.name)?,
            self.checked(p.gid, "/etc/passwd", &p.name)?,
            Some(p.name.clone()),
        ))
    }

    /// uid → (uid, primary gid from passwd or 0, name if known).
    fn user_by_uid(
        &self,
        passwd: &[PasswdEntry],
        uid: u32,
    ) -> Result<(u32, u32, Option<String>), SpecError> {
        match passwd.iter().find(|p| p.uid == uid) {
            Some(p) => self.entry_ids(p),
            None => Ok((uid, 0, None)),
        }
    }

    fn image_user(
        &self,
        passwd: &[PasswdEntry],
        spec: &str,
    ) -> Result<(u32, u32, Option<String>), SpecError> {
        let spec = spec.trim();
        let field = || format!("User of image {}", self.image);
        let (user, group) = spec.split_once(':').unwrap_or((spec, ""));
        let part =
            |p| id_part(p).map_err(|why| SpecError::invalid(field(), format!("{spec:?}: {why}")));
        let (uid, mut gid, name) = match part(user)? {
            IdPart::Empty if group.is_empty() => {
                let (uid, gid, name) = self.user_by_uid(passwd, 0)?;
                return Ok((uid, gid, name.or_else(|| Some("root".to_string()))));
            }
            IdPart::Empty => self.user_by_uid(passwd, 0)?,
            IdPart::Id(uid) => self.user_by_uid(passwd, uid)?,
            IdPart::Name(user) => {
                let entry = passwd.iter().find(|p| p.name == user).ok_or_else(|| {
                    SpecError::invalid(
                        field(),
                        format!("user {user:?} not found in the image's /etc/passwd"),
                    )
                })?;
                self.entry_ids(entry)?
            }
        };
        match part(group)? {
            IdPart::Empty => {}
            IdPart::Id(g) => gid = g,
            IdPart::Name(group) => {
                let groups = self.groups()?;
                let entry = groups.iter().find(|g| g.name == group).ok_or_else(|| {
                    SpecError::invalid(
                        field(),
                        format!("group {group:?} not found in the image's /etc/group"),
                    )
                })?;
                gid = self.checked(entry.gid, "/etc/group", &entry.name)?;
            }
        }
        Ok((uid, gid, name))
    }

    /// Reads a small text file of the image; a missing file reads as empty.
    ///
    /// The path is resolved inside the rootfs ([`resolve_in_root`]); its last component is then
    /// opened without following a symlink and without blocking (a FIFO), and must be a regular
    /// file of at most [`MAX_DB_FILE`] bytes.
    fn read(&self, rel: &str) -> Result<String, SpecError> {
        let Some(path) = resolve_in_root(self.rootfs, Path::new(rel))? else {
            return Ok(String::new());
        };
        let shown = || format!("/{rel} of image {}", self.image);
        let io_err = |source| SpecError::Io {
            path: path.clone(),
            source,
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(SpecError::invalid(
                    shown(),
                    "it is a symbolic link where none was a moment before",
                ));
            }
            Err(e) => return Err(io_err(e)),
        };
        let meta = file.metadata().map_err(io_err)?;
        let kind = meta.file_type();
        if !kind.is_file() {
            let what = if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_char_device() {
                "a character device"
            } else if kind.is_block_device() {
                "a block device"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_dir() {
                "a directory"
            } else {
                "not a file"
            };
            return Err(SpecError::invalid(
                shown(),
                format!("it is {what}, not a regular file"),
            ));
        }
        let too_big = |size: u64| {
            SpecError::invalid(
                shown(),
                format!("it is {size} bytes, over the {MAX_DB_FILE} bytes read to look up users"),
            )
        };
        if meta.len() > MAX_DB_FILE {
            return Err(too_big(meta.len()));
        }
        let mut buf = Vec::new();
        file.take(MAX_DB_FILE + 1)
            .read_to_end(&mut buf)
            .map_err(io_err)?;
        if buf.len() as u64 > MAX_DB_FILE {
            return Err(too_big(buf.len() as u64));
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
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

    #[test]
    fn the_reserved_id_is_refused_wherever_it_comes_from() {
        let r = rootfs("reserved");
        let mut q = req();
        q.image_name = "reg/evil:1";
        for user in ["4294967295", "0:4294967295", "4294967296", "-1", "1000:-1"] {
            q.image_user = user;
            let e = resolve_user(&r, &q).unwrap_err();
            let msg = e.to_string();
            assert!(e.is_invalid_argument(), "{user}: {e}");
            assert!(
                msg.contains("reg/evil:1") && msg.contains("not a valid id"),
                "{msg}"
            );
        }
        q.image_user = "";
        let mut q1 = q.clone();
        q1.run_as_user = Some(4294967295);
        let e = resolve_user(&r, &q1).unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("run_as_user"),
            "{e}"
        );
        q1.run_as_user = Some(1);
        q1.run_as_group = Some(4294967295);
        let e = resolve_user(&r, &q1).unwrap_err();
        assert!(
            e.is_invalid_argument() && e.to_string().contains("run_as_group"),
            "{e}"
        );
        assert!(e.to_string().contains("4294967295"), "{e}");
        let mut q2 = q.clone();
        q2.supplemental_groups = &[10, 4294967295];
        let e = resolve_user(&r, &q2).unwrap_err();
        assert!(e.to_string().contains("supplemental_groups"), "{e}");

        // A name whose passwd or group entry carries the reserved id.
        std::fs::write(
            r.join("etc/passwd"),
            "root:x:0:0::/:/bin/sh\nevil:x:4294967295:0::/:/bin/sh\nodd:x:5:4294967295::/:/bin/sh\n\
             app:x:1000:1000::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(r.join("etc/group"), "root:x:0:\nbad:x:4294967295:app\n").unwrap();
        for user in ["evil", "odd", "5", "app:bad"] {
            q.image_user = user;
            let e = resolve_user(&r, &q).unwrap_err();
            assert!(
                e.is_invalid_argument() && e.to_string().contains("4294967295"),
                "{user}: {e}"
            );
        }
        // Membership of a group with the reserved id.
        q.image_user = "app";
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(e.to_string().contains("/etc/group"), "{e}");
        q.run_as_username = "evil";
        assert!(resolve_user(&r, &q).unwrap_err().is_invalid_argument());
    }

    #[test]
    fn image_config_user_is_checked_at_pull() {
        for ok in [
            None,
            Some(""),
            Some("0"),
            Some("app"),
            Some("1000:50"),
            Some("4294967294"),
        ] {
            assert!(check_image_config_user("img", ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "4294967295",
            "0:4294967295",
            "99999999999999999999",
            "-1",
            "app:-5",
        ] {
            let e = check_image_config_user("reg/img:1", Some(bad)).unwrap_err();
            assert!(e.contains("reg/img:1") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn special_or_oversized_user_files_are_refused_without_blocking() {
        let r = rootfs("special");
        let mut q = req();
        q.image_user = "app";
        q.image_name = "reg/special:1";
        // A FIFO: opening it for reading would wait for a writer forever.
        std::fs::remove_file(r.join("etc/passwd")).unwrap();
        let fifo =
            std::ffi::CString::new(r.join("etc/passwd").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `fifo` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let e = resolve_user(&r, &q).unwrap_err();
        let msg = e.to_string();
        assert!(e.is_invalid_argument(), "{msg}");
        assert!(
            msg.contains("FIFO") && msg.contains("/etc/passwd of image reg/special:1"),
            "{msg}"
        );
        // A symlink to it, as an image would ship it.
        std::fs::remove_file(r.join("etc/passwd")).unwrap();
        std::fs::rename(r.join("etc/group"), r.join("etc/group.real")).unwrap();
        let fifo =
            std::ffi::CString::new(r.join("etc/pipe").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::os::unix::fs::symlink("/etc/pipe", r.join("etc/passwd")).unwrap();
        let msg = resolve_user(&r, &q).unwrap_err().to_string();
        assert!(msg.contains("FIFO"), "{msg}");
        // A directory.
        std::fs::remove_file(r.join("etc/passwd")).unwrap();
        std::fs::create_dir(r.join("etc/passwd")).unwrap();
        let msg = resolve_user(&r, &q).unwrap_err().to_string();
        assert!(msg.contains("directory"), "{msg}");
        // One byte over the bound; the bound itself is read.
        std::fs::remove_dir(r.join("etc/passwd")).unwrap();
        let mut big = vec![b'#'; MAX_DB_FILE as usize - 40];
        big.extend_from_slice(b"\napp:x:1000:1000::/:/bin/sh\n");
        big.resize(MAX_DB_FILE as usize, b'\n');
        std::fs::write(r.join("etc/passwd"), &big).unwrap();
        assert_eq!(resolve_user(&r, &q).unwrap().uid, 1000);
        big.push(b'\n');
        std::fs::write(r.join("etc/passwd"), &big).unwrap();
        let e = resolve_user(&r, &q).unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("over the {MAX_DB_FILE} bytes")),
            "{e}"
        );
    }
}
