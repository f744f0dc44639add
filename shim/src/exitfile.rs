//! The exit file: the init's exit status on disk, written atomically (temp, fsync, rename).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{IoContext, ShimError};

/// How the container's init process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, or 128 + signal for a signal death.
    pub exit_code: i32,
    /// RFC 3339 UTC time with nanoseconds.
    pub exited_at: String,
    pub oom_killed: bool,
}

impl ExitInfo {
    /// "OOMKilled", "Completed" (exit 0) or "Error", as the CRI reports it.
    pub fn reason(&self) -> &'static str {
        if self.oom_killed {
            "OOMKilled"
        } else if self.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::json!({
            "exit_code": self.exit_code,
            "exited_at": self.exited_at,
            "oom_killed": self.oom_killed,
            "reason": self.reason(),
        })
        .to_string()
    }

    /// Writes the JSON to `path` through a temporary file in the same directory.
    pub fn write_atomic(&self, path: &Path) -> Result<(), ShimError> {
        let tmp = path.with_extension("tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .ctx(|| format!("create {}", tmp.display()))?;
        f.write_all(self.to_json().as_bytes())
            .and_then(|()| f.sync_all())
            .ctx(|| format!("write {}", tmp.display()))?;
        drop(f);
        fs::rename(&tmp, path).ctx(|| format!("rename {} to {}", tmp.display(), path.display()))?;
        if let Some(dir) = path.parent() {
            // Make the rename itself durable; a failure here loses nothing already written.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_reasons() -> Result<(), Box<dyn std::error::Error>> {
        let e = ExitInfo {
            exit_code: 137,
            exited_at: "2026-11-29T12:00:00.000000001Z".into(),
            oom_killed: true,
        };
        let v: serde_json::Value = serde_json::from_str(&e.to_json())?;
        assert_eq!(v["exit_code"], 137);
        assert_eq!(v["reason"], "OOMKilled");
        assert_eq!(v["oom_killed"], true);
        let ok = ExitInfo {
            exit_code: 0,
            oom_killed: false,
            ..e.clone()
        };
        assert_eq!(ok.reason(), "Completed");
        let dir = std::env::temp_dir().join(format!("berth-shim-exit-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let p = dir.join("exit.json");
        ok.write_atomic(&p)?;
        let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&p)?)?;
        assert_eq!(v["reason"], "Completed");
        fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
