//! The downward API: pod fields and container resources as env values and as volume files.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::agent::runtime::resources::parse_quantity;

/// Mode of downward API files when neither the item nor the volume sets one (the API default).
pub const DEFAULT_FILE_MODE: i32 = 0o644;

/// What a container without a limit sees as its limit: the node's amounts (its capacity; the
/// kubelet uses allocatable, capacity minus reservations).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeAllocatable {
    /// CPU cores.
    pub cpu_cores: f64,
    /// Memory in bytes.
    pub memory_bytes: f64,
    /// Size of the node's filesystem in bytes.
    pub ephemeral_storage_bytes: f64,
}

impl NodeAllocatable {
    /// This machine's CPUs, `memory_bytes` of memory, and the size of the filesystem holding
    /// `fs_path` (or its nearest existing ancestor).
    pub fn of_this_node(memory_bytes: f64, fs_path: &Path) -> Self {
        let cpu_cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as f64;
        let fs = fs_path
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or(Path::new("/"));
        let ephemeral_storage_bytes = rustix::fs::statvfs(fs)
            .map(|s| s.f_blocks as f64 * s.f_frsize as f64)
            .unwrap_or(0.0);
        Self {
            cpu_cores,
            memory_bytes,
            ephemeral_storage_bytes,
        }
    }

    /// As [`Self::of_this_node`], with the memory read from `/proc/meminfo`.
    pub fn detect(fs_path: &Path) -> Self {
        Self::of_this_node(total_memory_bytes().unwrap_or(0.0), fs_path)
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes.
fn total_memory_bytes() -> Option<f64> {
    crate::agent::runtime::resources::proc_meminfo_bytes("MemTotal").map(|b| b as f64)
}

/// A `metadata.*` field of the pod: name, namespace, uid, all labels or annotations (one
/// `key="value"` per line) or one of them (`metadata.labels['key']`, empty when absent).
pub fn pod_field(pod: &Pod, field_path: &str) -> Result<String, String> {
    let m = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = m.labels.as_ref().unwrap_or(&empty);
    let annotations = m.annotations.as_ref().unwrap_or(&empty);
    match field_path {
        "metadata.name" => Ok(m.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(m.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Ok(m.uid.clone().unwrap_or_default()),
        "metadata.labels" => Ok(format_map(labels)),
        "metadata.annotations" => Ok(format_map(annotations)),
        p => {
            if let Some(key) = subscript(p, "metadata.labels") {
                Ok(labels.get(key).cloned().unwrap_or_default())
            } else if let Some(key) = subscript(p, "metadata.annotations") {
                Ok(annotations.get(key).cloned().unwrap_or_default())
            } else {
                Err(format!("unsupported fieldPath {p:?}"))
            }
        }
    }
}

/// `key` of `<field>['key']`.
fn subscript<'a>(path: &'a str, field: &str) -> Option<&'a str> {
    path.strip_prefix(field)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

/// A map as the kubelet writes labels and annotations: `key="value"` lines sorted by key,
/// values quoted and escaped as Go's `%q`, no newline after the last.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `s` quoted as Go's `strconv.Quote` does: Go escapes for quotes, backslashes and control
/// characters, `\u`/`\U` for other characters Go does not print; printable text stays.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Whether Go's `strconv.IsPrint` holds, for the characters that matter in labels and
/// annotations: not a control, not a space other than ' ', not a format or private-use
/// character. (Unassigned code points, which Go also escapes, are kept.)
fn is_go_printable(c: char) -> bool {
    let u = c as u32;
    let format_char = matches!(u,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb);
    let private_use = matches!(u, 0xe000..=0xf8ff | 0xf0000..=0x10ffff);
    !(c.is_control() || (c.is_whitespace() && c != ' ') || format_char || private_use)
}

/// The value of a `resourceFieldRef` for `container` of `pod`, in units of its divisor
/// (rounded up), a missing limit being the node's amount.
pub fn resource_value(
    container: &Container,
    sel: &ResourceFieldSelector,
    node: &NodeAllocatable,
) -> Result<String, String> {
    let resources = container.resources.clone().unwrap_or_default();
    let get =
        |map: &Option<BTreeMap<String, Quantity>>, name: &str| -> Result<Option<f64>, String> {
            match map.as_ref().and_then(|m| m.get(name)) {
                None => Ok(None),
                Some(q) => parse_quantity(&q.0).map(Some).ok_or_else(|| {
                    format!(
                        "container {:?}: invalid {name} quantity {:?}",
                        container.name, q.0
                    )
                }),
            }
        };
    let (kind, amount) = match sel.resource.as_str() {
        r @ ("limits.cpu" | "limits.memory" | "limits.ephemeral-storage") => {
            let name = &r["limits.".len()..];
            let node_amount = match name {
                "cpu" => node.cpu_cores,
                "memory" => node.memory_bytes,
                _ => node.ephemeral_storage_bytes,
            };
            (name, get(&resources.limits, name)?.unwrap_or(node_amount))
        }
        r @ ("requests.cpu" | "requests.memory" | "requests.ephemeral-storage") => {
            let name = &r["requests.".len()..];
            // As the API server defaults them: a missing request is the limit, if any.
            let request = match get(&resources.requests, name)? {
                Some(v) => Some(v),
                None => get(&resources.limits, name)?,
            };
            (name, request.unwrap_or(0.0))
        }
        other => return Err(format!("unsupported resource {other:?}")),
    };
    // The API server fills in a divisor of "0" when the pod names none: as the kubelet, a zero
    // divisor is 1.
    let divisor = match sel.divisor.as_ref().map(|q| q.0.as_str()) {
        None | Some("") => 1.0,
        Some(d) => match parse_quantity(d) {
            Some(0.0) => 1.0,
            Some(v) if v > 0.0 => v,
            _ => return Err(format!("invalid divisor {d:?}")),
        },
    };
    Ok(in_divisor_units(kind, amount, divisor).to_string())
}

/// `amount / divisor` rounded up, as the kubelet: CPU in whole millicores first, others in
/// whole units (bytes) first.
fn in_divisor_units(kind: &str, amount: f64, divisor: f64) -> u64 {
    if kind == "cpu" {
        ceil_near(ceil_near(amount * 1000.0) as f64 / ceil_near(divisor * 1000.0).max(1) as f64)
    } else {
        ceil_near(ceil_near(amount) as f64 / ceil_near(divisor).max(1) as f64)
    }
}

/// `x` rounded up, except that values within floating-point noise of an integer are that
/// integer (`0.1 * 1000` is 100, not 101).
fn ceil_near(x: f64) -> u64 {
    let nearest = x.round();
    if (x - nearest).abs() <= 1e-9 * nearest.abs().max(1.0) {
        nearest.max(0.0) as u64
    } else {
        x.ceil().max(0.0) as u64
    }
}

/// Refuses an item path that is empty, absolute, or has a `..` element: files stay in the volume.
pub fn check_item_path(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty() {
        return Err("path must not be empty".into());
    }
    if p.is_absolute() {
        return Err(format!("path {path:?} must be relative"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("path {path:?} must not contain '..'"));
    }
    if !p
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!("path {path:?} must stay inside the volume"));
    }
    Ok(())
}

/// One file of a downward API volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownwardFile {
    /// Path inside the volume (checked with [`check_item_path`]).
    pub path: String,
    /// The content.
    pub content: String,
    /// Permission bits.
    pub mode: u32,
}

/// The files of `items` for `pod`; `default_mode` applies to items without a mode.
pub fn files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    node: &NodeAllocatable,
) -> Result<Vec<DownwardFile>, String> {
    items
        .iter()
        .map(|item| {
            file(pod, item, default_mode, node).map_err(|e| format!("item {:?}: {e}", item.path))
        })
        .collect()
}

fn file(
    pod: &Pod,
    item: &DownwardAPIVolumeFile,
    default_mode: Option<i32>,
    node: &NodeAllocatable,
) -> Result<DownwardFile, String> {
    check_item_path(&item.path)?;
    let mode = item.mode.or(default_mode).unwrap_or(DEFAULT_FILE_MODE);
    let mode = u32::try_from(mode)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("mode {mode} is not between 0 and 0777"))?;
    let content = match (&item.field_ref, &item.resource_field_ref) {
        (Some(f), None) => pod_field(pod, &f.field_path)?,
        (None, Some(r)) => {
            let name = r.container_name.as_deref().unwrap_or("");
            if name.is_empty() {
                return Err("resourceFieldRef needs a containerName in a volume".into());
            }
            resource_value(find_container(pod, name)?, r, node)?
        }
        _ => return Err("exactly one of fieldRef and resourceFieldRef must be set".into()),
    };
    Ok(DownwardFile {
        path: item.path.clone(),
        content,
        mode,
    })
}

/// Container (or init container) `name` of the pod.
pub fn find_container<'a>(pod: &'a Pod, name: &str) -> Result<&'a Container, String> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no container named {name:?} in the pod"))
}

/// Writes `files` under `dir` (created if needed), each replaced atomically. Paths are checked
/// again here: nothing is written outside `dir`.
pub fn write_files(dir: &Path, files: &[DownwardFile]) -> Result<(), String> {
    for f in files {
        check_item_path(&f.path).map_err(|e| format!("item {:?}: {e}", f.path))?;
    }
    create_dir(dir)?;
    for f in files {
        write_file(dir, f).map_err(|e| format!("writing {:?}: {e}", f.path))?;
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))
}

/// Writes one file through a temporary file renamed over it.
fn write_file(dir: &Path, f: &DownwardFile) -> std::io::Result<()> {
    let target = dir.join(&f.path);
    let parent = target.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent)?;
    let file_name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{file_name}.tmp"));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(f.mode)
        .open(&tmp)?;
    out.write_all(f.content.as_bytes())?;
    // The mode given to open is masked by the umask; set it exactly.
    out.set_permissions(std::fs::Permissions::from_mode(f.mode))?;
    drop(out);
    std::fs::rename(&tmp, &target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1",
                "labels": {"zone": "a", "app": "web"},
                "annotations": {"note": "say \"hi\"\n\tbye\\", "uni": "é\u{200b}\u{1}"}
            },
            "spec": {"containers": [
                {"name": "c", "resources": {
                    "limits": {"cpu": "250m", "memory": "64Mi"},
                    "requests": {"cpu": "100m"}
                }},
                {"name": "bare"}
            ]}
        }))
        .expect("pod")
    }

    fn node() -> NodeAllocatable {
        NodeAllocatable {
            cpu_cores: 4.0,
            memory_bytes: 8.0 * 1024.0 * 1024.0 * 1024.0,
            ephemeral_storage_bytes: 1e11,
        }
    }

    fn resource(container: &str, resource: &str, divisor: Option<&str>) -> String {
        let p = pod();
        let sel = ResourceFieldSelector {
            container_name: None,
            resource: resource.into(),
            divisor: divisor.map(|d| Quantity(d.into())),
        };
        let c = find_container(&p, container).expect("container");
        resource_value(c, &sel, &node()).expect("value")
    }

    #[test]
    fn labels_and_annotations_are_sorted_quoted_lines() {
        let p = pod();
        assert_eq!(
            pod_field(&p, "metadata.labels").as_deref(),
            Ok("app=\"web\"\nzone=\"a\"")
        );
        assert_eq!(
            pod_field(&p, "metadata.annotations").as_deref(),
            Ok("note=\"say \\\"hi\\\"\\n\\tbye\\\\\"\nuni=\"é\\u200b\\x01\"")
        );
        assert_eq!(
            pod_field(&p, "metadata.labels['app']").as_deref(),
            Ok("web")
        );
        assert_eq!(pod_field(&p, "metadata.labels['none']").as_deref(), Ok(""));
        assert_eq!(pod_field(&p, "metadata.uid").as_deref(), Ok("u-1"));
        assert!(pod_field(&p, "spec.nodeName").is_err());
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn resources_in_divisor_units_rounded_up() {
        assert_eq!(resource("c", "limits.cpu", None), "1");
        assert_eq!(resource("c", "limits.cpu", Some("1m")), "250");
        assert_eq!(resource("c", "requests.cpu", Some("1m")), "100");
        assert_eq!(resource("c", "limits.memory", Some("1Mi")), "64");
        assert_eq!(resource("c", "limits.memory", None), "67108864");
        assert_eq!(resource("c", "limits.memory", Some("1M")), "68");
        // A missing request is the limit; a missing limit is the node's amount.
        assert_eq!(resource("c", "requests.memory", Some("1Mi")), "64");
        assert_eq!(resource("bare", "limits.cpu", None), "4");
        assert_eq!(resource("bare", "limits.memory", Some("1Gi")), "8");
        assert_eq!(resource("bare", "requests.cpu", None), "0");
        assert_eq!(
            resource("bare", "limits.ephemeral-storage", Some("1G")),
            "100"
        );
        assert_eq!(ceil_near(0.1 * 1000.0), 100);
        assert_eq!(ceil_near(100.5), 101);
    }

    #[test]
    fn the_api_servers_zero_divisor_is_one() {
        // What the API server sends for a resourceFieldRef given without a divisor.
        assert_eq!(resource("c", "limits.memory", Some("0")), "67108864");
        assert_eq!(resource("c", "requests.cpu", Some("0")), "1");
        let p = pod();
        let sel = ResourceFieldSelector {
            container_name: None,
            resource: "limits.memory".into(),
            divisor: Some(Quantity("-1".into())),
        };
        let c = find_container(&p, "c").expect("container");
        assert_eq!(
            resource_value(c, &sel, &node()),
            Err("invalid divisor \"-1\"".to_string())
        );
    }

    #[test]
    fn item_paths_stay_inside_the_volume() {
        assert!(check_item_path("labels").is_ok());
        assert!(check_item_path("a/b/c").is_ok());
        assert!(check_item_path("..data").is_ok());
        for bad in ["", "/etc/passwd", "../escape", "a/../../b", "a/.."] {
            assert!(check_item_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn files_are_written_with_their_modes_and_bad_paths_write_nothing() {
        let base = std::env::temp_dir().join(format!("berth-downward-{}", std::process::id()));
        let dir = base.join("vol");
        let f = |path: &str, mode| DownwardFile {
            path: path.into(),
            content: "x".into(),
            mode,
        };
        write_files(&dir, &[f("a", 0o600), f("sub/b", 0o444)]).expect("write");
        let mode = |p: &str| {
            std::fs::metadata(dir.join(p))
                .map(|m| m.permissions().mode() & 0o777)
                .expect("stat")
        };
        assert_eq!((mode("a"), mode("sub/b")), (0o600, 0o444));
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/b")).ok().as_deref(),
            Some("x")
        );
        assert!(write_files(&dir, &[f("ok", 0o644), f("../escape", 0o644)]).is_err());
        assert!(!base.join("escape").exists() && !dir.join("ok").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
