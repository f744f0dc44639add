//! Running one CNI plugin per the spec: `CNI_*` environment, the network config on stdin,
//! a result or an error as JSON on stdout, all within a deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

use super::config::NetworkConfig;

/// The CNI operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Del,
    Check,
}

impl Op {
    /// `CNI_COMMAND`'s value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
            Op::Check => "CHECK",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a plugin call failed; every message names the plugin and the operation.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No executable of that name in any bin dir.
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    NotFound { plugin: String, dirs: String },
    /// The process could not be started or read.
    #[error("CNI plugin {plugin:?} {op}: running {path}: {error}")]
    Spawn {
        plugin: String,
        op: Op,
        path: PathBuf,
        error: std::io::Error,
    },
    /// It did not finish in time (it was killed).
    #[error("CNI plugin {plugin:?} {op}: timed out after {} ms (killed)", .timeout.as_millis())]
    Timeout {
        plugin: String,
        op: Op,
        timeout: Duration,
    },
    /// It exited non-zero; `msg` is its error JSON's `msg` and `details` (or its output).
    #[error("CNI plugin {plugin:?} {op} failed{}: {msg}", .code.map(|c| format!(" (code {c})")).unwrap_or_default())]
    Failed {
        plugin: String,
        op: Op,
        code: Option<u64>,
        msg: String,
    },
    /// It exited 0 but its output is not a JSON result.
    #[error("CNI plugin {plugin:?} {op}: malformed result JSON ({error}); output: {output:?}")]
    Malformed {
        plugin: String,
        op: Op,
        error: String,
        output: String,
    },
}

/// One call's parameters besides the config.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    pub op: Op,
    /// `CNI_CONTAINERID`: the sandbox id.
    pub container_id: &'a str,
    /// `CNI_NETNS`: the pinned netns (empty for a DEL whose netns is gone).
    pub netns: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
}

/// A successful call: the result (ADD only) and how long the plugin ran.
#[derive(Debug)]
pub struct Output {
    pub result: Option<Value>,
    pub elapsed: Duration,
}

/// Finds and runs plugins.
#[derive(Debug, Clone)]
pub struct Invoker {
    pub bin_dirs: Vec<PathBuf>,
    pub timeout: Duration,
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn clip(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The stdin of plugin `i` of `conf`: its own config plus the list's `name` and `cniVersion`,
/// `prevResult` when given, and `runtimeConfig` with the capabilities it asks for.
pub fn plugin_stdin(
    conf: &NetworkConfig,
    i: usize,
    prev: Option<&Value>,
    runtime_config: &Map<String, Value>,
) -> Value {
    let mut obj = conf.plugins.get(i).cloned().unwrap_or_default();
    obj.insert("name".into(), Value::String(conf.name.clone()));
    obj.insert("cniVersion".into(), Value::String(conf.cni_version.clone()));
    if let Some(prev) = prev {
        obj.insert("prevResult".into(), prev.clone());
    }
    let wanted: Map<String, Value> = runtime_config
        .iter()
        .filter(|(k, _)| conf.plugin_wants(i, k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !wanted.is_empty() {
        obj.insert("runtimeConfig".into(), Value::Object(wanted));
    }
    Value::Object(obj)
}

impl Invoker {
    /// `CNI_PATH`: the bin dirs, colon-separated.
    pub fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// The executable for plugin type `ty`: the first bin dir holding it.
    pub fn find(&self, ty: &str) -> Result<PathBuf, PluginError> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(ty))
            .find(|p| is_executable(p))
            .ok_or_else(|| PluginError::NotFound {
                plugin: ty.to_string(),
                dirs: self.cni_path().replace(':', ", "),
            })
    }

    /// Runs plugin `ty` with `stdin`; ADD's stdout must be a JSON object. Counted, with its
    /// time, in berthd's metrics.
    pub async fn exec(
        &self,
        ty: &str,
        stdin: &Value,
        inv: &Invocation<'_>,
    ) -> Result<Output, PluginError> {
        let started = Instant::now();
        let out = self.run(ty, stdin, inv).await;
        let result = if out.is_ok() { "success" } else { "failure" };
        crate::metrics::prometheus::runtime()
            .cni_seconds
            .get_or_create(&[
                ("operation", inv.op.as_str().to_string()),
                ("result", result.to_string()),
            ])
            .observe(started.elapsed().as_secs_f64());
        out
    }

    async fn run(
        &self,
        ty: &str,
        stdin: &Value,
        inv: &Invocation<'_>,
    ) -> Result<Output, PluginError> {
        let path = self.find(ty)?;
        let spawn_err = |error| PluginError::Spawn {
            plugin: ty.to_string(),
            op: inv.op,
            path: path.clone(),
            error,
        };
        let input = serde_json::to_vec(stdin).map_err(|e| spawn_err(std::io::Error::other(e)))?;
        let mut cmd = tokio::process::Command::new(&path);
        cmd.env("CNI_COMMAND", inv.op.as_str())
            .env("CNI_CONTAINERID", inv.container_id)
            .env("CNI_NETNS", inv.netns)
            .env("CNI_IFNAME", inv.ifname)
            .env("CNI_ARGS", inv.args)
            .env("CNI_PATH", self.cni_path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Its own process group, so a timeout kills whatever it started too.
            .process_group(0)
            .kill_on_drop(true);
        let parent = rustix::process::getpid();
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe prctl(2) and getppid(2) system calls, allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // A plugin call dies with the thread that started it (a runtime worker, which
                // lives as long as berthd), so a berthd killed by SIGKILL leaves no plugin
                // hanging; after the restart the pod's record leads to a DEL.
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("berthd exited"));
                }
                Ok(())
            });
        }
        if std::env::var_os("PATH").is_none() {
            // Plugins such as portmap and bridge run iptables.
            cmd.env("PATH", DEFAULT_PATH);
        }
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let pgid = child.id();
        let stdin_pipe = child.stdin.take();
        let run = async move {
            let write = async move {
                if let Some(mut pipe) = stdin_pipe {
                    // A plugin that exits without reading its stdin is not an error here.
                    let _ = pipe.write_all(&input).await;
                }
            };
            let ((), out) = tokio::join!(write, child.wait_with_output());
            out
        };
        let out = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(spawn_err(e)),
            Err(_) => {
                if let Some(pid) = pgid
                    .and_then(|p| i32::try_from(p).ok())
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                return Err(PluginError::Timeout {
                    plugin: ty.to_string(),
                    op: inv.op,
                    timeout: self.timeout,
                });
            }
        };
        let elapsed = started.elapsed();
        if !out.status.success() {
            return Err(failure(ty, inv.op, &out));
        }
        if inv.op != Op::Add {
            return Ok(Output {
                result: None,
                elapsed,
            });
        }
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v @ Value::Object(_)) => Ok(Output {
                result: Some(v),
                elapsed,
            }),
            Ok(_) => Err(PluginError::Malformed {
                plugin: ty.to_string(),
                op: inv.op,
                error: "not a JSON object".into(),
                output: clip(&out.stdout),
            }),
            Err(e) => Err(PluginError::Malformed {
                plugin: ty.to_string(),
                op: inv.op,
                error: e.to_string(),
                output: clip(&out.stdout),
            }),
        }
    }
}

/// The error of a plugin that exited non-zero: its error JSON, else its output.
fn failure(ty: &str, op: Op, out: &std::process::Output) -> PluginError {
    let parsed = serde_json::from_slice::<Value>(&out.stdout).ok();
    let (code, msg) = match parsed.as_ref().filter(|v| v.get("msg").is_some()) {
        Some(v) => {
            let msg = v.get("msg").and_then(Value::as_str).unwrap_or_default();
            let details = v.get("details").and_then(Value::as_str).unwrap_or_default();
            let text = if details.is_empty() {
                msg.to_string()
            } else {
                format!("{msg}: {details}")
            };
            (v.get("code").and_then(Value::as_u64), text)
        }
        None => {
            let text = [clip(&out.stderr), clip(&out.stdout)]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            let text = if text.is_empty() {
                format!("{} with no output", out.status)
            } else {
                text
            };
            (None, text)
        }
    };
    PluginError::Failed {
        plugin: ty.to_string(),
        op,
        code,
        msg,
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
