//! The CRI ContainerConfig of one of a pod's containers.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, EnvVarSource, Pod, PodSecurityContext};

use super::labels;
use super::resources;
use crate::agent::pods::terminate;
use crate::agent::volumes::downward::{self, NodeAllocatable};
use crate::agent::volumes::objects::{EnvObjects, Kind};

/// What a container config needs beyond the pod and the container.
pub struct ContainerContext<'a> {
    /// The pod's QoS class.
    pub qos: &'a str,
    /// The node's memory capacity in bytes (for oom_score_adj).
    pub memory_capacity: f64,
    /// Pod IP (for `status.podIP` in the downward API env).
    pub pod_ip: &'a str,
    /// Node IP (for `status.hostIP`).
    pub host_ip: &'a str,
    /// Node name (for `spec.nodeName`).
    pub node_name: &'a str,
    /// Image reference to run (the resolved image id or the spec's reference).
    pub image: &'a str,
    /// The node's swap and the configured swap behaviour.
    pub swap: &'a resources::NodeSwap,
    /// An OOM kill ends the whole container (`memory.oom.group`, cgroup v2).
    pub oom_group: bool,
    /// The configMaps and secrets env and envFrom name, read from the API server (None on a
    /// node without one: such values are refused).
    pub objects: Option<&'a EnvObjects>,
}

/// The config for restart number `restart_count` of container `c` in `pod`; an env value that
/// cannot be resolved is an error (the kubelet's CreateContainerConfigError).
pub fn container_config(
    pod: &Pod,
    c: &Container,
    restart_count: u32,
    ctx: &ContainerContext<'_>,
) -> Result<cri::ContainerConfig, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    let psc = spec.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let mut envs: Vec<cri::KeyValue> = Vec::new();
    let set = |envs: &mut Vec<cri::KeyValue>, key: String, value: String| {
        envs.retain(|kv| kv.key != key);
        envs.push(cri::KeyValue { key, value });
    };
    for (k, v) in ctx.objects.map(EnvObjects::services).unwrap_or_default() {
        set(&mut envs, k.clone(), v.clone());
    }
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let source = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), _) => Some((Kind::ConfigMap, r.name.as_str(), r.optional)),
            (None, Some(r)) => Some((Kind::Secret, r.name.as_str(), r.optional)),
            (None, None) => None,
        };
        let Some((kind, name, optional)) = source else {
            continue;
        };
        let objects = ctx.objects.ok_or_else(|| no_api(kind))?;
        for (k, v) in objects.all(kind, name, optional.unwrap_or(false))? {
            let key = format!("{prefix}{k}");
            // Keys that are not env names are skipped, as the kubelet skips them.
            if !key.is_empty() && !key.contains('=') && !key.contains('\0') {
                set(&mut envs, key, v);
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => Some(expand(v, &envs)),
            (None, Some(from)) => match object_key(from) {
                Some((kind, name, key, optional)) => ctx
                    .objects
                    .ok_or_else(|| {
                        format!("couldn't find key for env {:?}: {}", e.name, no_api(kind))
                    })?
                    .value(kind, name, key, optional)?,
                None => Some(
                    downward_env(from, pod, c, ctx)
                        .map_err(|why| format!("couldn't find key for env {:?}: {why}", e.name))?,
                ),
            },
            (None, None) => Some(String::new()),
        };
        if let Some(value) = value {
            set(&mut envs, e.name.clone(), value);
        }
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: ctx.image.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c
            .command
            .iter()
            .flatten()
            .map(|a| expand(a, &envs))
            .collect(),
        args: c.args.iter().flatten().map(|a| expand(a, &envs)).collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        labels: labels::container_labels(pod, c),
        annotations: labels::container_annotations(c, restart_count, grace),
        log_path: format!("{}/{}.log", c.name, restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources::linux_resources(
                c,
                terminate::is_critical(pod),
                ctx.qos,
                ctx.memory_capacity,
                ctx.swap,
                ctx.oom_group,
            )),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: Some(cri::Capability {
                    add_capabilities: caps.add.clone().unwrap_or_default(),
                    drop_capabilities: caps.drop.clone().unwrap_or_default(),
                    ..Default::default()
                }),
                privileged,
                namespace_options: Some(namespace_options(pod)),
                run_as_user: sc
                    .run_as_user
                    .or(psc.run_as_user)
                    .map(|value| cri::Int64Value { value }),
                run_as_group: sc
                    .run_as_group
                    .or(psc.run_as_group)
                    .map(|value| cri::Int64Value { value }),
                readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
                supplemental_groups: supplemental_groups(&psc),
                no_new_privs: !privileged && sc.allow_privilege_escalation == Some(false),
                seccomp: Some(seccomp(
                    sc.seccomp_profile.as_ref().or(psc.seccomp_profile.as_ref()),
                )),
                ..apparmor(pod, c, &sc, &psc)
            }),
        }),
        ..Default::default()
    })
}

/// Where `Localhost` seccomp profiles live (the kubelet's directory, so existing nodes' profiles work).
pub const SECCOMP_ROOT: &str = "/var/lib/kubelet/seccomp";

/// A v1 seccomp profile as CRI's; none is Unconfined, as the kubelet sends it by default.
pub fn seccomp(p: Option<&k8s_openapi::api::core::v1::SeccompProfile>) -> cri::SecurityProfile {
    use cri::security_profile::ProfileType;
    match p.map(|p| (p.type_.as_str(), p.localhost_profile.as_deref())) {
        Some(("RuntimeDefault", _)) => cri::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        Some(("Localhost", Some(path))) => cri::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: std::path::Path::new(SECCOMP_ROOT)
                .join(path)
                .display()
                .to_string(),
        },
        _ => cri::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
    }
}

/// The annotation naming a container's AppArmor profile before the securityContext field.
const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The container's AppArmor profile as CRI's fields: its securityContext's, else the pod's,
/// else the annotation's (`runtime/default`, `unconfined`, `localhost/<name>`; any other value
/// goes to the runtime as written, which refuses it naming it); none leaves the runtime's
/// default.
fn apparmor(
    pod: &Pod,
    c: &Container,
    sc: &k8s_openapi::api::core::v1::SecurityContext,
    psc: &k8s_openapi::api::core::v1::PodSecurityContext,
) -> cri::LinuxContainerSecurityContext {
    use cri::security_profile::ProfileType;
    let structured = |kind: ProfileType, name: &str| cri::LinuxContainerSecurityContext {
        apparmor: Some(cri::SecurityProfile {
            profile_type: kind as i32,
            localhost_ref: name.to_string(),
        }),
        ..Default::default()
    };
    if let Some(p) = sc
        .app_armor_profile
        .as_ref()
        .or(psc.app_armor_profile.as_ref())
    {
        return match p.type_.as_str() {
            "RuntimeDefault" => structured(ProfileType::RuntimeDefault, ""),
            "Unconfined" => structured(ProfileType::Unconfined, ""),
            _ => structured(
                ProfileType::Localhost,
                p.localhost_profile.as_deref().unwrap_or_default(),
            ),
        };
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{APPARMOR_ANNOTATION}{}", c.name)));
    match annotation.map(String::as_str) {
        None => cri::LinuxContainerSecurityContext::default(),
        Some("runtime/default") => structured(ProfileType::RuntimeDefault, ""),
        Some("unconfined") => structured(ProfileType::Unconfined, ""),
        Some(v) => match v.strip_prefix("localhost/") {
            Some(name) => structured(ProfileType::Localhost, name),
            #[allow(deprecated)]
            None => cri::LinuxContainerSecurityContext {
                apparmor_profile: v.to_string(),
                ..Default::default()
            },
        },
    }
}

/// The pod's namespace sharing, as the container's namespace options.
fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let mode = |host: Option<bool>| {
        if host.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        }
    };
    cri::NamespaceOption {
        network: mode(spec.host_network),
        ipc: mode(spec.host_ipc),
        pid: if spec.host_pid.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else if spec.share_process_namespace.unwrap_or(false) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ..Default::default()
    }
}

/// `$(VAR)` references to the variables set so far (`$$` escapes), as the kubelet expands env
/// values (against the entries before them) and commands and args (against them all).
fn expand(v: &str, envs: &[cri::KeyValue]) -> String {
    if !v.contains('$') {
        return v.to_string();
    }
    let lookup = |name: &str| {
        envs.iter()
            .find(|kv| kv.key == name)
            .map(|kv| kv.value.clone())
    };
    expand_references(v, lookup).0
}

/// `text` with each `$(NAME)` replaced by `lookup(NAME)` and `$$` by `$`, as the kubelet
/// expands env values, commands and subPathExpr; a reference `lookup` has no value for stays as
/// written, and its name is returned (each once, in order of appearance).
pub fn expand_references(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut unresolved: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(val) => out.push_str(&val),
                None => {
                    out.push_str(&format!("$({name})"));
                    if !unresolved.iter().any(|u| u == name) {
                        unresolved.push(name.to_string());
                    }
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    (out, unresolved)
}

/// The configMap or secret key an env value names: kind, object, key, optional.
fn object_key(from: &EnvVarSource) -> Option<(Kind, &str, &str, bool)> {
    if let Some(r) = &from.config_map_key_ref {
        return Some((
            Kind::ConfigMap,
            r.name.as_str(),
            r.key.as_str(),
            r.optional.unwrap_or(false),
        ));
    }
    from.secret_key_ref.as_ref().map(|r| {
        (
            Kind::Secret,
            r.name.as_str(),
            r.key.as_str(),
            r.optional.unwrap_or(false),
        )
    })
}

/// Why a configMap or secret value cannot be had on a node without an API server.
fn no_api(kind: Kind) -> String {
    match kind {
        Kind::ConfigMap => "config maps need an API server; this node has none".into(),
        Kind::Secret => "secrets need an API server; this node has none".into(),
    }
}

/// An env value from the downward API (fieldRef or resourceFieldRef).
fn downward_env(
    from: &EnvVarSource,
    pod: &Pod,
    c: &Container,
    ctx: &ContainerContext<'_>,
) -> Result<String, String> {
    if let Some(f) = &from.field_ref {
        field_value(f, pod, ctx)
    } else if let Some(sel) = &from.resource_field_ref {
        let target = match sel.container_name.as_deref().filter(|n| !n.is_empty()) {
            None => Ok(c),
            Some(name) => downward::find_container(pod, name),
        };
        // The node's root filesystem stands for its ephemeral storage.
        let node = NodeAllocatable::of_this_node(ctx.memory_capacity, std::path::Path::new("/"));
        target.and_then(|t| downward::resource_value(t, sel, &node))
    } else {
        Err("valueFrom names no source".into())
    }
}

/// Downward-API env values of pod fields: the node's and the pod's addresses and names, and
/// the `metadata.*` fields.
fn field_value(
    sel: &k8s_openapi::api::core::v1::ObjectFieldSelector,
    pod: &Pod,
    ctx: &ContainerContext<'_>,
) -> Result<String, String> {
    match sel.field_path.as_str() {
        "spec.nodeName" => Ok(ctx.node_name.to_string()),
        "spec.serviceAccountName" => Ok(pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default()),
        "status.podIP" => Ok(ctx.pod_ip.to_string()),
        "status.hostIP" => Ok(ctx.host_ip.to_string()),
        p => downward::pod_field(pod, p),
    }
}

/// The groups a pod's processes get besides their own, as the kubelet gives them: the
/// fsGroup (its volumes' group) first, then the pod's supplementalGroups.
pub fn supplemental_groups(psc: &PodSecurityContext) -> Vec<i64> {
    psc.fs_group
        .into_iter()
        .chain(psc.supplemental_groups.iter().flatten().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apparmor_comes_from_the_fields_then_the_annotation() {
        use cri::security_profile::ProfileType;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {
                "container.apparmor.security.beta.kubernetes.io/annotated": "localhost/deny-tmp",
                "container.apparmor.security.beta.kubernetes.io/bogus": "docker-default",
                "container.apparmor.security.beta.kubernetes.io/field": "unconfined"
            }},
            "spec": {"containers": [
                {"name": "annotated"}, {"name": "bogus"}, {"name": "plain"},
                {"name": "field", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "mine"}}}
            ]}
        }))
        .expect("pod");
        let spec = pod.spec.clone().expect("spec");
        let of = |name: &str, psc: &PodSecurityContext| {
            let c = spec.containers.iter().find(|c| c.name == name).expect("c");
            let sc = c.security_context.clone().unwrap_or_default();
            let got = apparmor(&pod, c, &sc, psc);
            #[allow(deprecated)]
            let legacy = got.apparmor_profile.clone();
            (
                got.apparmor.map(|p| (p.profile_type, p.localhost_ref)),
                legacy,
            )
        };
        let none = PodSecurityContext::default();
        let localhost = |n: &str| Some((ProfileType::Localhost as i32, n.to_string()));
        assert_eq!(
            of("annotated", &none),
            (localhost("deny-tmp"), String::new())
        );
        assert_eq!(of("field", &none), (localhost("mine"), String::new()));
        assert_eq!(of("plain", &none), (None, String::new()));
        assert_eq!(of("bogus", &none), (None, "docker-default".to_string()));
        let pod_level: PodSecurityContext = serde_json::from_value(
            serde_json::json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
        )
        .expect("psc");
        assert_eq!(
            of("plain", &pod_level),
            (
                Some((ProfileType::RuntimeDefault as i32, String::new())),
                String::new()
            ),
            "the pod's field"
        );
        assert_eq!(of("field", &pod_level), (localhost("mine"), String::new()));
        assert_eq!(
            of("annotated", &pod_level).0.map(|p| p.0),
            Some(ProfileType::RuntimeDefault as i32),
            "the pod's field over the annotation"
        );
    }

    #[test]
    fn config_carries_labels_env_resources_and_security() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "a1"}},
            "spec": {
                "hostNetwork": true,
                "securityContext": {"runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "c", "image": "busybox",
                    "command": ["sh", "$(N)"], "args": ["-c", "echo $(B) $(NONE) $$(A) $$HOME"],
                    "env": [
                        {"name": "A", "value": "x"},
                        {"name": "EARLY", "value": "$(N)"},
                        {"name": "B", "value": "$(A)-$$(A)"},
                        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
                        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"containerName": "c", "resource": "requests.memory", "divisor": "1Mi"}}}
                    ],
                    "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
                }]
            }
        }))
        .expect("pod");
        let c = &pod.spec.as_ref().expect("spec").containers[0];
        let ctx = ContainerContext {
            qos: "Guaranteed",
            memory_capacity: 1e9,
            pod_ip: "10.0.0.5",
            host_ip: "10.0.0.1",
            node_name: "n",
            image: "sha256:abc",
            swap: &resources::NodeSwap {
                behavior: resources::SwapBehavior::NoSwap,
                swap_capacity: 0,
                controller: true,
                cgroup_v2: false,
            },
            oom_group: true,
            objects: None,
        };
        let cfg = container_config(&pod, c, 3, &ctx).expect("config");
        let unified = |cfg: &cri::ContainerConfig| {
            let r = cfg.linux.as_ref().and_then(|l| l.resources.as_ref());
            r.and_then(|r| r.unified.get("memory.oom.group").cloned())
        };
        assert_eq!(unified(&cfg).as_deref(), Some("1"));
        let single = ContainerContext {
            oom_group: false,
            ..ctx
        };
        assert_eq!(
            unified(&container_config(&pod, c, 3, &single).expect("config")),
            None
        );
        assert_eq!(cfg.metadata.as_ref().map(|m| m.attempt), Some(3));
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.labels[labels::POD_UID], "u1");
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "c");
        assert_eq!(cfg.annotations[labels::RESTART_COUNT], "3");
        let env: std::collections::HashMap<_, _> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(env["B"], "x-$(A)");
        // Env values see only the entries before them; commands and args see them all.
        assert_eq!(env["EARLY"], "$(N)");
        assert_eq!(cfg.command, ["sh", "p"]);
        assert_eq!(cfg.args, ["-c", "echo x-$(A) $(NONE) $(A) $HOME"]);
        assert_eq!(env["N"], "p");
        assert_eq!(env["IP"], "10.0.0.5");
        assert_eq!(env["APP"], "a1");
        assert_eq!(env["CPU"], "500");
        assert_eq!(env["MEM"], "64");
        // A value that cannot be resolved fails the config (CreateContainerConfigError).
        for bad in [
            serde_json::json!({"resourceFieldRef": {"containerName": "nope", "resource": "limits.cpu"}}),
            serde_json::json!({"secretKeyRef": {"name": "s", "key": "k"}}),
        ] {
            let mut broken = c.clone();
            broken.env.get_or_insert_default().push(
                serde_json::from_value(serde_json::json!({"name": "BAD", "valueFrom": bad}))
                    .expect("env var"),
            );
            let err = container_config(&pod, &broken, 0, &ctx).expect_err("unresolvable env");
            assert!(err.contains("\"BAD\""), "{err}");
        }
        let linux = cfg.linux.expect("linux");
        let r = linux.resources.expect("resources");
        assert_eq!(
            (r.cpu_quota, r.cpu_period, r.cpu_shares),
            (50_000, 100_000, 512)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, -997);
        let sc = linux.security_context.expect("security context");
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
        assert!(sc.no_new_privs);
        assert_eq!(
            sc.capabilities.expect("caps").drop_capabilities,
            vec!["ALL"]
        );
        assert_eq!(
            sc.seccomp.map(|s| s.profile_type),
            Some(cri::security_profile::ProfileType::RuntimeDefault as i32)
        );
        assert_eq!(
            sc.namespace_options.map(|n| n.network),
            Some(cri::NamespaceMode::Node as i32)
        );
        assert_eq!(
            seccomp(None).profile_type,
            cri::security_profile::ProfileType::Unconfined as i32
        );
    }

    #[test]
    fn the_fs_group_comes_first_among_the_supplemental_groups() {
        let psc = PodSecurityContext {
            fs_group: Some(123),
            supplemental_groups: Some(vec![5, 6]),
            ..Default::default()
        };
        assert_eq!(supplemental_groups(&psc), vec![123, 5, 6]);
        assert!(supplemental_groups(&PodSecurityContext::default()).is_empty());
    }
}
