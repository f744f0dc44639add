//! UpdateContainerResources: checks new limits, writes them live to the container's cgroup,
//! and records them in the container's config and its OCI bundle.
//!
//! As in the CRI's other runtimes, a zero (or empty) field leaves that limit as it is.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use prost::Message;

use super::cgroups::Layout;
use super::container::{ContainerError, ContainerManager, ContainerState};
use super::container_create::CreateError;
use crate::metrics::cgroup_stats::controller_dir;

/// Why an update was refused.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The request asks for something impossible.
    #[error("UpdateContainerResources: invalid {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// The container (or the kernel) cannot take the update now.
    #[error("UpdateContainerResources: {0}")]
    FailedPrecondition(String),
    /// Host trouble.
    #[error("UpdateContainerResources: {0}")]
    Internal(String),
}

impl UpdateError {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<UpdateError> for ContainerError {
    fn from(e: UpdateError) -> Self {
        let msg = e.to_string();
        match e {
            UpdateError::InvalidArgument { .. } => CreateError::InvalidArgument(msg).into(),
            UpdateError::FailedPrecondition(_) => ContainerError::FailedPrecondition(msg),
            UpdateError::Internal(_) => ContainerError::Internal(msg),
        }
    }
}

/// Checks values no kernel would take (the kernel still has the last word when writing).
pub fn validate(r: &cri::LinuxContainerResources) -> Result<(), UpdateError> {
    if r.cpu_shares < 0 {
        return Err(UpdateError::invalid(
            "cpu_shares",
            format!("{} is negative", r.cpu_shares),
        ));
    }
    if r.cpu_period != 0 && !(1_000..=1_000_000).contains(&r.cpu_period) {
        return Err(UpdateError::invalid(
            "cpu_period",
            format!("{} is outside [1000, 1000000] µs", r.cpu_period),
        ));
    }
    if r.cpu_quota != 0 && r.cpu_quota != -1 && r.cpu_quota < 1_000 {
        return Err(UpdateError::invalid(
            "cpu_quota",
            format!("{} is below 1000 µs (and not -1)", r.cpu_quota),
        ));
    }
    if r.memory_limit_in_bytes < 0 {
        return Err(UpdateError::invalid(
            "memory_limit_in_bytes",
            format!("{} is negative", r.memory_limit_in_bytes),
        ));
    }
    match r.memory_swap_limit_in_bytes {
        0 | -1 => {}
        s if s < 0 => {
            return Err(UpdateError::invalid(
                "memory_swap_limit_in_bytes",
                format!("{s} is negative (and not -1)"),
            ));
        }
        s if r.memory_limit_in_bytes > 0 && s < r.memory_limit_in_bytes => {
            return Err(UpdateError::invalid(
                "memory_swap_limit_in_bytes",
                format!(
                    "{s} is below memory_limit_in_bytes {} (it counts memory plus swap)",
                    r.memory_limit_in_bytes
                ),
            ));
        }
        _ => {}
    }
    for (field, value) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        if !value
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == '-')
        {
            return Err(UpdateError::invalid(
                field,
                format!("{value:?} is not a CPU/node list"),
            ));
        }
    }
    for (i, h) in r.hugepage_limits.iter().enumerate() {
        if h.page_size.is_empty() || !h.page_size.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(UpdateError::invalid(
                format!("hugepage_limits[{i}].page_size"),
                format!("{:?} is not a page size such as 2MB", h.page_size),
            ));
        }
    }
    check_unified(&r.unified)
        .map_err(|e| UpdateError::invalid(format!("unified[{:?}]", e.key), e.reason))?;
    Ok(())
}

/// A `linux.resources.unified` entry Berth will not write.
#[derive(Debug, thiserror::Error)]
#[error("invalid unified[{key:?}]: {reason}")]
pub struct UnifiedKeyError {
    pub key: String,
    pub reason: &'static str,
}

/// cgroup core files that move processes, kill them or reshape the tree: not resources.
const UNIFIED_REFUSED: &[&str] = &[
    "cgroup.procs",
    "cgroup.threads",
    "cgroup.subtree_control",
    "cgroup.type",
    "cgroup.kill",
];

/// The OCI memory+swap bound that a `unified` `memory.swap.max` amounts to beside the memory
/// limit `limit` (the limit plus the swap, or -1 for `max`), for a container with a limit and
/// no memory+swap bound of its own. systemd keeps a limit only as a unit property, and
/// libcontainer's systemd manager makes `MemorySwapMax` from this bound alone: a `unified`
/// key it has no property for would be undone by the next daemon-reload.
pub fn swap_bound_from_unified(
    limit: i64,
    swap_bound: i64,
    unified: &std::collections::HashMap<String, String>,
) -> Option<i64> {
    if limit <= 0 || swap_bound != 0 {
        return None;
    }
    match unified.get("memory.swap.max")?.trim() {
        "max" => Some(-1),
        v => limit.checked_add(v.parse::<i64>().ok().filter(|n| *n >= 0)?),
    }
}

/// Checks the keys and values of `linux.resources.unified`, for CreateContainer and
/// UpdateContainerResources alike: each key is joined to the container's cgroup directory and
/// written, so it must name one interface file there (`<controller>.<name>`: ASCII letters,
/// digits, `.`, `_` and `-`, no `/`, not starting with `.`), never a path out of it.
pub fn check_unified(
    unified: &std::collections::HashMap<String, String>,
) -> Result<(), UnifiedKeyError> {
    let mut keys: Vec<&String> = unified.keys().collect();
    keys.sort();
    for key in keys {
        let refuse = |reason| {
            Err(UnifiedKeyError {
                key: key.clone(),
                reason,
            })
        };
        if key.is_empty()
            || key.len() > 255
            || key.starts_with('.')
            || !key.contains('.')
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return refuse("not a cgroup interface file name");
        }
        if UNIFIED_REFUSED.contains(&key.as_str()) {
            return refuse("moves or kills processes, not a resource limit");
        }
        if unified[key].contains('\0') {
            return refuse("the value contains a NUL byte");
        }
    }
    Ok(())
}

/// `old` with every field `new` sets (non-zero, non-empty) replaced.
pub fn merge(
    old: &cri::LinuxContainerResources,
    new: &cri::LinuxContainerResources,
) -> cri::LinuxContainerResources {
    let mut out = old.clone();
    let pick = |o: &mut i64, n: i64| {
        if n != 0 {
            *o = n;
        }
    };
    pick(&mut out.cpu_period, new.cpu_period);
    pick(&mut out.cpu_quota, new.cpu_quota);
    pick(&mut out.cpu_shares, new.cpu_shares);
    pick(&mut out.memory_limit_in_bytes, new.memory_limit_in_bytes);
    pick(
        &mut out.memory_swap_limit_in_bytes,
        new.memory_swap_limit_in_bytes,
    );
    if !new.cpuset_cpus.is_empty() {
        out.cpuset_cpus = new.cpuset_cpus.clone();
    }
    if !new.cpuset_mems.is_empty() {
        out.cpuset_mems = new.cpuset_mems.clone();
    }
    for h in &new.hugepage_limits {
        match out
            .hugepage_limits
            .iter_mut()
            .find(|o| o.page_size == h.page_size)
        {
            Some(o) => o.limit = h.limit,
            None => out.hugepage_limits.push(h.clone()),
        }
    }
    out.unified
        .extend(new.unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// One cgroup file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupWrite {
    pub path: PathBuf,
    pub value: String,
}

fn write_to(dir: &Path, file: &str, value: impl ToString) -> CgroupWrite {
    CgroupWrite {
        path: dir.join(file),
        value: value.to_string(),
    }
}

/// cgroup v2 `cpu.weight` for v1 `cpu.shares` ([2, 262144] onto [1, 10000]).
pub fn shares_to_weight(shares: i64) -> u64 {
    let s = shares.clamp(2, 262_144) as u64;
    1 + ((s - 2) * 9_999) / 262_142
}

/// The files to write for `r` in the cgroup `cgroup_path`, in order. `current` reads a file
/// of that cgroup (to keep the half of `cpu.max` a request leaves alone, and to see which
/// optional files exist); `merged` is the container's resources after the update.
pub fn plan(
    layout: &Layout,
    cgroup_path: &str,
    r: &cri::LinuxContainerResources,
    merged: &cri::LinuxContainerResources,
    current: &dyn Fn(&Path) -> Option<String>,
) -> Result<Vec<CgroupWrite>, UpdateError> {
    let mut out = Vec::new();
    let hugepages = super::cgroups::hugepage_limits_for_host(
        &r.hugepage_limits,
        layout.has_controller_with("hugetlb", current),
    )
    .map_err(|(field, why)| UpdateError::invalid(field, why))?;
    match layout {
        Layout::V1(_) => {
            let dir = |c: &str| {
                controller_dir(layout, c, cgroup_path).ok_or_else(|| {
                    UpdateError::FailedPrecondition(format!(
                        "this host has no cgroup v1 {c} hierarchy"
                    ))
                })
            };
            if r.cpu_shares > 0 || r.cpu_period != 0 || r.cpu_quota != 0 {
                let cpu = dir("cpu")?;
                if r.cpu_shares > 0 {
                    out.push(write_to(&cpu, "cpu.shares", r.cpu_shares));
                }
                if r.cpu_period != 0 {
                    out.push(write_to(&cpu, "cpu.cfs_period_us", r.cpu_period));
                }
                if r.cpu_quota != 0 {
                    out.push(write_to(&cpu, "cpu.cfs_quota_us", r.cpu_quota));
                }
            }
            if !r.cpuset_cpus.is_empty() || !r.cpuset_mems.is_empty() {
                let cpuset = dir("cpuset")?;
                if !r.cpuset_cpus.is_empty() {
                    out.push(write_to(&cpuset, "cpuset.cpus", &r.cpuset_cpus));
                }
                if !r.cpuset_mems.is_empty() {
                    out.push(write_to(&cpuset, "cpuset.mems", &r.cpuset_mems));
                }
            }
            if r.memory_limit_in_bytes > 0 || r.memory_swap_limit_in_bytes != 0 {
                let mem = dir("memory")?;
                let memsw = mem.join("memory.memsw.limit_in_bytes");
                let has_memsw = current(&memsw).is_some();
                let limit = (r.memory_limit_in_bytes > 0)
                    .then(|| write_to(&mem, "memory.limit_in_bytes", r.memory_limit_in_bytes));
                let swap = (r.memory_swap_limit_in_bytes != 0 && has_memsw).then(|| {
                    write_to(
                        &mem,
                        "memory.memsw.limit_in_bytes",
                        r.memory_swap_limit_in_bytes,
                    )
                });
                // memory.limit must stay at or below memsw: raise memsw first when growing.
                let growing = current(&mem.join("memory.limit_in_bytes"))
                    .and_then(|t| t.trim().parse::<i64>().ok())
                    .is_some_and(|cur| r.memory_limit_in_bytes > cur);
                if growing || r.memory_swap_limit_in_bytes == -1 {
                    out.extend(swap.into_iter().chain(limit));
                } else {
                    out.extend(limit.into_iter().chain(swap));
                }
            }
            if !hugepages.is_empty() {
                let hugetlb = dir("hugetlb")?;
                for h in &hugepages {
                    out.push(write_to(
                        &hugetlb,
                        &format!("hugetlb.{}.limit_in_bytes", h.page_size),
                        h.limit,
                    ));
                }
            }
            let mut keys: Vec<&String> = r.unified.keys().collect();
            keys.sort();
            for key in keys {
                // cgroup v1 has no unified hierarchy: a key goes to its controller's hierarchy
                // when that file exists there (e.g. pids.max).
                let controller = key.split('.').next().unwrap_or_default();
                let path = controller_dir(layout, controller, cgroup_path)
                    .map(|d| d.join(key))
                    .filter(|p| current(p).is_some())
                    .ok_or_else(|| {
                        UpdateError::invalid(
                            format!("unified[{key:?}]"),
                            "this host runs cgroup v1, which has no such file",
                        )
                    })?;
                out.push(CgroupWrite {
                    path,
                    value: r.unified[key].clone(),
                });
            }
        }
        Layout::V2(_) => {
            let dir = controller_dir(layout, "", cgroup_path)
                .ok_or_else(|| UpdateError::Internal("no cgroup v2 mount".into()))?;
            if r.cpu_shares > 0 {
                out.push(write_to(&dir, "cpu.weight", shares_to_weight(r.cpu_shares)));
            }
            if r.cpu_quota != 0 || r.cpu_period != 0 {
                let cur = current(&dir.join("cpu.max")).unwrap_or_default();
                let mut parts = cur.split_whitespace();
                let (cur_quota, cur_period) = (
                    parts.next().unwrap_or("max").to_string(),
                    parts.next().unwrap_or("100000").to_string(),
                );
                let quota = match r.cpu_quota {
                    0 => cur_quota,
                    -1 => "max".to_string(),
                    q => q.to_string(),
                };
                let period = match r.cpu_period {
                    0 => cur_period,
                    p => p.to_string(),
                };
                out.push(write_to(&dir, "cpu.max", format!("{quota} {period}")));
            }
            if !r.cpuset_cpus.is_empty() {
                out.push(write_to(&dir, "cpuset.cpus", &r.cpuset_cpus));
            }
            if !r.cpuset_mems.is_empty() {
                out.push(write_to(&dir, "cpuset.mems", &r.cpuset_mems));
            }
            if r.memory_limit_in_bytes > 0 {
                out.push(write_to(&dir, "memory.max", r.memory_limit_in_bytes));
            }
            let swap_file = dir.join("memory.swap.max");
            if current(&swap_file).is_some() {
                // The CRI (like OCI) counts memory plus swap; v2 limits swap alone.
                match merged.memory_swap_limit_in_bytes {
                    _ if r.memory_swap_limit_in_bytes == 0 && r.memory_limit_in_bytes == 0 => {}
                    -1 => out.push(write_to(&dir, "memory.swap.max", "max")),
                    s if s > 0 && merged.memory_limit_in_bytes > 0 => out.push(write_to(
                        &dir,
                        "memory.swap.max",
                        s.saturating_sub(merged.memory_limit_in_bytes),
                    )),
                    _ => {}
                }
            }
            for h in &hugepages {
                out.push(write_to(
                    &dir,
                    &format!("hugetlb.{}.max", h.page_size),
                    h.limit,
                ));
            }
            let mut keys: Vec<&String> = r.unified.keys().collect();
            keys.sort();
            for key in keys {
                out.push(write_to(&dir, key, &r.unified[key]));
            }
        }
    }
    Ok(out)
}

/// Writes `w`, turning the kernel's refusals into errors that name the container.
fn apply(id: &str, w: &CgroupWrite) -> Result<(), UpdateError> {
    let file = w
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let res = std::fs::OpenOptions::new()
        .write(true)
        .open(&w.path)
        .and_then(|mut f| f.write_all(w.value.as_bytes()));
    match res {
        Ok(()) => {
            tracing::debug!(container = %id, file = %w.path.display(), value = %w.value, "cgroup updated");
            Ok(())
        }
        Err(e) => {
            let what = format!("container {id}: {file} = {}: {e}", w.value);
            Err(match e.raw_os_error() {
                Some(libc::EBUSY) if file.starts_with("memory.") => {
                    UpdateError::FailedPrecondition(format!(
                        "{what} (the memory in use cannot be reclaimed below the new limit)"
                    ))
                }
                Some(libc::EBUSY) => UpdateError::FailedPrecondition(what),
                Some(libc::EINVAL) | Some(libc::ERANGE) => UpdateError::InvalidArgument {
                    field: file,
                    reason: format!("the kernel refused it for container {id}: {e}"),
                },
                Some(libc::ENOENT) => UpdateError::FailedPrecondition(format!(
                    "{what} (the container's cgroup or this controller is missing)"
                )),
                _ => UpdateError::Internal(what),
            })
        }
    }
}

/// The `linux.cgroupsPath` of a bundle's config.json, as written (a path, or the systemd
/// driver's `<slice>:<prefix>:<name>`).
pub fn oci_cgroups_path(spec: &serde_json::Value) -> Option<&str> {
    spec.pointer("/linux/cgroupsPath").and_then(|v| v.as_str())
}

/// The cgroup path (from the hierarchy's root) of a bundle's config.json: its
/// `linux.cgroupsPath`, or the path of the scope a systemd one names.
pub fn cgroups_path(spec: &serde_json::Value) -> Option<String> {
    oci_cgroups_path(spec).and_then(super::cgroup_driver::cgroups_path_to_dir)
}

/// Sets the bundle's `linux.resources` as the properties of the container's systemd scope, where
/// its cgroupsPath names one (the systemd driver); a cgroupfs path needs nothing.
pub async fn set_unit_resources(
    layout: &Layout,
    id: &str,
    spec: &serde_json::Value,
) -> Result<(), UpdateError> {
    let Layout::V2(root) = layout else {
        return Ok(());
    };
    let Some((path, resources)) = scope_resources(id, spec)? else {
        return Ok(());
    };
    let root = root.clone();
    on_systemd(id, move || {
        super::systemd_units::set_resources(&root, &path, &resources)
    })
    .await
}

/// Under the systemd driver, sets the unit properties of a created container's `unified` keys
/// that libcontainer left to the files (see [`super::systemd_units::set_unified_properties`]).
pub async fn set_created_unit_properties(id: &str, bundle: &Path) -> Result<(), UpdateError> {
    let spec = read_spec(bundle)?;
    let Some((path, resources)) = scope_resources(id, &spec)? else {
        return Ok(());
    };
    on_systemd(id, move || {
        super::systemd_units::set_unified_properties(&path, &resources)
    })
    .await
}

/// The systemd cgroupsPath of a bundle's spec and its `linux.resources`, where it names a scope.
fn scope_resources(
    id: &str,
    spec: &serde_json::Value,
) -> Result<Option<(String, oci_spec::runtime::LinuxResources)>, UpdateError> {
    let Some(path) = oci_cgroups_path(spec).filter(|p| super::cgroup_driver::names_a_scope(p))
    else {
        return Ok(None);
    };
    let resources = spec
        .pointer("/linux/resources")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| UpdateError::Internal(format!("container {id}: its resources: {e}")))?
        .unwrap_or_default();
    Ok(Some((path.to_string(), resources)))
}

/// Runs a blocking exchange with systemd off the async workers.
async fn on_systemd(
    id: &str,
    f: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Result<(), UpdateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| UpdateError::Internal(format!("container {id}: {e}")))?
        .map_err(|e| UpdateError::Internal(format!("container {id}: {e}")))
}

/// Under the systemd driver, writes a created container's resources to its scope's files too:
/// libcontainer sets the properties systemd has, and some limits have none (`unified` keys
/// such as memory.oom.group, hugepage limits). Nothing to do under cgroupfs.
pub fn write_created_resources(
    layout: &Layout,
    id: &str,
    bundle: &Path,
    r: &cri::LinuxContainerResources,
) -> Result<(), UpdateError> {
    let spec = read_spec(bundle)?;
    let Some(oci) = oci_cgroups_path(&spec) else {
        return Ok(());
    };
    if !super::cgroup_driver::names_a_scope(oci) {
        return Ok(());
    }
    let Some(cgroup) = cgroups_path(&spec) else {
        return Ok(());
    };
    if let Layout::V2(root) = layout
        && !r.hugepage_limits.is_empty()
        && layout.has_controller("hugetlb")
    {
        super::cgroups::enable_in_ancestors(root, &cgroup, "hugetlb")
            .map_err(|e| UpdateError::Internal(format!("container {id}: {e}")))?;
    }
    for w in &plan(layout, &cgroup, r, r, &read_file)? {
        apply(id, w)?;
    }
    Ok(())
}

/// Reads `<bundle>/config.json`.
pub fn read_spec(bundle: &Path) -> Result<serde_json::Value, UpdateError> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path)
        .map_err(|e| UpdateError::Internal(format!("reading {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| UpdateError::Internal(format!("parsing {}: {e}", path.display())))
}

/// Sets the OCI `linux.resources` fields that `r` (the merged resources) has, keeping the rest
/// (device rules, pids, …).
pub fn set_spec_resources(spec: &mut serde_json::Value, r: &cri::LinuxContainerResources) {
    use serde_json::{Map, Value, json};
    let Some(root) = spec.as_object_mut() else {
        return;
    };
    let linux = root
        .entry("linux")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(linux) = linux.as_object_mut() else {
        return;
    };
    let res = linux
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(res) = res.as_object_mut() else {
        return;
    };
    let mut set = |section: &str, key: &str, v: Value| {
        let s = res
            .entry(section)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(s) = s.as_object_mut() {
            s.insert(key.to_string(), v);
        }
    };
    if r.cpu_shares > 0 {
        set("cpu", "shares", json!(r.cpu_shares));
    }
    if r.cpu_quota != 0 {
        set("cpu", "quota", json!(r.cpu_quota));
    }
    if r.cpu_period != 0 {
        set("cpu", "period", json!(r.cpu_period));
    }
    if !r.cpuset_cpus.is_empty() {
        set("cpu", "cpus", json!(r.cpuset_cpus));
    }
    if !r.cpuset_mems.is_empty() {
        set("cpu", "mems", json!(r.cpuset_mems));
    }
    if r.memory_limit_in_bytes > 0 {
        set("memory", "limit", json!(r.memory_limit_in_bytes));
    }
    if r.memory_swap_limit_in_bytes != 0 {
        set("memory", "swap", json!(r.memory_swap_limit_in_bytes));
    } else if let Some(bound) = swap_bound_from_unified(
        r.memory_limit_in_bytes,
        r.memory_swap_limit_in_bytes,
        &r.unified,
    ) {
        set("memory", "swap", json!(bound));
    }
    if !r.hugepage_limits.is_empty() {
        let list: Vec<Value> = r
            .hugepage_limits
            .iter()
            .map(|h| json!({ "pageSize": h.page_size, "limit": h.limit }))
            .collect();
        res.insert("hugepageLimits".into(), Value::Array(list));
    }
    if !r.unified.is_empty() {
        let map: Map<String, Value> = r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        res.insert("unified".into(), Value::Object(map));
    }
}

/// Writes `<bundle>/config.json` atomically (temp file, fsync, rename).
fn write_spec(bundle: &Path, spec: &serde_json::Value) -> Result<(), UpdateError> {
    let path = bundle.join("config.json");
    let tmp = bundle.join(".config.json.update");
    let io = |e: std::io::Error| UpdateError::Internal(format!("writing {}: {e}", path.display()));
    let bytes = serde_json::to_vec(spec)
        .map_err(|e| UpdateError::Internal(format!("encoding the OCI spec: {e}")))?;
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)
}

fn read_file(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

impl ContainerManager {
    /// UpdateContainerResources for container `id` (or a unique prefix).
    pub async fn update_resources(
        &self,
        id: &str,
        resources: Option<&cri::LinuxContainerResources>,
        layout: &Layout,
    ) -> Result<(), ContainerError> {
        let mut rec = self.get(id)?;
        let Some(r) = resources else {
            // Nothing to change (a Windows-only request, say).
            return Ok(());
        };
        validate(r)?;
        let _guard = self.lock_records().await;
        // Removed meanwhile: NotFound, and the record below must not be saved back.
        self.get(&rec.id)?;
        if rec.state != ContainerState::Created && rec.state != ContainerState::Running {
            return Err(UpdateError::FailedPrecondition(format!(
                "container {} is {:?}: only a created or running container can be updated",
                rec.id, rec.state
            ))
            .into());
        }
        let mut spec = read_spec(&rec.bundle)?;
        let cgroup = cgroups_path(&spec).ok_or_else(|| {
            UpdateError::Internal(format!(
                "container {}: its OCI spec has no linux.cgroupsPath",
                rec.id
            ))
        })?;
        let mut config = rec.config();
        let mut linux = config.linux.take().unwrap_or_default();
        let old = linux.resources.take().unwrap_or_default();
        let merged = merge(&old, r);
        let writes = plan(layout, &cgroup, r, &merged, &read_file)?;
        set_spec_resources(&mut spec, &merged);
        // Under the systemd driver the scope's properties first: systemd writes them again
        // at every daemon-reload, so files alone would not last.
        set_unit_resources(layout, &rec.id, &spec).await?;
        for w in &writes {
            apply(&rec.id, w)?;
        }
        write_spec(&rec.bundle, &spec)?;
        linux.resources = Some(merged);
        config.linux = Some(linux);
        rec.config_hex = hex::encode(config.encode_to_vec());
        self.save_record(&rec)?;
        tracing::info!(container = %rec.id, files = writes.len(), "container resources updated");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unified_sorted(u: &std::collections::HashMap<String, String>) -> Vec<(String, String)> {
        let mut v: Vec<_> = u.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort();
        v
    }

    fn res() -> cri::LinuxContainerResources {
        cri::LinuxContainerResources::default()
    }

    #[test]
    fn impossible_values_are_refused() {
        let bad = [
            cri::LinuxContainerResources {
                memory_limit_in_bytes: -1,
                ..res()
            },
            cri::LinuxContainerResources {
                cpu_quota: 999,
                ..res()
            },
            cri::LinuxContainerResources {
                cpu_period: 100,
                ..res()
            },
            cri::LinuxContainerResources {
                cpu_shares: -2,
                ..res()
            },
            cri::LinuxContainerResources {
                memory_limit_in_bytes: 2000,
                memory_swap_limit_in_bytes: 1000,
                ..res()
            },
            cri::LinuxContainerResources {
                cpuset_cpus: "0;1".into(),
                ..res()
            },
            cri::LinuxContainerResources {
                unified: [("../x".to_string(), "1".to_string())].into(),
                ..res()
            },
            cri::LinuxContainerResources {
                unified: [("cgroup.procs".to_string(), "1".to_string())].into(),
                ..res()
            },
            cri::LinuxContainerResources {
                unified: [("memory.high\n".to_string(), "1".to_string())].into(),
                ..res()
            },
        ];
        for r in bad {
            assert!(
                matches!(validate(&r), Err(UpdateError::InvalidArgument { .. })),
                "{r:?}"
            );
        }
        assert!(
            validate(&cri::LinuxContainerResources {
                cpu_quota: -1,
                memory_limit_in_bytes: 1 << 20,
                memory_swap_limit_in_bytes: -1,
                cpuset_cpus: "0-1".into(),
                ..res()
            })
            .is_ok()
        );
    }

    #[test]
    fn merge_keeps_what_the_update_leaves_alone() {
        let old = cri::LinuxContainerResources {
            cpu_shares: 512,
            memory_limit_in_bytes: 100,
            hugepage_limits: vec![cri::HugepageLimit {
                page_size: "2MB".into(),
                limit: 1,
            }],
            ..res()
        };
        let new = cri::LinuxContainerResources {
            memory_limit_in_bytes: 200,
            hugepage_limits: vec![cri::HugepageLimit {
                page_size: "2MB".into(),
                limit: 2,
            }],
            unified: [("pids.max".to_string(), "10".to_string())].into(),
            ..res()
        };
        let m = merge(&old, &new);
        assert_eq!((m.cpu_shares, m.memory_limit_in_bytes), (512, 200));
        assert_eq!(m.hugepage_limits.len(), 1);
        assert_eq!(m.hugepage_limits[0].limit, 2);
        assert_eq!(
            unified_sorted(&m.unified),
            vec![("pids.max".into(), "10".into())]
        );
    }

    #[test]
    fn shares_map_onto_weights() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1), 1);
    }

    #[test]
    fn v1_plan_orders_memory_and_swap() {
        let layout = Layout::V1(vec![
            "/cg/cpu".into(),
            "/cg/memory".into(),
            "/cg/pids".into(),
        ]);
        let r = cri::LinuxContainerResources {
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 2 << 20,
            memory_swap_limit_in_bytes: 4 << 20,
            unified: [("pids.max".to_string(), "20".to_string())].into(),
            ..res()
        };
        let current = |p: &Path| -> Option<String> {
            match p.to_str()? {
                "/cg/memory/c/memory.limit_in_bytes" => Some("1048576\n".into()),
                "/cg/memory/c/memory.memsw.limit_in_bytes" => Some("1048576\n".into()),
                "/cg/pids/c/pids.max" => Some("max\n".into()),
                _ => None,
            }
        };
        let w = plan(&layout, "/c", &r, &r, &current).expect("plan");
        let got: Vec<(String, String)> = w
            .iter()
            .map(|w| (w.path.display().to_string(), w.value.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/cg/cpu/c/cpu.cfs_period_us".into(), "100000".into()),
                ("/cg/cpu/c/cpu.cfs_quota_us".into(), "50000".into()),
                (
                    "/cg/memory/c/memory.memsw.limit_in_bytes".into(),
                    "4194304".into()
                ),
                (
                    "/cg/memory/c/memory.limit_in_bytes".into(),
                    "2097152".into()
                ),
                ("/cg/pids/c/pids.max".into(), "20".into()),
            ]
        );
        // No hugetlb hierarchy here, and unified keys need their file.
        let r2 = cri::LinuxContainerResources {
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..res()
        };
        assert!(matches!(
            plan(&layout, "/c", &r2, &r2, &current),
            Err(UpdateError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn v2_plan_converts_shares_quota_and_swap() {
        let layout = Layout::V2("/cg".into());
        let r = cri::LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 20_000,
            memory_limit_in_bytes: 1 << 20,
            memory_swap_limit_in_bytes: 3 << 20,
            hugepage_limits: vec![cri::HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            unified: [("memory.high".to_string(), "900000".to_string())].into(),
            ..res()
        };
        let current = |p: &Path| -> Option<String> {
            match p.to_str()? {
                "/cg/cgroup.controllers" => Some("cpu memory hugetlb\n".into()),
                "/cg/c/cpu.max" => Some("max 50000\n".into()),
                "/cg/c/memory.swap.max" => Some("max\n".into()),
                _ => None,
            }
        };
        let w = plan(&layout, "c", &r, &r, &current).expect("plan");
        let got: Vec<(String, String)> = w
            .iter()
            .map(|w| (w.path.display().to_string(), w.value.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/cg/c/cpu.weight".into(), "39".into()),
                ("/cg/c/cpu.max".into(), "20000 50000".into()),
                ("/cg/c/memory.max".into(), "1048576".into()),
                ("/cg/c/memory.swap.max".into(), "2097152".into()),
                ("/cg/c/hugetlb.2MB.max".into(), "4194304".into()),
                ("/cg/c/memory.high".into(), "900000".into()),
            ]
        );
        let unlimit = cri::LinuxContainerResources {
            cpu_quota: -1,
            ..res()
        };
        let w = plan(&layout, "c", &unlimit, &unlimit, &current).expect("plan");
        assert_eq!(w[0].value, "max 50000");
    }

    /// The kubelet's zero hugepage limits are dropped where no hugetlb controller is, on v1
    /// and v2; a limit above zero is refused there as an invalid argument naming the field.
    #[test]
    fn hugepage_limits_without_hugetlb_controller() {
        let hp = |limit| cri::HugepageLimit {
            page_size: "2MB".into(),
            limit,
        };
        let v1 = Layout::V1(vec!["/cg/cpu".into(), "/cg/memory".into()]);
        let v2 = Layout::V2("/cg".into());
        let current = |p: &Path| -> Option<String> {
            (p.to_str()? == "/cg/cgroup.controllers").then(|| "cpu memory pids\n".into())
        };
        for layout in [&v1, &v2] {
            let zero = cri::LinuxContainerResources {
                cpu_shares: 2,
                hugepage_limits: vec![hp(0)],
                ..res()
            };
            let w = plan(layout, "/c", &zero, &zero, &current).expect("plan");
            assert_eq!(w.len(), 1, "{layout:?}: only the cpu write");
            assert!(!w[0].path.to_string_lossy().contains("hugetlb"));
            let some = cri::LinuxContainerResources {
                hugepage_limits: vec![hp(0), hp(2 << 20)],
                ..res()
            };
            match plan(layout, "/c", &some, &some, &current) {
                Err(UpdateError::InvalidArgument { field, .. }) => {
                    assert_eq!(field, "hugepage_limits[1]")
                }
                other => panic!("{layout:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn spec_resources_are_merged_into_the_bundle_json() {
        let mut spec = serde_json::json!({
            "linux": {
                "cgroupsPath": "/kubepods/berth-x",
                "resources": { "devices": [{ "allow": false, "access": "rwm" }],
                               "memory": { "limit": 5 } }
            }
        });
        assert_eq!(cgroups_path(&spec).as_deref(), Some("/kubepods/berth-x"));
        set_spec_resources(
            &mut spec,
            &cri::LinuxContainerResources {
                cpu_quota: 20_000,
                memory_limit_in_bytes: 1 << 20,
                ..res()
            },
        );
        assert_eq!(
            spec.pointer("/linux/resources/memory/limit"),
            Some(&serde_json::json!(1 << 20))
        );
        assert_eq!(
            spec.pointer("/linux/resources/cpu/quota"),
            Some(&serde_json::json!(20_000))
        );
        assert!(spec.pointer("/linux/resources/devices/0").is_some());
    }
}
