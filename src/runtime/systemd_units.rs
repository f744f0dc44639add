//! Units of the systemd cgroup driver made and changed by berthd itself through systemd's D-Bus
//! API (libcgroups' systemd manager, and Berth's D-Bus client for the properties it does not
//! set): the pod init's scope in the pod's slice, resource updates of container scopes, and the
//! stop of pod slices Berth started. Blocking: call from
//! `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use libcgroups::common::{CgroupManager, ControllerOpt};
use libcgroups::systemd::manager::Manager;
use oci_spec::runtime::LinuxResources;

use super::cgroup_driver::{self, POD_INIT_SCOPE_PREFIX};
use crate::dbus::{Connection, Value, system_bus_address};

/// How long a process may take to show up in the scope systemd made for it.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times (20 ms apart) a unit's cgroup is looked at while its empty scopes go away.
const SETTLE_POLLS: u32 = 100;

/// A manager of the unit that `cgroups_path` (`<slice>:<prefix>:<name>`) names.
fn manager(root: &Path, cgroups_path: &str, what: &str) -> Result<Manager, String> {
    Manager::new(
        root.to_path_buf(),
        PathBuf::from(cgroups_path),
        what.to_string(),
        true,
        JOIN_TIMEOUT,
    )
    .map_err(|e| format!("systemd, for {cgroups_path}: {e}"))
}

/// Moves the init of sandbox `sandbox_id` (process `pid`) into the scope
/// `berth-pod-init-<id>.scope` of the pod's slice (the last component of `pod_cgroup`),
/// which systemd starts, with the slice and its parents, for it. Returns the scope's cgroup path.
pub fn start_pod_init_scope(
    root: &Path,
    pod_cgroup: &str,
    sandbox_id: &str,
    pid: i32,
) -> Result<String, String> {
    let slice = cgroup_driver::unit_of(pod_cgroup)
        .filter(|u| u.ends_with(".slice"))
        .ok_or_else(|| format!("pod cgroup {pod_cgroup} is not a slice"))?;
    let path = format!("{slice}:{POD_INIT_SCOPE_PREFIX}:{sandbox_id}");
    let m = manager(root, &path, &format!("pod {sandbox_id}"))?;
    m.add_task(nix::unistd::Pid::from_raw(pid))
        .map_err(|e| format!("starting the scope of pod {sandbox_id}'s init: {e}"))?;
    cgroup_driver::cgroups_path_to_dir(&path)
        .ok_or_else(|| format!("the scope of pod {sandbox_id}'s init has no cgroup path"))
}

/// Sets `resources` on the container scope of `cgroups_path` as unit properties (runtime
/// ones, which systemd keeps across `daemon-reload`).
pub fn set_resources(
    root: &Path,
    cgroups_path: &str,
    resources: &LinuxResources,
) -> Result<(), String> {
    let m = manager(root, cgroups_path, cgroups_path)?;
    m.apply(&ControllerOpt {
        resources,
        disable_oom_killer: false,
        oom_score_adj: None,
        freezer_state: None,
    })
    .map_err(|e| format!("setting the properties of {cgroups_path}: {e}"))?;
    set_unified_properties(cgroups_path, resources)
}

/// Sets the unit properties of `resources`' `unified` keys that libcontainer's systemd manager
/// leaves to the files, on the scope of `cgroups_path`: `memory.swap.max` as `MemorySwapMax`
/// where no memory limit carries it (with one, it is part of the OCI memory+swap bound).
pub fn set_unified_properties(
    cgroups_path: &str,
    resources: &LinuxResources,
) -> Result<(), String> {
    let props = unified_properties(resources);
    if props.is_empty() {
        return Ok(());
    }
    let unit = cgroup_driver::cgroups_path_to_dir(cgroups_path)
        .and_then(|d| cgroup_driver::unit_of(&d).map(str::to_string))
        .ok_or_else(|| format!("{cgroups_path} names no unit"))?;
    let mut bus = Connection::open(&system_bus_address()).map_err(|e| e.to_string())?;
    bus.call(
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "SetUnitProperties",
        &[
            Value::Str(unit.clone()),
            Value::Bool(true),
            Value::Properties(props),
        ],
    )
    .map_err(|e| format!("setting the properties of {unit}: {e}"))?;
    Ok(())
}

/// The properties [`set_unified_properties`] sets.
fn unified_properties(resources: &LinuxResources) -> Vec<(String, Value)> {
    let limited = resources
        .memory()
        .as_ref()
        .and_then(|m| m.limit())
        .is_some_and(|l| l > 0);
    let swap_max = resources
        .unified()
        .as_ref()
        .and_then(|u| u.get("memory.swap.max"))
        .and_then(|v| match v.trim() {
            "max" => Some(u64::MAX),
            n => n.parse().ok(),
        });
    match swap_max {
        Some(v) if !limited => vec![("MemorySwapMax".to_string(), Value::U64(v))],
        _ => Vec::new(),
    }
}

/// Stops the unit whose cgroup is `dir` (a slice Berth started, or a scope), if systemd has
/// it and nothing runs in it: no process, no cgroup below. An empty cgroup is a unit no one
/// uses; one in use stays (stopping a slice would stop everything below it).
pub fn stop_if_unused(root: &Path, dir: &str) {
    let Some(unit) = cgroup_driver::unit_of(dir) else {
        return;
    };
    let full = root.join(dir.trim_start_matches('/'));
    if !full.exists() {
        // An active slice or scope always has its cgroup: this one is stopped already.
        return;
    }
    // The scopes of processes just killed go away as systemd sees them empty: wait for those.
    let mut polls = 0;
    loop {
        match occupancy(&full) {
            Occupancy::Empty => break,
            Occupancy::Emptying if polls < SETTLE_POLLS => {
                polls += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                tracing::debug!(unit, "unit still in use: left");
                return;
            }
        }
    }
    // libcgroups names the unit by the path's last part: a slice as is, else
    // `<prefix>-<name>.scope`.
    let (prefix, name) = match unit.strip_suffix(".scope") {
        Some(scope) => match scope.split_once('-') {
            Some(parts) => parts,
            None => return,
        },
        None => (POD_INIT_SCOPE_PREFIX, unit),
    };
    let stopped = manager(root, &format!("-.slice:{prefix}:{name}"), unit)
        .and_then(|m| m.remove().map_err(|e| e.to_string()));
    match stopped {
        Ok(()) => tracing::debug!(unit, "unit stopped"),
        Err(e) => tracing::warn!(unit, error = %e, "stopping unit"),
    }
}

/// What a unit's cgroup holds.
enum Occupancy {
    /// No process, no cgroup below (or no cgroup at all).
    Empty,
    /// No process; below it only scopes without processes, which systemd is removing.
    Emptying,
    /// Processes, or cgroups below with processes or of their own below.
    Busy,
}

/// What runs in the cgroup at `dir`.
fn occupancy(dir: &Path) -> Occupancy {
    let empty = |d: &Path| {
        std::fs::read_to_string(d.join("cgroup.procs"))
            .map(|p| p.trim().is_empty())
            .unwrap_or(true)
    };
    if !empty(dir) {
        return Occupancy::Busy;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Occupancy::Empty;
    };
    let children: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    if children.is_empty() {
        Occupancy::Empty
    } else if children
        .iter()
        .all(|c| c.extension().is_some_and(|e| e == "scope") && empty(c))
    {
        Occupancy::Emptying
    } else {
        Occupancy::Busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MemorySwapMax from a `unified` memory.swap.max only where no memory limit carries it.
    #[test]
    fn swap_max_becomes_a_property_without_a_memory_limit() {
        let res = |limit: Option<i64>, swap_max: &str| -> LinuxResources {
            let mut r = LinuxResources::default();
            r.set_unified(Some(
                [("memory.swap.max".to_string(), swap_max.to_string())].into(),
            ));
            if let Some(l) = limit {
                let mut m = oci_spec::runtime::LinuxMemory::default();
                m.set_limit(Some(l));
                r.set_memory(Some(m));
            }
            r
        };
        assert_eq!(
            unified_properties(&res(None, "0")),
            [("MemorySwapMax".to_string(), Value::U64(0))]
        );
        assert_eq!(
            unified_properties(&res(None, "max")),
            [("MemorySwapMax".to_string(), Value::U64(u64::MAX))]
        );
        assert!(unified_properties(&res(Some(1 << 26), "0")).is_empty());
        assert!(unified_properties(&res(None, "lots")).is_empty());
        assert!(unified_properties(&LinuxResources::default()).is_empty());
    }

    #[test]
    fn a_units_cgroup_is_empty_emptying_or_busy_by_what_it_holds() {
        let dir = std::env::temp_dir().join(format!("berth-units-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("cgroup.procs"), "").expect("procs");
        assert!(matches!(occupancy(&dir), Occupancy::Empty));
        assert!(matches!(occupancy(&dir.join("absent")), Occupancy::Empty));
        // An empty scope below: systemd is taking it away.
        let scope = dir.join("berth-pod-init-1.scope");
        std::fs::create_dir(&scope).expect("scope");
        std::fs::write(scope.join("cgroup.procs"), "").expect("procs");
        assert!(matches!(occupancy(&dir), Occupancy::Emptying));
        // A process in it, or a slice below: in use.
        std::fs::write(scope.join("cgroup.procs"), "42\n").expect("procs");
        assert!(matches!(occupancy(&dir), Occupancy::Busy));
        std::fs::write(scope.join("cgroup.procs"), "").expect("procs");
        std::fs::create_dir(dir.join("x-pod1.slice")).expect("slice");
        assert!(matches!(occupancy(&dir), Occupancy::Busy));
        std::fs::remove_dir(dir.join("x-pod1.slice")).expect("rm");
        std::fs::write(dir.join("cgroup.procs"), "7\n").expect("procs");
        assert!(matches!(occupancy(&dir), Occupancy::Busy));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
