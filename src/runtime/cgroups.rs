//! cgroupfs layout: where the hierarchies are (v1, hybrid or pure v2), and pod cgroup dirs.

use std::path::{Path, PathBuf};

/// The mounted cgroup hierarchies Berth manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Pure cgroup v2 at this mount point.
    V2(PathBuf),
    /// cgroup v1: one mount point per hierarchy (hybrid hosts also have a cgroup2 mount,
    /// which Berth leaves alone, as libcontainer does).
    V1(Vec<PathBuf>),
}

impl Layout {
    /// Reads `/proc/self/mountinfo`.
    pub fn detect() -> std::io::Result<Self> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(Self::from_mountinfo(&text))
    }

    /// Parses mountinfo text.
    pub fn from_mountinfo(text: &str) -> Self {
        let mut v1 = Vec::new();
        let mut v2 = None;
        for mount in cgroup_mounts(text) {
            if mount.v2 {
                v2 = v2.or(Some(PathBuf::from(mount.point)));
            } else {
                v1.push(PathBuf::from(mount.point));
            }
        }
        match (v1.is_empty(), v2) {
            (true, Some(p)) => Self::V2(p),
            _ => {
                v1.sort();
                v1.dedup();
                Self::V1(v1)
            }
        }
    }

    /// Whether this is pure cgroup v2.
    pub fn is_v2(&self) -> bool {
        matches!(self, Self::V2(_))
    }

    /// Whether the controller (`hugetlb`, `memory`, ...) is there to manage: a v1 hierarchy
    /// carries it, or the v2 root lists it in `cgroup.controllers`.
    pub fn has_controller(&self, controller: &str) -> bool {
        self.has_controller_with(controller, &|p| std::fs::read_to_string(p).ok())
    }

    /// [`Self::has_controller`], reading the v2 root's files through `read`.
    pub fn has_controller_with(
        &self,
        controller: &str,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> bool {
        match self {
            Self::V1(_) => self.v1_hierarchy(controller).is_some(),
            Self::V2(root) => read(&root.join("cgroup.controllers"))
                .is_some_and(|t| t.split_whitespace().any(|c| c == controller)),
        }
    }

    /// The v1 hierarchy that carries `controller` (its mount is named after its controllers,
    /// e.g. `cpu,cpuacct`); None on v2 or when no hierarchy does.
    pub fn v1_hierarchy(&self, controller: &str) -> Option<&Path> {
        match self {
            Self::V1(roots) => roots
                .iter()
                .find(|r| {
                    r.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.split(',').any(|c| c == controller))
                })
                .map(PathBuf::as_path),
            Self::V2(_) => None,
        }
    }

    /// The directories `cgroup_path` (e.g. `/kubepods/burstable/pod<uid>`) maps to.
    pub fn dirs(&self, cgroup_path: &str) -> Vec<PathBuf> {
        let rel = cgroup_path.trim_start_matches('/');
        match self {
            Self::V2(root) => vec![root.join(rel)],
            Self::V1(roots) => roots.iter().map(|r| r.join(rel)).collect(),
        }
    }
}

/// A cgroup filesystem's mount, from one line of mountinfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMount<'a> {
    /// cgroup2 (else a v1 hierarchy).
    pub v2: bool,
    /// Super options: a v1 hierarchy's controllers (or `name=...`) among them.
    pub options: &'a str,
    /// The cgroup the mount shows at its mount point.
    pub root: &'a str,
    /// Where it is mounted.
    pub point: &'a str,
}

/// The cgroup and cgroup2 mounts in mountinfo text, in its order.
pub fn cgroup_mounts(text: &str) -> impl Iterator<Item = CgroupMount<'_>> {
    text.lines().filter_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let mut pre = pre.split(' ').skip(3);
        let (root, point) = (pre.next()?, pre.next()?);
        let mut post = post.split(' ');
        let v2 = match post.next()? {
            "cgroup" => false,
            "cgroup2" => true,
            _ => return None,
        };
        let options = post.nth(1).unwrap_or_default();
        Some(CgroupMount {
            v2,
            options,
            root,
            point,
        })
    })
}

/// Whether this host has the hugetlb controller (read once: controllers do not come and go).
pub fn host_has_hugetlb() -> bool {
    static HUGETLB: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HUGETLB.get_or_init(|| Layout::detect().is_ok_and(|l| l.has_controller("hugetlb")))
}

/// The hugepage limits to apply on a host with or without the hugetlb controller. Without it,
/// limits of 0 (the kubelet sends one per page size the kernel has, on every container) are
/// dropped, as runc does; a limit above 0 cannot be enforced and is refused, naming its index
/// (the error is the field name and the reason).
pub fn hugepage_limits_for_host(
    limits: &[k8s_cri::v1::HugepageLimit],
    hugetlb: bool,
) -> Result<Vec<k8s_cri::v1::HugepageLimit>, (String, String)> {
    if hugetlb {
        return Ok(limits.to_vec());
    }
    if let Some((i, h)) = limits.iter().enumerate().find(|(_, h)| h.limit > 0) {
        return Err((
            format!("hugepage_limits[{i}]"),
            format!(
                "a limit of {} bytes of {} pages needs the hugetlb cgroup controller, which this host does not have",
                h.limit, h.page_size
            ),
        ));
    }
    Ok(Vec::new())
}

/// Checks a cgroup path from a request: absolute-ish, no `..`.
pub fn validate_path(cgroup_path: &str) -> Result<(), String> {
    if cgroup_path
        .split('/')
        .any(|c| c == ".." || c == "." || c.contains('\0'))
    {
        return Err(format!(
            "cgroup path {cgroup_path:?} must not contain . or .."
        ));
    }
    Ok(())
}

/// Creates the missing directories of `cgroup_path` in every hierarchy; returns those it made
/// (deepest last), so they can be removed again.
pub fn ensure(layout: &Layout, cgroup_path: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut created = Vec::new();
    for dir in layout.dirs(cgroup_path) {
        let mut missing = Vec::new();
        let mut cur: &Path = &dir;
        while !cur.exists() {
            missing.push(cur.to_owned());
            match cur.parent() {
                Some(p) => cur = p,
                None => break,
            }
        }
        for d in missing.into_iter().rev() {
            match std::fs::create_dir(&d) {
                Ok(()) => {
                    inherit_cpuset(&d);
                    created.push(d)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    remove(&created);
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("creating cgroup {}: {e}", d.display()),
                    ));
                }
            }
        }
    }
    Ok(created)
}

/// A new cgroup v1 cpuset directory starts with empty `cpuset.cpus` and `cpuset.mems`, and
/// the kernel refuses any process into it (ENOSPC) until they are set: copy the parent's. A
/// cgroup v2 directory (it has `cgroup.controllers`) takes its parent's when its own are empty.
fn inherit_cpuset(dir: &Path) {
    if dir.join("cgroup.controllers").exists() {
        return;
    }
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        let Ok(current) = std::fs::read_to_string(&own) else {
            return; // not a v1 cpuset hierarchy
        };
        if !current.trim().is_empty() {
            continue;
        }
        let Some(parent) = dir.parent() else { return };
        match std::fs::read_to_string(parent.join(file)) {
            Ok(value) => {
                if let Err(e) = std::fs::write(&own, value.trim()) {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "setting {file}");
                }
            }
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "reading the parent's {file}")
            }
        }
    }
}

/// Makes a cgroup v2 `controller` available in `cgroup_path` by enabling it in the
/// `cgroup.subtree_control` of each ancestor, from the root down, where it is not yet: under the
/// systemd driver, for the controllers systemd does not manage (hugetlb), as runc does.
pub fn enable_in_ancestors(
    root: &Path,
    cgroup_path: &str,
    controller: &str,
) -> std::io::Result<()> {
    let mut dir = root.to_path_buf();
    let parts: Vec<&str> = cgroup_path.split('/').filter(|p| !p.is_empty()).collect();
    for part in parts
        .iter()
        .take(parts.len().saturating_sub(1))
        .copied()
        .chain([""])
    {
        let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control"))?;
        if !enabled.split_whitespace().any(|c| c == controller) {
            std::fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}")).map_err(
                |e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("enabling {controller} below {}: {e}", dir.display()),
                    )
                },
            )?;
        }
        if part.is_empty() {
            break;
        }
        dir.push(part);
    }
    Ok(())
}

/// Removes cgroup directories Berth created (deepest first); busy or absent ones are left.
pub fn remove(created: &[PathBuf]) {
    let mut dirs: Vec<&PathBuf> = created.iter().collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        match std::fs::remove_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Still used by another pod below it: that pod's removal takes it.
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                tracing::debug!(cgroup = %d.display(), "cgroup still in use: left")
            }
            Err(e) => tracing::warn!(cgroup = %d.display(), error = %e, "removing cgroup"),
        }
    }
}

/// Kills every process left in `cgroup_path` and removes its directories (a container cgroup
/// whose shim is gone). Absent is fine; a cgroup still busy after 1 s is logged and left.
pub fn kill_and_remove(layout: &Layout, cgroup_path: &str) {
    kill_all(layout, cgroup_path, true);
}

/// Kills every process in `cgroup_path` until none is left (at most 1 s), keeping the
/// directories: a systemd unit's cgroup, which systemd removes as it stops the unit.
pub fn kill_all_processes(layout: &Layout, cgroup_path: &str) {
    kill_all(layout, cgroup_path, false);
}

fn kill_all(layout: &Layout, cgroup_path: &str, remove_dirs: bool) {
    for dir in layout.dirs(cgroup_path) {
        for attempt in 0..100 {
            let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
                Ok(p) => p,
                Err(_) => break, // gone (or never made in this hierarchy)
            };
            let mut any = false;
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    any = true;
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            if !remove_dirs {
                if !any {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if attempt == 99 => {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "removing container cgroup")
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
28 25 0:25 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";
    const PURE_V2: &str = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";

    #[test]
    fn layouts_are_detected() {
        let l = Layout::from_mountinfo(HYBRID);
        assert_eq!(
            l,
            Layout::V1(vec![
                "/sys/fs/cgroup/cpu".into(),
                "/sys/fs/cgroup/memory".into()
            ])
        );
        assert_eq!(
            l.dirs("/kubepods/pod1"),
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu/kubepods/pod1"),
                PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1")
            ]
        );
        let l = Layout::from_mountinfo(PURE_V2);
        assert!(l.is_v2());
        assert_eq!(l.dirs("a/b"), vec![PathBuf::from("/sys/fs/cgroup/a/b")]);
    }

    #[test]
    fn controllers_are_found_by_hierarchy_name() {
        let l = Layout::V1(vec![
            "/sys/fs/cgroup/cpu,cpuacct".into(),
            "/sys/fs/cgroup/memory".into(),
        ]);
        assert!(l.has_controller("cpuacct") && l.has_controller("memory"));
        assert!(!l.has_controller("hugetlb") && !l.has_controller("cpu,cpuacct"));
        let dir = std::env::temp_dir().join(format!("berth-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(
            dir.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("write");
        let l = Layout::V2(dir.clone());
        assert!(l.has_controller("memory") && !l.has_controller("hugetlb"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn hugepage_limits_without_hugetlb() {
        let hp = |page: &str, limit| k8s_cri::v1::HugepageLimit {
            page_size: page.into(),
            limit,
        };
        let zeros = vec![hp("2MB", 0), hp("1GB", 0)];
        assert_eq!(hugepage_limits_for_host(&zeros, false), Ok(vec![]));
        assert_eq!(hugepage_limits_for_host(&zeros, true), Ok(zeros.clone()));
        let (field, why) = hugepage_limits_for_host(&[hp("2MB", 0), hp("1GB", 1 << 30)], false)
            .expect_err("a limit above 0 without hugetlb");
        assert_eq!(field, "hugepage_limits[1]");
        assert!(why.contains("1GB") && why.contains("hugetlb"), "{why}");
    }

    #[test]
    fn a_controller_is_enabled_from_the_root_down_to_the_parent() {
        let root = std::env::temp_dir().join(format!("berth-cg-enable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let scope = root.join("a.slice/a-b.slice/x.scope");
        std::fs::create_dir_all(&scope).expect("mkdir");
        for d in [
            root.clone(),
            root.join("a.slice"),
            root.join("a.slice/a-b.slice"),
            scope.clone(),
        ] {
            std::fs::write(d.join("cgroup.subtree_control"), "cpu memory\n").expect("write");
        }
        // Already enabled at the root: left as it is.
        std::fs::write(root.join("cgroup.subtree_control"), "cpu hugetlb\n").expect("write");
        enable_in_ancestors(&root, "/a.slice/a-b.slice/x.scope", "hugetlb").expect("enable");
        let read =
            |d: &Path| std::fs::read_to_string(d.join("cgroup.subtree_control")).expect("read");
        assert_eq!(read(&root), "cpu hugetlb\n");
        assert_eq!(read(&root.join("a.slice")), "+hugetlb");
        assert_eq!(read(&root.join("a.slice/a-b.slice")), "+hugetlb");
        assert_eq!(read(&scope), "cpu memory\n", "not in the leaf itself");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn dotdot_paths_are_refused() {
        assert!(validate_path("/kubepods/../../etc").is_err());
        assert!(validate_path("/kubepods/burstable/pod1").is_ok());
    }

    #[test]
    fn ensure_creates_only_whats_missing_and_remove_undoes_it() {
        let root = std::env::temp_dir().join(format!("berth-cg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("a/kubepods")).expect("mkdir");
        std::fs::create_dir_all(root.join("b")).expect("mkdir");
        let layout = Layout::V1(vec![root.join("a"), root.join("b")]);
        let created = ensure(&layout, "/kubepods/pod1").expect("ensure");
        assert_eq!(
            created,
            vec![
                root.join("a/kubepods/pod1"),
                root.join("b/kubepods"),
                root.join("b/kubepods/pod1")
            ]
        );
        remove(&created);
        assert!(root.join("a/kubepods").exists(), "pre-existing dirs stay");
        assert!(!root.join("b/kubepods").exists());
        let _ = std::fs::remove_dir_all(root);
    }
}
