//! What a process exec'd into the container runs as: the container's own process spec (user,
//! groups, capabilities, no_new_privs, rlimits) with the exec's args, env and working directory,
//! so `kubectl exec` and probes keep the container's security context.

use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{Process, Spec};

use crate::error::ShimError;

/// The bundle's OCI spec.
pub fn load_spec(bundle: &Path) -> Result<Spec, ShimError> {
    let path = bundle.join("config.json");
    Spec::load(&path)
        .map_err(|e| ShimError::Precondition(format!("reading {}: {e}", path.display())))
}

/// The container's process with `args`; `env` entries override the container's by name;
/// `cwd` replaces its working directory when given.
pub fn exec_process(
    spec: &Spec,
    args: Vec<String>,
    env: &[String],
    cwd: Option<PathBuf>,
    terminal: bool,
) -> Result<Process, ShimError> {
    let mut process = spec
        .process()
        .clone()
        .ok_or_else(|| ShimError::Precondition("the container's spec has no process".into()))?;
    let mut merged: Vec<String> = process.env().clone().unwrap_or_default();
    for kv in env {
        let key = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
        merged.retain(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) != key);
        merged.push(kv.clone());
    }
    process
        .set_args(Some(args))
        .set_env(Some(merged))
        .set_terminal(Some(terminal))
        .set_console_size(None)
        // The container's (possibly lower) score stays the container's: an exec'd process
        // keeps the shim's, which root here could not lower anyway.
        .set_oom_score_adj(None);
    if let Some(cwd) = cwd {
        process.set_cwd(cwd);
    }
    Ok(process)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_process_keeps_the_user_and_overrides_env_by_name() {
        let json = r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"},"process":{
            "user":{"uid":1000,"gid":3000,"additionalGids":[4000]},
            "args":["sleep","1"],"env":["PATH=/bin","A=1"],"cwd":"/work",
            "noNewPrivileges":true,"oomScoreAdj":-997}}"#;
        let spec: Spec = serde_json::from_str(json).expect("spec");
        let p = exec_process(
            &spec,
            vec!["id".into()],
            &["A=2".into(), "B=3".into()],
            None,
            false,
        )
        .expect("process");
        assert_eq!(p.user().uid(), 1000);
        assert_eq!(p.user().gid(), 3000);
        assert_eq!(p.user().additional_gids().as_deref(), Some(&[4000][..]));
        assert_eq!(p.args().as_deref(), Some(&["id".to_string()][..]));
        assert_eq!(
            p.env().as_deref(),
            Some(&["PATH=/bin".to_string(), "A=2".into(), "B=3".into()][..])
        );
        assert_eq!(p.cwd().as_path(), Path::new("/work"));
        assert_eq!(p.no_new_privileges(), Some(true));
        assert_eq!(p.oom_score_adj(), None);
        let p =
            exec_process(&spec, vec!["x".into()], &[], Some("/tmp".into()), true).expect("process");
        assert_eq!(
            (p.cwd().as_path(), p.terminal()),
            (Path::new("/tmp"), Some(true))
        );
    }
}
