//! The cgroup driver: cgroupfs (Berth makes the directories) or systemd (pod slices and one
//! scope per container, made through systemd's D-Bus API), and the names each gives cgroups.

use std::sync::OnceLock;

use k8s_cri::v1 as cri;
use serde::{Deserialize, Serialize};

use super::cgroups::Layout;

/// The driver the configuration asks for.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DriverChoice {
    /// systemd where systemd is PID 1 on a pure cgroup v2 hierarchy, else cgroupfs.
    #[default]
    Auto,
    /// Pod slices and container scopes made through systemd (pure cgroup v2 only).
    Systemd,
    /// cgroup directories made by Berth itself.
    Cgroupfs,
}

/// How Berth makes and names cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// cgroup directories made by Berth; CRI cgroup parents are paths (`/kubepods/pod<uid>`).
    Cgroupfs,
    /// Units made by systemd; CRI cgroup parents are slice names (`kubepods-pod<uid>.slice`).
    Systemd,
}

/// Where systemd, booted as PID 1, keeps its runtime directory.
const SYSTEMD_RUN_DIR: &str = "/run/systemd/system";

/// The unit-name prefix of container scopes (`berth-<id>.scope`).
pub const SCOPE_PREFIX: &str = "berth";

/// The unit-name prefix of pod init scopes (`berth-pod-init-<sandbox id>.scope`).
pub const POD_INIT_SCOPE_PREFIX: &str = "berth-pod-init";

impl CgroupDriver {
    /// The driver for `choice` on this host: systemd needs systemd as PID 1 and pure cgroup v2
    /// (the cgroup manager it goes through writes v2 files only).
    pub fn resolve(choice: DriverChoice, layout: &Layout) -> Result<Self, String> {
        let booted = std::path::Path::new(SYSTEMD_RUN_DIR).is_dir();
        match choice {
            DriverChoice::Cgroupfs => Ok(Self::Cgroupfs),
            DriverChoice::Auto if booted && layout.is_v2() => Ok(Self::Systemd),
            DriverChoice::Auto => Ok(Self::Cgroupfs),
            DriverChoice::Systemd if !booted => Err(
                "runtime.cgroup_driver is systemd but systemd is not this host's init".to_string(),
            ),
            DriverChoice::Systemd if !layout.is_v2() => Err(
                "runtime.cgroup_driver is systemd, which Berth drives on a pure cgroup v2 hierarchy only; this host mounts cgroup v1"
                    .to_string(),
            ),
            DriverChoice::Systemd => Ok(Self::Systemd),
        }
    }

    /// The driver as RuntimeConfig reports it.
    pub fn cri(self) -> cri::CgroupDriver {
        match self {
            Self::Cgroupfs => cri::CgroupDriver::Cgroupfs,
            Self::Systemd => cri::CgroupDriver::Systemd,
        }
    }

    /// The name the configuration and `crictl info` give it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }

    /// The cgroup path (from the hierarchy's root) of the pod whose CRI cgroup parent is
    /// `parent`; empty stays empty (no pod cgroup). The error says why `parent` does not fit.
    pub fn pod_cgroup(self, parent: &str) -> Result<String, String> {
        if parent.is_empty() {
            return Ok(String::new());
        }
        match self {
            Self::Cgroupfs if names_a_slice(parent) => Err(format!(
                "cgroup parent {parent:?} is a systemd slice name, but berthd uses the cgroupfs driver: give a cgroup path, or set runtime.cgroup_driver = \"systemd\" (the kubelet's cgroupDriver must match berthd's)"
            )),
            Self::Cgroupfs => {
                super::cgroups::validate_path(parent)?;
                Ok(parent.to_string())
            }
            Self::Systemd => {
                let refuse = |why: String| {
                    format!(
                        "cgroup parent {parent:?}: berthd uses the systemd cgroup driver, which takes a slice (kubepods-burstable-pod1.slice, or its path /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice) ({why}; the kubelet's cgroupDriver must match berthd's)"
                    )
                };
                // The kubelet sends the slice's path; other clients its name.
                let name = parent
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or(parent);
                let path = expand_slice(name).map_err(refuse)?;
                if parent.contains('/') && path != format!("/{}", parent.trim_matches('/')) {
                    return Err(refuse(format!("the slice {name} is at {path}")));
                }
                Ok(path)
            }
        }
    }

    /// The OCI `linux.cgroupsPath` of container `id` in the pod cgroup `pod_cgroup` (a path
    /// from [`Self::pod_cgroup`]): `<pod>/berth-<id>` for cgroupfs, `<slice>:berth:<id>`
    /// (the scope `berth-<id>.scope` in the pod's slice) for systemd.
    pub fn container_cgroups_path(self, pod_cgroup: &str, id: &str) -> String {
        match self {
            Self::Cgroupfs => {
                let parent = pod_cgroup.trim_matches('/');
                if parent.is_empty() {
                    format!("/{SCOPE_PREFIX}-{id}")
                } else {
                    format!("/{parent}/{SCOPE_PREFIX}-{id}")
                }
            }
            Self::Systemd => {
                let slice = pod_cgroup
                    .rsplit('/')
                    .find(|c| !c.is_empty())
                    .unwrap_or("system.slice");
                format!("{slice}:{SCOPE_PREFIX}:{id}")
            }
        }
    }
}

/// The driver berthd runs with (cgroupfs until [`set`] is called).
pub fn current() -> CgroupDriver {
    DRIVER.get().copied().unwrap_or(CgroupDriver::Cgroupfs)
}

/// Sets the driver for this process, once, at start.
pub fn set(driver: CgroupDriver) {
    if DRIVER.set(driver).is_err() && current() != driver {
        tracing::warn!(
            driver = driver.name(),
            kept = current().name(),
            "the cgroup driver was already chosen"
        );
    }
}

static DRIVER: OnceLock<CgroupDriver> = OnceLock::new();

/// Whether `parent` names a systemd slice: its name, or a path ending in one.
pub fn names_a_slice(parent: &str) -> bool {
    parent
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .is_some_and(|last| last.ends_with(".slice"))
}

/// The cgroup path of the slice `name`: systemd nests slices by their dashes, so
/// `kubepods-burstable-pod1.slice` is
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice`; `-.slice` is the
/// root.
pub fn expand_slice(name: &str) -> Result<String, String> {
    let Some(base) = name.strip_suffix(".slice") else {
        return Err("a slice name ends in .slice".into());
    };
    if name.contains('/') {
        return Err("a slice name has no '/'".into());
    }
    if base == "-" {
        return Ok("/".into());
    }
    if base.is_empty() || base.split('-').any(str::is_empty) {
        return Err("a slice name has no empty part between dashes".into());
    }
    if !base
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:\\".contains(&b))
    {
        return Err("a unit name has letters, digits and -_.:\\ only".into());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in base.split('-') {
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
        prefix.push('-');
    }
    Ok(path)
}

/// Whether an OCI `linux.cgroupsPath` is the systemd driver's `<slice>:<prefix>:<name>`.
pub fn names_a_scope(cgroups_path: &str) -> bool {
    !cgroups_path.starts_with('/') && cgroups_path.contains(':')
}

/// The cgroup path of an OCI `linux.cgroupsPath` in either driver's form: a path as is,
/// `<slice>:<prefix>:<name>` as the path of the scope `<prefix>-<name>.scope` in that slice.
pub fn cgroups_path_to_dir(cgroups_path: &str) -> Option<String> {
    if !names_a_scope(cgroups_path) {
        return Some(cgroups_path.to_string());
    }
    let mut parts = cgroups_path.splitn(3, ':');
    let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let base = expand_slice(slice).ok()?;
    Some(format!(
        "{}/{prefix}-{name}.scope",
        base.trim_end_matches('/')
    ))
}

/// The unit name of the cgroup at `dir` (its last component: `x.slice`, `y.scope`).
pub fn unit_of(dir: &str) -> Option<&str> {
    dir.rsplit('/')
        .find(|c| !c.is_empty())
        .filter(|c| c.ends_with(".slice") || c.ends_with(".scope"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_expand_by_their_dashes() {
        assert_eq!(
            expand_slice("kubepods-burstable-pod1_2.slice").as_deref(),
            Ok("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice")
        );
        assert_eq!(expand_slice("system.slice").as_deref(), Ok("/system.slice"));
        assert_eq!(expand_slice("-.slice").as_deref(), Ok("/"));
        for bad in [
            "kubepods",
            ".slice",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "/kubepods.slice",
            "a b.slice",
        ] {
            assert!(expand_slice(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pod_cgroups_follow_the_driver() {
        let fs = CgroupDriver::Cgroupfs;
        let sd = CgroupDriver::Systemd;
        assert_eq!(
            fs.pod_cgroup("/kubepods/pod1").as_deref(),
            Ok("/kubepods/pod1")
        );
        assert_eq!(fs.pod_cgroup("").as_deref(), Ok(""));
        let err = fs
            .pod_cgroup("kubepods-pod1.slice")
            .expect_err("a slice under cgroupfs");
        assert!(
            err.contains("cgroupfs") && err.contains("kubepods-pod1.slice"),
            "{err}"
        );
        assert!(fs.pod_cgroup("/kubepods/../etc").is_err());
        let err = fs
            .pod_cgroup("/kubepods.slice/kubepods-pod1.slice")
            .expect_err("a slice's path under cgroupfs");
        assert!(err.contains("cgroupfs"), "{err}");
        // The kubelet 1.20 with cgroupDriver: systemd sends the slice's path.
        assert_eq!(
            sd.pod_cgroup(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice"
            )
            .as_deref(),
            Ok("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice")
        );
        let err = sd
            .pod_cgroup("/elsewhere/kubepods-podx.slice")
            .expect_err("a slice where systemd would not put it");
        assert!(err.contains("/kubepods.slice/kubepods-podx.slice"), "{err}");
        assert_eq!(
            sd.pod_cgroup("kubepods-besteffort-podx.slice").as_deref(),
            Ok("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice")
        );
        let err = sd
            .pod_cgroup("/kubepods/pod1")
            .expect_err("a path under systemd");
        assert!(
            err.contains("systemd") && err.contains("/kubepods/pod1"),
            "{err}"
        );
    }

    #[test]
    fn container_paths_round_trip_to_their_directories() {
        let pod = "/kubepods.slice/kubepods-pod1.slice";
        let sd = CgroupDriver::Systemd.container_cgroups_path(pod, "abc");
        assert_eq!(sd, "kubepods-pod1.slice:berth:abc");
        assert_eq!(
            cgroups_path_to_dir(&sd).as_deref(),
            Some("/kubepods.slice/kubepods-pod1.slice/berth-abc.scope")
        );
        assert_eq!(
            CgroupDriver::Systemd.container_cgroups_path("", "abc"),
            "system.slice:berth:abc"
        );
        let fs = CgroupDriver::Cgroupfs.container_cgroups_path("/kubepods/pod1/", "abc");
        assert_eq!(fs, "/kubepods/pod1/berth-abc");
        assert_eq!(
            CgroupDriver::Cgroupfs.container_cgroups_path("kubepods", "x"),
            "/kubepods/berth-x"
        );
        assert_eq!(
            CgroupDriver::Cgroupfs.container_cgroups_path("", "x"),
            "/berth-x"
        );
        assert_eq!(cgroups_path_to_dir(&fs).as_deref(), Some(fs.as_str()));
        assert_eq!(
            cgroups_path_to_dir(":berth:x").as_deref(),
            Some("/system.slice/berth-x.scope")
        );
        assert_eq!(unit_of("/a.slice/berth-x.scope/"), Some("berth-x.scope"));
        assert_eq!(unit_of("/kubepods/pod1"), None);
    }
}
