//! CDI container edits applied to a container's OCI spec: environment (a name set again
//! replaces the image's or the request's value), device nodes with their device-cgroup rules,
//! bind mounts, OCI hooks and additional groups.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, HookBuilder, Hooks, LinuxDevice, LinuxDeviceBuilder, LinuxDeviceType, Mount,
    MountBuilder, Spec,
};

use super::spec_file::{ContainerEdits, DeviceNode};
use crate::runtime::spec;

/// Why an edit cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("{what}: {why}")]
    Invalid { what: String, why: String },
}

fn invalid(what: impl Into<String>, why: impl Into<String>) -> EditError {
    EditError::Invalid {
        what: what.into(),
        why: why.into(),
    }
}

/// Applies `edits` (of CDI device or spec file `source`) to `oci`.
pub fn apply(oci: &mut Spec, edits: &ContainerEdits, source: &str) -> Result<(), EditError> {
    if edits.intel_rdt.is_some() {
        return Err(invalid(source, "intelRdt edits are not applied by Berth"));
    }
    if !edits.net_devices.is_empty() {
        return Err(invalid(source, "netDevices edits are not applied by Berth"));
    }
    apply_env(oci, &edits.env, source)?;
    for (i, node) in edits.device_nodes.iter().enumerate() {
        apply_device(oci, node, &format!("{source} deviceNodes[{i}]"))?;
    }
    for (i, m) in edits.mounts.iter().enumerate() {
        apply_mount(oci, m, &format!("{source} mounts[{i}]"))?;
    }
    for (i, h) in edits.hooks.iter().enumerate() {
        apply_hook(oci, h, &format!("{source} hooks[{i}]"))?;
    }
    if !edits.additional_gids.is_empty()
        && let Some(process) = oci.process_mut()
    {
        let user = process.user_mut();
        let mut gids = user.additional_gids().clone().unwrap_or_default();
        for g in edits.additional_gids.iter().filter(|g| **g != 0) {
            if !gids.contains(g) {
                gids.push(*g);
            }
        }
        user.set_additional_gids(Some(gids));
    }
    Ok(())
}

fn apply_env(oci: &mut Spec, env: &[String], source: &str) -> Result<(), EditError> {
    if env.is_empty() {
        return Ok(());
    }
    let Some(process) = oci.process_mut() else {
        return Ok(());
    };
    let mut all = process.env().clone().unwrap_or_default();
    for e in env {
        let Some((name, _)) = e.split_once('=').filter(|(n, _)| !n.is_empty()) else {
            return Err(invalid(source, format!("env {e:?} is not NAME=value")));
        };
        all.retain(|x| x.split_once('=').map_or(x.as_str(), |(n, _)| n) != name);
        all.push(e.clone());
    }
    process.set_env(Some(all));
    Ok(())
}

fn apply_device(oci: &mut Spec, node: &DeviceNode, what: &str) -> Result<(), EditError> {
    let dest = PathBuf::from(&node.path);
    if !dest.is_absolute() {
        return Err(invalid(
            what,
            format!("path {:?} is not absolute", node.path),
        ));
    }
    let host = PathBuf::from(node.host_path.as_deref().unwrap_or(&node.path));
    let perms = node.permissions.as_deref().unwrap_or("rwm");
    if perms.is_empty() || !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(invalid(
            what,
            format!("permissions {perms:?} are not a subset of \"rwm\""),
        ));
    }
    let stat = spec::device_type_and_numbers(&host).ok().flatten();
    let typ = match node.typ.as_deref() {
        Some("c") | Some("u") => LinuxDeviceType::C,
        Some("b") => LinuxDeviceType::B,
        Some("p") => LinuxDeviceType::P,
        Some(t) => return Err(invalid(what, format!("type {t:?} is not c, b, u or p"))),
        None => match &stat {
            Some(s) => s.0,
            None => {
                return Err(invalid(
                    what,
                    format!("{} is not a device node on this host", host.display()),
                ));
            }
        },
    };
    let numbers = match (node.major, node.minor, &stat) {
        (Some(major), Some(minor), _) => Some((major, minor)),
        (_, _, Some(s)) => Some((node.major.unwrap_or(s.1), node.minor.unwrap_or(s.2))),
        _ => None,
    };
    let mut b = LinuxDeviceBuilder::default().path(dest.clone()).typ(typ);
    if typ != LinuxDeviceType::P {
        let Some((major, minor)) = numbers else {
            return Err(invalid(
                what,
                format!(
                    "no major and minor given and {} is not a device",
                    host.display()
                ),
            ));
        };
        b = b.major(major).minor(minor);
    }
    if let Some(mode) = node.file_mode.or(stat.map(|s| s.3)) {
        b = b.file_mode(mode & 0o7777);
    }
    if let Some(uid) = node.uid.or(stat.map(|s| s.4)) {
        b = b.uid(uid);
    }
    if let Some(gid) = node.gid.or(stat.map(|s| s.5)) {
        b = b.gid(gid);
    }
    let device: LinuxDevice = b.build().map_err(|e| invalid(what, e.to_string()))?;
    let rule = (typ != LinuxDeviceType::P)
        .then(|| spec::allow_rule(Some(typ), numbers.map(|n| n.0), numbers.map(|n| n.1), perms))
        .transpose()
        .map_err(|e| invalid(what, e.to_string()))?;
    let Some(linux) = oci.linux_mut() else {
        return Err(invalid(what, "the spec has no linux section"));
    };
    let mut devices = linux.devices().clone().unwrap_or_default();
    devices.retain(|d| d.path() != &dest);
    devices.push(device);
    linux.set_devices(Some(devices));
    if let Some(rule) = rule {
        let mut resources = linux.resources().clone().unwrap_or_default();
        let mut rules = resources.devices().clone().unwrap_or_default();
        rules.push(rule);
        resources.set_devices(Some(rules));
        linux.set_resources(Some(resources));
    }
    Ok(())
}

fn apply_mount(oci: &mut Spec, m: &super::spec_file::Mount, what: &str) -> Result<(), EditError> {
    let dest = Path::new(&m.container_path);
    if !dest.is_absolute() {
        return Err(invalid(
            what,
            format!("containerPath {:?} is not absolute", m.container_path),
        ));
    }
    if !Path::new(&m.host_path).is_absolute() {
        return Err(invalid(
            what,
            format!("hostPath {:?} is not absolute", m.host_path),
        ));
    }
    let typ = m
        .typ
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "bind".into());
    let mut options = m.options.clone();
    if typ == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.push("bind".into());
    }
    let mount: Mount = MountBuilder::default()
        .destination(dest)
        .source(&m.host_path)
        .typ(typ)
        .options(options)
        .build()
        .map_err(|e| invalid(what, e.to_string()))?;
    let mut mounts = oci.mounts().clone().unwrap_or_default();
    mounts.retain(|x| x.destination() != dest);
    mounts.push(mount);
    oci.set_mounts(Some(mounts));
    Ok(())
}

fn apply_hook(oci: &mut Spec, h: &super::spec_file::Hook, what: &str) -> Result<(), EditError> {
    if !Path::new(&h.path).is_absolute() {
        return Err(invalid(what, format!("path {:?} is not absolute", h.path)));
    }
    let mut b = HookBuilder::default().path(&h.path);
    if !h.args.is_empty() {
        b = b.args(h.args.clone());
    }
    if !h.env.is_empty() {
        b = b.env(h.env.clone());
    }
    if let Some(t) = h.timeout {
        if t <= 0 {
            return Err(invalid(what, format!("timeout {t} is not positive")));
        }
        b = b.timeout(t);
    }
    let hook: Hook = b.build().map_err(|e| invalid(what, e.to_string()))?;
    let mut hooks: Hooks = oci.hooks().clone().unwrap_or_default();
    let list = match h.hook_name.as_str() {
        #[allow(deprecated)]
        "prestart" => hooks.prestart_mut(),
        "createRuntime" => hooks.create_runtime_mut(),
        "createContainer" => hooks.create_container_mut(),
        "startContainer" => hooks.start_container_mut(),
        "poststart" => hooks.poststart_mut(),
        "poststop" => hooks.poststop_mut(),
        other => {
            return Err(invalid(
                what,
                format!("hookName {other:?} is not an OCI hook"),
            ));
        }
    };
    list.get_or_insert_with(Vec::new).push(hook);
    oci.set_hooks(Some(hooks));
    Ok(())
}
