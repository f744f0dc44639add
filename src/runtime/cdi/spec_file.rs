//! CDI spec files as the Container Device Interface defines them (JSON or YAML, spec versions
//! 0.3.0 to 1.0.0): a kind (`vendor.com/class`), its devices by name, and the container edits
//! each brings (environment, device nodes, mounts, hooks, additional groups).

use std::collections::BTreeMap;

use serde::Deserialize;

/// One spec file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecFile {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    /// Edits applied once for any device of this file a container gets.
    #[serde(default)]
    pub container_edits: Option<ContainerEdits>,
}

/// One device of a spec file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

/// What a device (or its spec file) changes in a container.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default, rename = "additionalGids")]
    pub additional_gids: Vec<u32>,
    /// Intel RDT class of service (spec 0.7): not applied by Berth.
    #[serde(default)]
    pub intel_rdt: Option<serde_json::Value>,
    /// Network devices moved into the pod (spec 1.1): not applied by Berth.
    #[serde(default)]
    pub net_devices: Vec<serde_json::Value>,
}

/// A device node to make in the container.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Where it appears in the container.
    pub path: String,
    /// The host node it stands for (default: `path`).
    #[serde(default)]
    pub host_path: Option<String>,
    /// `c`, `b`, `u` or `p` (default: the host node's).
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// Device cgroup access, a subset of `rwm` (default `rwm`).
    #[serde(default)]
    pub permissions: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

/// A host path mounted in the container.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default)]
    pub options: Vec<String>,
    #[serde(default, rename = "type")]
    pub typ: Option<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// prestart, createRuntime, createContainer, startContainer, poststart or poststop.
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// Why a spec file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    #[error("{0}")]
    Parse(String),
    #[error("cdiVersion {0:?} is not one Berth reads (0.3.0 to 1.0.0)")]
    Version(String),
    #[error("kind {0:?} is not vendor/class")]
    Kind(String),
    #[error("device name {0:?} is not valid")]
    DeviceName(String),
    #[error("device {0:?} is defined twice")]
    Duplicate(String),
}

/// Parses a spec file's text: JSON when `json`, else YAML; checks its version and names.
pub fn parse(text: &str, json: bool) -> Result<SpecFile, SpecFileError> {
    let spec: SpecFile = if json {
        serde_json::from_str(text).map_err(|e| SpecFileError::Parse(e.to_string()))?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| SpecFileError::Parse(e.to_string()))?
    };
    if !version_supported(&spec.cdi_version) {
        return Err(SpecFileError::Version(spec.cdi_version));
    }
    if !valid_kind(&spec.kind) {
        return Err(SpecFileError::Kind(spec.kind));
    }
    let mut seen = std::collections::HashSet::new();
    for d in &spec.devices {
        if !valid_device_name(&d.name) {
            return Err(SpecFileError::DeviceName(d.name.clone()));
        }
        if !seen.insert(d.name.as_str()) {
            return Err(SpecFileError::Duplicate(d.name.clone()));
        }
    }
    Ok(spec)
}

/// Spec versions 0.3.0 to 0.8.0, and 1.0.0 (the same format as 0.8.0).
fn version_supported(v: &str) -> bool {
    let mut parts = v.trim_start_matches('v').split('.');
    let num = |p: Option<&str>| p.and_then(|s| s.parse::<u32>().ok());
    match (num(parts.next()), num(parts.next()), num(parts.next())) {
        (Some(0), Some(minor), Some(_)) => (3..=8).contains(&minor),
        (Some(1), Some(0), Some(_)) => true,
        _ => false,
    }
}

/// `vendor/class`: a vendor of dot-separated labels (letters, digits, `-`, `_`; each starting
/// with a letter or digit), a class of letters, digits, `-`, `_` and `.`.
pub fn valid_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let label = |l: &str| {
        l.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    !vendor.is_empty()
        && vendor.split('.').all(label)
        && class
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && class
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A device name: a letter or digit, then letters, digits, `-`, `_`, `.` and `:`.
pub fn valid_device_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// Splits a fully qualified device name `vendor.com/class=name` into kind and name.
pub fn split_qualified(name: &str) -> Option<(&str, &str)> {
    let (kind, device) = name.split_once('=')?;
    (valid_kind(kind) && valid_device_name(device)).then_some((kind, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_specification_says() {
        assert_eq!(
            split_qualified("example.com/gpu=0"),
            Some(("example.com/gpu", "0"))
        );
        assert_eq!(
            split_qualified("vendor.example.com/fpga.v2=card-1:a"),
            Some(("vendor.example.com/fpga.v2", "card-1:a"))
        );
        for bad in [
            "example.com/gpu",
            "gpu=0",
            "example.com/=0",
            "/gpu=0",
            "exa mple.com/gpu=0",
            "example.com/gpu=-x",
            "example.com/gpu=a/b",
            ".example.com/gpu=0",
        ] {
            assert_eq!(split_qualified(bad), None, "{bad}");
        }
    }

    #[test]
    fn versions_from_0_3_to_1_0_are_read() {
        for v in ["0.3.0", "0.5.0", "0.8.0", "1.0.0"] {
            assert!(version_supported(v), "{v}");
        }
        for v in ["0.2.0", "1.1.0", "2.0.0", "latest", ""] {
            assert!(!version_supported(v), "{v}");
        }
    }

    #[test]
    fn json_and_yaml_files_parse_alike() {
        let json = r#"{"cdiVersion":"0.6.0","kind":"example.com/dev",
            "containerEdits":{"env":["A=1"]},
            "devices":[{"name":"zero","containerEdits":{
              "deviceNodes":[{"path":"/dev/berth-zero","hostPath":"/dev/zero","permissions":"rw"}],
              "mounts":[{"hostPath":"/etc/hostname","containerPath":"/etc/dev-host","options":["ro","bind"]}],
              "hooks":[{"hookName":"createRuntime","path":"/bin/true","args":["true"]}],
              "additionalGids":[44]}}]}"#;
        let yaml = "cdiVersion: 0.6.0\nkind: example.com/dev\ncontainerEdits:\n  env: [A=1]\n\
            devices:\n- name: zero\n  containerEdits:\n    deviceNodes:\n    - path: /dev/berth-zero\n      \
            hostPath: /dev/zero\n      permissions: rw\n    mounts:\n    - hostPath: /etc/hostname\n      \
            containerPath: /etc/dev-host\n      options: [ro, bind]\n    hooks:\n    - hookName: createRuntime\n      \
            path: /bin/true\n      args: [\"true\"]\n    additionalGids: [44]\n";
        for (text, is_json) in [(json, true), (yaml, false)] {
            let s = parse(text, is_json).expect("parse");
            assert_eq!(s.kind, "example.com/dev");
            assert_eq!(
                s.container_edits.as_ref().map(|e| e.env.clone()),
                Some(vec!["A=1".into()])
            );
            let e = &s.devices[0].container_edits;
            assert_eq!(e.device_nodes[0].host_path.as_deref(), Some("/dev/zero"));
            assert_eq!(e.mounts[0].container_path, "/etc/dev-host");
            assert_eq!(e.hooks[0].hook_name, "createRuntime");
            assert_eq!(e.additional_gids, [44]);
        }
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let file = |version: &str, kind: &str, names: &[&str]| {
            let devices: Vec<String> = names
                .iter()
                .map(|n| format!(r#"{{"name":"{n}","containerEdits":{{}}}}"#))
                .collect();
            format!(
                r#"{{"cdiVersion":"{version}","kind":"{kind}","devices":[{}]}}"#,
                devices.join(",")
            )
        };
        assert!(matches!(
            parse(&file("9.0.0", "a.com/b", &["x"]), true),
            Err(SpecFileError::Version(_))
        ));
        assert!(matches!(
            parse(&file("0.6.0", "nokind", &["x"]), true),
            Err(SpecFileError::Kind(_))
        ));
        assert!(matches!(
            parse(&file("0.6.0", "a.com/b", &["-x"]), true),
            Err(SpecFileError::DeviceName(_))
        ));
        assert!(matches!(
            parse(&file("0.6.0", "a.com/b", &["x", "x"]), true),
            Err(SpecFileError::Duplicate(_))
        ));
        assert!(matches!(parse("{", true), Err(SpecFileError::Parse(_))));
    }
}
