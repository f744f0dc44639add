//! CheckpointContainer's precondition: CRIU, present and able to run on this kernel.

use std::sync::OnceLock;

/// Why CRIU cannot checkpoint here, in words for the caller: it is not installed, or
/// `criu check` fails (its last error line). Asked once per berthd. Blocking.
pub fn criu_unusable() -> String {
    static REASON: OnceLock<String> = OnceLock::new();
    REASON
        .get_or_init(|| {
            match std::process::Command::new("criu")
                .arg("check")
                .stdin(std::process::Stdio::null())
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    "criu is not installed on this node".to_string()
                }
                Err(e) => format!("criu could not be started: {e}"),
                Ok(out) => {
                    let text = String::from_utf8_lossy(&out.stderr).into_owned()
                        + &String::from_utf8_lossy(&out.stdout);
                    let last = text
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("no output")
                        .trim()
                        .to_string();
                    if out.status.success() {
                        // CRIU works, but Berth does not drive it yet.
                        "Berth does not drive CRIU yet".to_string()
                    } else {
                        format!("`criu check` fails on this node: {last}")
                    }
                }
            }
        })
        .clone()
}
