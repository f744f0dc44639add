//! User namespaces of pods: the id mappings a pod asks for (checked as the kubelet and the CRI
//! expect), and the idmapped mounts that let a pod's root own its files without a chown of the
//! image: the rootfs overlay's lower layers and every bind source are mounted through the pod's
//! user namespace (`mount_setattr(2)` with `MOUNT_ATTR_IDMAP`), so host id 0 on disk is the
//! pod's root inside, and what the pod's root writes is stored as host id 0.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use serde::{Deserialize, Serialize};

/// One contiguous range: container ids `container_id..container_id+length` are host ids
/// `host_id..host_id+length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub container_id: u32,
    pub host_id: u32,
    pub length: u32,
}

impl IdRange {
    /// The host ids the range covers, end exclusive.
    pub fn host_ids(&self) -> std::ops::Range<u64> {
        u64::from(self.host_id)..u64::from(self.host_id) + u64::from(self.length)
    }

    /// The line `/proc/<pid>/uid_map` takes.
    pub fn map_line(&self) -> String {
        format!("{} {} {}\n", self.container_id, self.host_id, self.length)
    }

    /// The host id of container id `id`, when mapped.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        let offset = id.checked_sub(self.container_id)?;
        (offset < self.length).then(|| self.host_id + offset)
    }

    fn overlaps(&self, other: &IdRange) -> bool {
        let (a, b) = (self.host_ids(), other.host_ids());
        a.start < b.end && b.start < a.end
    }
}

/// A pod's own user namespace: its uid and gid ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIds {
    pub uids: IdRange,
    pub gids: IdRange,
}

impl PodIds {
    /// Whether any host id of `self` is one of `other`'s.
    pub fn overlaps(&self, other: &PodIds) -> bool {
        self.uids.overlaps(&other.uids) || self.gids.overlaps(&other.gids)
    }

    /// The host uid and gid of the pod's root.
    pub fn root_on_host(&self) -> (u32, u32) {
        (self.uids.host_id, self.gids.host_id)
    }

    /// The mappings as the CRI states them (for comparing with a container's).
    pub fn to_cri(self) -> cri::UserNamespace {
        let m = |r: IdRange| cri::IdMapping {
            host_id: r.host_id,
            container_id: r.container_id,
            length: r.length,
        };
        cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![m(self.uids)],
            gids: vec![m(self.gids)],
        }
    }
}

/// Reads a pod's user namespace option: `None` for the host's user namespace (no option, or
/// mode NODE), the mappings for mode POD; anything else is refused with the reason.
pub fn from_cri(opts: Option<&cri::UserNamespace>) -> Result<Option<PodIds>, String> {
    use cri::NamespaceMode as M;
    let Some(opts) = opts else {
        return Ok(None);
    };
    match M::try_from(opts.mode) {
        Ok(M::Node) => {
            if opts.uids.is_empty() && opts.gids.is_empty() {
                Ok(None)
            } else {
                Err("user namespace mode NODE takes no uid or gid mappings".into())
            }
        }
        Ok(M::Pod) => {
            let uids = one_range("uids", &opts.uids)?;
            let gids = one_range("gids", &opts.gids)?;
            Ok(Some(PodIds { uids, gids }))
        }
        Ok(mode) => Err(format!(
            "user namespace mode {} is not supported: a pod's containers share its user namespace (mode POD) or use the host's (NODE)",
            mode.as_str_name()
        )),
        Err(_) => Err(format!("unknown user namespace mode {}", opts.mode)),
    }
}

fn one_range(what: &str, mappings: &[cri::IdMapping]) -> Result<IdRange, String> {
    let [m] = mappings else {
        return Err(format!(
            "user namespace {what}: exactly one mapping is supported, got {}",
            mappings.len()
        ));
    };
    let range = IdRange {
        container_id: m.container_id,
        host_id: m.host_id,
        length: m.length,
    };
    if range.container_id != 0 {
        return Err(format!(
            "user namespace {what}: container id 0 must be mapped (the mapping starts at {})",
            range.container_id
        ));
    }
    if range.length == 0 {
        return Err(format!("user namespace {what}: the mapping's length is 0"));
    }
    if range.host_ids().end > 1 << 32 {
        return Err(format!(
            "user namespace {what}: host ids {}+{} go past 2^32",
            range.host_id, range.length
        ));
    }
    if range.host_id == 0 {
        return Err(format!(
            "user namespace {what}: host id 0 would make the pod's root the host's root"
        ));
    }
    Ok(range)
}

/// Writes a process's `gid_map` and `uid_map` (gids first, as the kernel then still lets the
/// writer set up groups; `setgroups` is left allowed so containers can have supplementary
/// groups).
pub fn write_maps(pid: i32, ids: &PodIds) -> std::io::Result<()> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    std::fs::write(proc.join("gid_map"), ids.gids.map_line())
        .map_err(|e| annotate(e, "writing gid_map"))?;
    std::fs::write(proc.join("uid_map"), ids.uids.map_line())
        .map_err(|e| annotate(e, "writing uid_map"))
}

fn annotate(e: std::io::Error, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Whether pods can have their own user namespace here: set once at start by
/// [`detect_support`].
static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether [`detect_support`] found idmapped mounts working.
pub fn supported() -> bool {
    SUPPORTED.get().copied().unwrap_or(false)
}

/// Checks, once, that mounts of `dirs` (Berth's root and state directories) can be idmapped
/// through a user namespace of a throwaway process, which is what user-namespaced pods need.
pub fn detect_support(dirs: &[&Path]) -> bool {
    *SUPPORTED.get_or_init(|| match probe(dirs) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "pods with their own user namespace are not supported on this host");
            false
        }
    })
}

fn probe(dirs: &[&Path]) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg("namespace-holder")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls unshare(2), a
    // plain system call that is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER)?;
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| annotate(e, "starting a user namespace holder"))?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let probe_ids = IdRange {
        container_id: 0,
        host_id: 1 << 16,
        length: 1 << 16,
    };
    let result = write_maps(
        pid,
        &PodIds {
            uids: probe_ids,
            gids: probe_ids,
        },
    )
    .and_then(|()| open(Path::new(&format!("/proc/{pid}/ns/user"))))
    .and_then(|ns| {
        dirs.iter()
            .try_for_each(|d| idmapped_clone(d, &ns, false).map(drop))
    });
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The body of `berthd namespace-holder`: waits, holding its namespaces, until it is killed.
pub fn run_namespace_holder() -> ! {
    loop {
        // SAFETY: pause(2) only waits for a signal.
        unsafe { libc::pause() };
    }
}

/// `mount_setattr(2)`'s attribute that idmaps a mount.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// A detached copy of the mount tree at `source` (the subtree below it when `source` is not a
/// mount point), idmapped through the user namespace `userns`; with `recursive`, the mounts
/// below `source` come along and are idmapped too.
pub fn idmapped_clone(
    source: &Path,
    userns: &OwnedFd,
    recursive: bool,
) -> std::io::Result<OwnedFd> {
    use rustix::mount::OpenTreeFlags as F;
    let mut flags = F::OPEN_TREE_CLONE | F::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= F::AT_RECURSIVE;
    }
    let tree = rustix::mount::open_tree(rustix::fs::CWD, source, flags).map_err(|e| {
        annotate(
            e.into(),
            format!("cloning the mount at {}", source.display()),
        )
    })?;
    let attr = libc::mount_attr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `tree` is an open mount tree we own, the path is empty (AT_EMPTY_PATH: the tree
    // itself), and `attr` is an initialised mount_attr whose size is passed; the kernel only
    // reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(annotate(
            std::io::Error::last_os_error(),
            format!("idmapping the mount of {}", source.display()),
        ));
    }
    Ok(tree)
}

/// Attaches a detached mount tree at `target` (which must exist).
pub fn attach(tree: &OwnedFd, target: &Path) -> std::io::Result<()> {
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        target,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| {
        annotate(
            e.into(),
            format!("attaching an idmapped mount at {}", target.display()),
        )
    })
}

/// Opens a pinned user namespace file.
pub fn open(path: &Path) -> std::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        annotate(
            e.into(),
            format!("opening user namespace {}", path.display()),
        )
    })
}

/// Checks that host user `uid` (a pod's root) may walk down to `path`: the container's
/// process, already in the pod's user namespace, reaches its rootfs and bind sources by path,
/// so each directory above them must be searchable by others (or belong to `uid`).
pub fn check_reachable(path: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    for dir in path.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let searchable =
            meta.mode() & 0o001 != 0 || (meta.uid() == uid && meta.mode() & 0o100 != 0);
        if !searchable {
            return Err(format!(
                "the pod's root (host uid {uid}) cannot reach {}: {} has mode {:o}; a pod with its own user namespace needs every directory above Berth's root searchable by others (o+x)",
                path.display(),
                dir.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// Where the idmapped copies of a container's bind sources are attached until its process has
/// made its own mounts of them.
pub const STAGED_DIR: &str = "idmapped";

/// Replaces each bind mount's source in `mounts` by an idmapped copy of it attached under
/// `<bundle>/idmapped/<n>`, so the container sees host id 0 as its root. Sources under
/// `/proc`, `/sys` and `/dev` keep their host ids, and so do those under `own` (the files Berth
/// made for the pod, which belong to the pod's root already); a source whose filesystem cannot
/// be idmapped is bound as it is (its files show as the overflow id inside), which is logged.
pub fn stage_binds(
    mounts: &mut [oci_spec::runtime::Mount],
    bundle: &Path,
    own: &[&Path],
    userns: &OwnedFd,
) -> std::io::Result<()> {
    let dir = bundle.join(STAGED_DIR);
    for (n, m) in mounts.iter_mut().enumerate() {
        if m.typ().as_deref() != Some("bind") {
            continue;
        }
        let Some(source) = m.source().clone() else {
            continue;
        };
        if ["/proc", "/sys", "/dev"]
            .iter()
            .any(|p| source.starts_with(p))
            || own.iter().any(|p| source.starts_with(p))
        {
            continue;
        }
        let recursive = m
            .options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "rbind"));
        let tree = match idmapped_clone(&source, userns, recursive) {
            Ok(t) => t,
            Err(e) if recursive && e.raw_os_error() == Some(libc::EINVAL) => {
                // A mount below the source cannot be idmapped: the source alone.
                match idmapped_clone(&source, userns, false) {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(source = %source.display(), error = %e, "bind source kept with host ids");
                        continue;
                    }
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(source = %source.display(), error = %e, "bind source kept with host ids");
                continue;
            }
            Err(e) => return Err(e),
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| annotate(e, format!("creating {}", dir.display())))?;
        let target = dir.join(n.to_string());
        if source.is_dir() {
            std::fs::create_dir_all(&target)
        } else {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)
                .map(drop)
        }
        .map_err(|e| annotate(e, format!("creating {}", target.display())))?;
        attach(&tree, &target)?;
        m.set_source(Some(target));
    }
    Ok(())
}

/// Detaches the idmapped copies [`stage_binds`] attached under `bundle` (the container's own
/// mounts of them stay) and removes their mount points. Idempotent.
pub fn release_binds(bundle: &Path) {
    let dir = bundle.join(STAGED_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let target = entry.path();
        match rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH) {
            Ok(()) | Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                tracing::warn!(target = %target.display(), error = %e, "detaching an idmapped bind source");
                continue;
            }
        }
        let removed = if target.is_dir() {
            std::fs::remove_dir(&target)
        } else {
            std::fs::remove_file(&target)
        };
        if let Err(e) = removed {
            tracing::debug!(target = %target.display(), error = %e, "removing an idmapped mount point");
        }
    }
    let _ = std::fs::remove_dir(&dir);
}

/// Mounts a container's rootfs for a user-namespaced pod: an overlay whose lower layers are
/// read through an idmapped copy of the snapshot directory (the overlay itself cannot be
/// idmapped), and whose upper directory's root belongs to the pod's root. A single-layer bind
/// is idmapped directly. `scratch` is a free directory path used while mounting.
pub fn mount_rootfs(
    mounts: &[berth_snapshotter::Mount],
    snapshots_dir: &Path,
    userns: &OwnedFd,
    ids: &PodIds,
    target: &Path,
    scratch: &Path,
) -> std::io::Result<()> {
    for m in mounts {
        if m.fstype == "bind" {
            let tree = idmapped_clone(Path::new(&m.source), userns, true)?;
            attach(&tree, target)?;
            continue;
        }
        std::fs::create_dir_all(scratch)
            .map_err(|e| annotate(e, format!("creating {}", scratch.display())))?;
        let tree = idmapped_clone(snapshots_dir, userns, false)?;
        attach(&tree, scratch)?;
        let mounted = overlay_through(m, snapshots_dir, scratch, ids, target);
        if let Err(e) = rustix::mount::unmount(scratch, rustix::mount::UnmountFlags::DETACH) {
            tracing::warn!(path = %scratch.display(), error = %e, "detaching the idmapped layers");
        }
        let _ = std::fs::remove_dir(scratch);
        mounted?;
    }
    Ok(())
}

/// Mount data the kernel takes in one page, with room to spare.
const MAX_MOUNT_DATA: usize = 4000;

/// The overlay `m` with its lower directories under `idmapped` instead of `snapshots_dir`
/// (upper and work directories stay where they are), the upper root owned by the pod's root.
fn overlay_through(
    m: &berth_snapshotter::Mount,
    snapshots_dir: &Path,
    idmapped: &Path,
    ids: &PodIds,
    target: &Path,
) -> std::io::Result<()> {
    let base = m.cwd.as_deref().unwrap_or(snapshots_dir);
    let absolute = |p: &str| {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };
    // Each lower directory relative to the snapshot directory, then read through its idmapped
    // copy: by absolute paths when they fit in the kernel's page of mount data, else relative
    // to the copy as the working directory of the mount.
    let mut lowers: Vec<PathBuf> = Vec::new();
    let mut rest = Vec::with_capacity(m.options.len());
    let mut upper = None;
    for o in &m.options {
        if let Some(list) = o.strip_prefix("lowerdir=") {
            for dir in list.split(':') {
                let dir = absolute(dir);
                let rel = dir.strip_prefix(snapshots_dir).map_err(|_| {
                    std::io::Error::other(format!(
                        "lower directory {} is not a snapshot",
                        dir.display()
                    ))
                })?;
                lowers.push(rel.to_path_buf());
            }
        } else if let Some(p) = o.strip_prefix("upperdir=") {
            let p = absolute(p);
            rest.push(format!("upperdir={}", p.display()));
            upper = Some(p);
        } else if let Some(p) = o.strip_prefix("workdir=") {
            rest.push(format!("workdir={}", absolute(p).display()));
        } else {
            rest.push(o.clone());
        }
    }
    let joined = |base: &Path| {
        lowers
            .iter()
            .map(|l| base.join(l).to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    };
    let mut options = rest.clone();
    options.push(format!("lowerdir={}", joined(idmapped)));
    let mut cwd = None;
    if options.iter().map(|o| o.len() + 1).sum::<usize>() > MAX_MOUNT_DATA {
        options = rest;
        options.push(format!("lowerdir={}", joined(Path::new(""))));
        cwd = Some(idmapped.to_path_buf());
    }
    if let Some(upper) = &upper {
        let (uid, gid) = ids.root_on_host();
        std::os::unix::fs::lchown(upper, Some(uid), Some(gid))
            .map_err(|e| annotate(e, format!("giving {} to the pod's root", upper.display())))?;
    }
    let mount = berth_snapshotter::Mount {
        fstype: m.fstype.clone(),
        source: m.source.clone(),
        options,
        cwd,
    };
    mount
        .mount(target)
        .map_err(|e| std::io::Error::other(format!("mounting the idmapped rootfs: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(
        mode: cri::NamespaceMode,
        uids: &[(u32, u32, u32)],
        gids: &[(u32, u32, u32)],
    ) -> cri::UserNamespace {
        let m = |v: &[(u32, u32, u32)]| {
            v.iter()
                .map(|&(container_id, host_id, length)| cri::IdMapping {
                    container_id,
                    host_id,
                    length,
                })
                .collect()
        };
        cri::UserNamespace {
            mode: mode as i32,
            uids: m(uids),
            gids: m(gids),
        }
    }

    #[test]
    fn pod_mode_takes_one_mapping_of_root() {
        use cri::NamespaceMode as M;
        let ok = from_cri(Some(&opts(
            M::Pod,
            &[(0, 1000, 100000)],
            &[(0, 1000, 100000)],
        )))
        .expect("valid")
        .expect("pod ids");
        assert_eq!(ok.uids.host_ids(), 1000..101000);
        assert_eq!(ok.uids.to_host(0), Some(1000));
        assert_eq!(ok.uids.to_host(100000), None);
        assert_eq!(ok.root_on_host(), (1000, 1000));
        assert_eq!(from_cri(None), Ok(None));
        assert_eq!(from_cri(Some(&opts(M::Node, &[], &[]))), Ok(None));
        for bad in [
            opts(M::Pod, &[(0, 1000, 10), (0, 2000, 10)], &[(0, 1000, 10)]),
            opts(M::Pod, &[(1, 1000, 10)], &[(1, 1000, 10)]),
            opts(M::Pod, &[(0, 1000, 0)], &[(0, 1000, 10)]),
            opts(M::Pod, &[(0, 0, 65536)], &[(0, 0, 65536)]),
            opts(M::Pod, &[(0, u32::MAX, 2)], &[(0, 1000, 10)]),
            opts(M::Pod, &[], &[]),
            opts(M::Node, &[(0, 1000, 10)], &[(0, 1000, 10)]),
            opts(M::Container, &[], &[]),
            opts(M::Target, &[], &[]),
        ] {
            assert!(from_cri(Some(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn overlap_is_by_host_ids() {
        let r = |host_id, length| IdRange {
            container_id: 0,
            host_id,
            length,
        };
        let a = PodIds {
            uids: r(65536, 65536),
            gids: r(65536, 65536),
        };
        let b = PodIds {
            uids: r(131072, 65536),
            gids: r(131072, 65536),
        };
        let c = PodIds {
            uids: r(131071, 10),
            gids: r(500000, 10),
        };
        assert!(!a.overlaps(&b));
        assert!(a.overlaps(&c));
        assert!(b.overlaps(&c));
        assert_eq!(a.uids.map_line(), "0 65536 65536\n");
    }
}
