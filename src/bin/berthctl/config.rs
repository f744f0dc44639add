//! Pod and container configs from crictl-style JSON files.
//!
//! The file holds the CRI message as JSON. Field names are camelCase (`logDirectory`); the
//! proto's snake_case (`log_directory`) is accepted too. Only the fields below are read; any
//! other top-level field is reported on stderr and ignored.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, bail};
use k8s_cri::v1 as cri;
use serde_json::{Map, Value};

type Obj = Map<String, Value>;

const POD_FIELDS: &[&str] = &[
    "metadata",
    "hostname",
    "logDirectory",
    "dnsConfig",
    "labels",
    "annotations",
    "linux",
];

const CONTAINER_FIELDS: &[&str] = &[
    "metadata",
    "image",
    "command",
    "args",
    "workingDir",
    "envs",
    "mounts",
    "labels",
    "annotations",
    "logPath",
    "stdin",
    "stdinOnce",
    "tty",
    "linux",
];

/// Reads a JSON file into an object.
pub fn read_object(path: &Path) -> anyhow::Result<Obj> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))? {
        Value::Object(o) => Ok(o),
        _ => bail!("{}: expected a JSON object", path.display()),
    }
}

/// A PodSandboxConfig from a crictl-style pod config.
pub fn pod_config(o: &Obj) -> anyhow::Result<cri::PodSandboxConfig> {
    warn_unknown("pod config", o, POD_FIELDS);
    let meta = object(o, "metadata")?.context("pod config: metadata is required")?;
    let linux = object(o, "linux")?;
    let security = match linux {
        Some(l) => object(l, "securityContext")?,
        None => None,
    };
    let dns = object(o, "dnsConfig")?;
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: string(meta, "name")?,
            uid: string(meta, "uid")?,
            namespace: string(meta, "namespace")?,
            attempt: uint(meta, "attempt")?,
        }),
        hostname: string(o, "hostname")?,
        log_directory: string(o, "logDirectory")?,
        dns_config: dns
            .map(|d| -> anyhow::Result<_> {
                Ok(cri::DnsConfig {
                    servers: strings(d, "servers")?,
                    searches: strings(d, "searches")?,
                    options: strings(d, "options")?,
                })
            })
            .transpose()?,
        labels: string_map(o, "labels")?,
        annotations: string_map(o, "annotations")?,
        linux: linux
            .map(|l| -> anyhow::Result<_> {
                Ok(cri::LinuxPodSandboxConfig {
                    cgroup_parent: string(l, "cgroupParent")?,
                    sysctls: string_map(l, "sysctls")?,
                    security_context: security
                        .map(|s| -> anyhow::Result<_> {
                            Ok(cri::LinuxSandboxSecurityContext {
                                namespace_options: namespace_options(s)?,
                                privileged: boolean(s, "privileged")?,
                                readonly_rootfs: boolean(s, "readonlyRootfs")?,
                                run_as_user: int64_value(s, "runAsUser")?,
                                ..Default::default()
                            })
                        })
                        .transpose()?,
                    ..Default::default()
                })
            })
            .transpose()?,
        ..Default::default()
    })
}

/// A ContainerConfig from a crictl-style container config.
pub fn container_config(o: &Obj) -> anyhow::Result<cri::ContainerConfig> {
    warn_unknown("container config", o, CONTAINER_FIELDS);
    let meta = object(o, "metadata")?.context("container config: metadata is required")?;
    let image = object(o, "image")?.context("container config: image is required")?;
    let security = match object(o, "linux")? {
        Some(l) => object(l, "securityContext")?,
        None => None,
    };
    let linux = match (object(o, "linux")?, security) {
        (None, _) => None,
        (Some(_), None) => Some(cri::LinuxContainerConfig::default()),
        (Some(_), Some(s)) => Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: namespace_options(s)?,
                privileged: boolean(s, "privileged")?,
                readonly_rootfs: boolean(s, "readonlyRootfs")?,
                run_as_user: int64_value(s, "runAsUser")?,
                run_as_username: string(s, "runAsUsername")?,
                ..Default::default()
            }),
            resources: None,
        }),
    };
    let mut envs = Vec::new();
    for e in array(o, "envs")? {
        let e = e
            .as_object()
            .context("envs: each entry must be an object")?;
        envs.push(cri::KeyValue {
            key: string(e, "key")?,
            value: string(e, "value")?,
        });
    }
    let mut mounts = Vec::new();
    for m in array(o, "mounts")? {
        let m = m
            .as_object()
            .context("mounts: each entry must be an object")?;
        mounts.push(cri::Mount {
            container_path: string(m, "containerPath")?,
            host_path: string(m, "hostPath")?,
            readonly: boolean(m, "readonly")?,
            ..Default::default()
        });
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: string(meta, "name")?,
            attempt: uint(meta, "attempt")?,
        }),
        image: Some(cri::ImageSpec {
            image: string(image, "image")?,
            ..Default::default()
        }),
        command: strings(o, "command")?,
        args: strings(o, "args")?,
        working_dir: string(o, "workingDir")?,
        envs,
        mounts,
        labels: string_map(o, "labels")?,
        annotations: string_map(o, "annotations")?,
        log_path: string(o, "logPath")?,
        stdin: boolean(o, "stdin")?,
        stdin_once: boolean(o, "stdinOnce")?,
        tty: boolean(o, "tty")?,
        linux,
        ..Default::default()
    })
}

/// `namespaceOptions{network,pid,ipc}` of a security context; modes as numbers or names.
fn namespace_options(security: &Obj) -> anyhow::Result<Option<cri::NamespaceOption>> {
    let Some(ns) = object(security, "namespaceOptions")? else {
        return Ok(None);
    };
    Ok(Some(cri::NamespaceOption {
        network: namespace_mode(ns, "network")?,
        pid: namespace_mode(ns, "pid")?,
        ipc: namespace_mode(ns, "ipc")?,
        target_id: string(ns, "targetId")?,
        ..Default::default()
    }))
}

/// `0`/`"POD"`, `1`/`"CONTAINER"`, `2`/`"NODE"`, `3`/`"TARGET"`; absent is POD.
pub fn parse_namespace_mode(v: &Value) -> anyhow::Result<i32> {
    let mode = match v {
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .and_then(|n| cri::NamespaceMode::try_from(n).ok()),
        Value::String(s) => cri::NamespaceMode::from_str_name(&s.to_ascii_uppercase()),
        _ => None,
    };
    mode.map(|m| m as i32)
        .with_context(|| format!("namespace mode {v}: want POD, CONTAINER, NODE, TARGET or 0-3"))
}

fn namespace_mode(o: &Obj, key: &str) -> anyhow::Result<i32> {
    match field(o, key) {
        None => Ok(cri::NamespaceMode::Pod as i32),
        Some(v) => parse_namespace_mode(v).with_context(|| format!("namespaceOptions.{key}")),
    }
}

/// `fooBar` → `foo_bar`.
fn snake(key: &str) -> String {
    let mut s = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

/// A field by its camelCase name or its snake_case one; JSON null counts as absent.
fn field<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key)
        .or_else(|| o.get(&snake(key)))
        .filter(|v| !v.is_null())
}

fn warn_unknown(what: &str, o: &Obj, known: &[&str]) {
    for k in o.keys() {
        if !known.iter().any(|n| *n == k || snake(n) == *k) {
            eprintln!("berthctl: {what}: ignoring unsupported field {k:?}");
        }
    }
}

fn object<'a>(o: &'a Obj, key: &str) -> anyhow::Result<Option<&'a Obj>> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => bail!("{key}: expected an object, got {v}"),
    }
}

fn string(o: &Obj, key: &str) -> anyhow::Result<String> {
    match field(o, key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => bail!("{key}: expected a string, got {v}"),
    }
}

fn boolean(o: &Obj, key: &str) -> anyhow::Result<bool> {
    match field(o, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => bail!("{key}: expected true or false, got {v}"),
    }
}

fn uint(o: &Obj, key: &str) -> anyhow::Result<u32> {
    match field(o, key) {
        None => Ok(0),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("{key}: {n} is not a 32-bit unsigned integer")),
        Some(Value::String(s)) => s
            .parse()
            .with_context(|| format!("{key}: {s:?} is not a 32-bit unsigned integer")),
        Some(v) => bail!("{key}: expected a number, got {v}"),
    }
}

/// `{"value": N}` (the proto wrapper) or a bare number.
fn int64_value(o: &Obj, key: &str) -> anyhow::Result<Option<cri::Int64Value>> {
    let v = match field(o, key) {
        None => return Ok(None),
        Some(Value::Object(m)) => match m.get("value") {
            Some(v) => v,
            None => return Ok(Some(cri::Int64Value { value: 0 })),
        },
        Some(v) => v,
    };
    let value = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .with_context(|| format!("{key}: {v} is not an integer"))?;
    Ok(Some(cri::Int64Value { value }))
}

fn array<'a>(o: &'a Obj, key: &str) -> anyhow::Result<&'a [Value]> {
    match field(o, key) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => bail!("{key}: expected an array, got {v}"),
    }
}

fn strings(o: &Obj, key: &str) -> anyhow::Result<Vec<String>> {
    array(o, key)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .with_context(|| format!("{key}: expected strings, got {v}"))
        })
        .collect()
}

fn string_map(o: &Obj, key: &str) -> anyhow::Result<HashMap<String, String>> {
    match field(o, key) {
        None => Ok(HashMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                v => bail!("{key}.{k}: expected a string, got {v}"),
            })
            .collect(),
        Some(v) => bail!("{key}: expected an object of strings, got {v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Obj {
        match v {
            Value::Object(o) => o,
            _ => Map::new(),
        }
    }

    #[test]
    fn pod_config_camel_and_snake() -> anyhow::Result<()> {
        let o = obj(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "attempt": 2},
            "log_directory": "/tmp/logs",
            "hostname": "h",
            "labels": {"a": "b"},
            "dnsConfig": {"servers": ["10.0.0.1"], "searches": ["x"]},
            "linux": {
                "cgroupParent": "/kubepods/pod1",
                "securityContext": {"namespaceOptions": {"network": "NODE", "pid": 1, "ipc": "pod"}}
            }
        }));
        let c = pod_config(&o)?;
        let m = c.metadata.context("metadata")?;
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("p", "ns", "u1", 2)
        );
        assert_eq!(c.log_directory, "/tmp/logs");
        assert_eq!(c.labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(c.dns_config.context("dns")?.servers, vec!["10.0.0.1"]);
        let l = c.linux.context("linux")?;
        assert_eq!(l.cgroup_parent, "/kubepods/pod1");
        let ns = l
            .security_context
            .and_then(|s| s.namespace_options)
            .context("namespace options")?;
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
        assert_eq!(ns.ipc, cri::NamespaceMode::Pod as i32);
        Ok(())
    }

    #[test]
    fn container_config_fields() -> anyhow::Result<()> {
        let o = obj(serde_json::json!({
            "metadata": {"name": "c"},
            "image": {"image": "busybox"},
            "command": ["sleep"], "args": ["10"],
            "envs": [{"key": "A", "value": "1"}],
            "mounts": [{"containerPath": "/data", "hostPath": "/tmp", "readonly": true}],
            "log_path": "c.log", "tty": true,
            "linux": {"securityContext": {"namespaceOptions": {"pid": "CONTAINER"}, "runAsUser": {"value": 1000}}}
        }));
        let c = container_config(&o)?;
        assert_eq!(c.image.context("image")?.image, "busybox");
        assert_eq!(
            (c.command, c.args),
            (vec!["sleep".to_string()], vec!["10".to_string()])
        );
        assert_eq!(c.envs[0].key, "A");
        assert!(c.mounts[0].readonly && c.mounts[0].container_path == "/data");
        assert_eq!(c.log_path, "c.log");
        assert!(c.tty);
        let s = c
            .linux
            .and_then(|l| l.security_context)
            .context("security")?;
        assert_eq!(s.run_as_user.map(|u| u.value), Some(1000));
        assert_eq!(
            s.namespace_options.map(|n| n.pid),
            Some(cri::NamespaceMode::Container as i32)
        );
        Ok(())
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(pod_config(&obj(serde_json::json!({"hostname": "x"}))).is_err());
        let bad_mode = serde_json::json!({"metadata": {"name": "p"},
            "linux": {"securityContext": {"namespaceOptions": {"network": "HOST"}}}});
        assert!(pod_config(&obj(bad_mode)).is_err());
        let bad_attempt = serde_json::json!({"metadata": {"name": "p", "attempt": -1}});
        assert!(pod_config(&obj(bad_attempt)).is_err());
        assert!(container_config(&obj(serde_json::json!({"metadata": {"name": "c"}}))).is_err());
    }
}
