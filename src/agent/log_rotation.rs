//! Container log rotation, as the kubelet's container log manager: every interval each running
//! container's CRI log is checked, and one larger than `container_log_max_size` is renamed to
//! `<log>.<YYYYmmdd-HHMMSS>` and reopened by the runtime (ReopenContainerLog); older rotated
//! files are gzip-compressed, and only `container_log_max_files` files are kept per container.
//!
//! No line is lost: the shim writes each line with one append, keeps writing into the renamed
//! file until it reopens, and a rotated file is compressed only in a later pass, after the
//! reopen that ended writes to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;

use crate::agent::AgentContext;

/// What a pass over one container's log failed at.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("{what} {path}: {error}")]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("ReopenContainerLog {id}: {status}")]
    Reopen { id: String, status: String },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RotationError {
    let path = path.to_path_buf();
    move |error| RotationError::Io { what, path, error }
}

/// The rotation loop: every `container_log_monitor_interval_secs`, each running container.
pub async fn run(ctx: Arc<AgentContext>) {
    let Some(max_bytes) = ctx.config.container_log_max_bytes() else {
        return;
    };
    let max_files = ctx.config.container_log_max_files.max(2);
    let period = Duration::from_secs_f64(ctx.config.container_log_monitor_interval_secs);
    loop {
        tokio::time::sleep(period).await;
        let running = ctx
            .client
            .runtime()
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    state: Some(cri::ContainerStateValue {
                        state: cri::ContainerState::ContainerRunning as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await;
        let Ok(running) = running else { continue };
        for c in running.into_inner().containers {
            if let Err(e) = rotate_container(&ctx, &c.id, max_bytes, max_files).await {
                tracing::warn!(container = %c.id, error = %e, "container log rotation");
            }
        }
    }
}

/// One container: its log rotated when it is too large (recreated when it is gone).
async fn rotate_container(
    ctx: &AgentContext,
    id: &str,
    max_bytes: u64,
    max_files: u32,
) -> Result<(), RotationError> {
    let status = ctx
        .client
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await;
    let Some(status) = status.ok().and_then(|s| s.into_inner().status) else {
        return Ok(());
    };
    if status.log_path.is_empty() || status.state != cri::ContainerState::ContainerRunning as i32 {
        return Ok(());
    }
    let log = PathBuf::from(&status.log_path);
    let size = match std::fs::metadata(&log) {
        Ok(m) => m.len(),
        // Removed under the container: the runtime makes it again.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return reopen(ctx, id).await,
        Err(e) => return Err(io("reading the size of", &log)(e)),
    };
    if size < max_bytes {
        return Ok(());
    }
    let prepared = {
        let log = log.clone();
        tokio::task::spawn_blocking(move || prepare(&log, max_files)).await
    };
    prepared.unwrap_or_else(|e| {
        Err(RotationError::Io {
            what: "cleaning the rotated logs of",
            path: log.clone(),
            error: std::io::Error::other(e),
        })
    })?;
    let rotated = rotated_name(&log);
    if rotated.exists() {
        // Rotated within the same second already: the next pass does it.
        return Ok(());
    }
    std::fs::rename(&log, &rotated).map_err(io("renaming", &log))?;
    if let Err(e) = reopen(ctx, id).await {
        // The runtime still writes into the renamed file: give it its name back.
        let _ = std::fs::rename(&rotated, &log);
        return Err(e);
    }
    tracing::debug!(container = %id, log = %log.display(), rotated = %rotated.display(), size, "container log rotated");
    Ok(())
}

async fn reopen(ctx: &AgentContext, id: &str) -> Result<(), RotationError> {
    ctx.client
        .runtime()
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.to_string(),
        })
        .await
        .map(|_| ())
        .map_err(|s| RotationError::Reopen {
            id: id.to_string(),
            status: s.message().to_string(),
        })
}

/// `<log>.<YYYYmmdd-HHMMSS>` (UTC), the kubelet's name for a rotated log.
fn rotated_name(log: &Path) -> PathBuf {
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S");
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{stamp}"));
    PathBuf::from(name)
}

/// Before a rotation: leftovers of an interrupted compression removed, the oldest rotated files
/// removed so that, with the live log and the one about to be rotated, `max_files` remain, and
/// every rotated file but the newest compressed.
fn prepare(log: &Path, max_files: u32) -> Result<(), RotationError> {
    let mut rotated = Vec::new();
    for (path, name) in rotated_files(log)? {
        if name.ends_with(".tmp") {
            std::fs::remove_file(&path).map_err(io("removing", &path))?;
        } else {
            rotated.push(path);
        }
    }
    // Names sort by their time stamp.
    rotated.sort();
    let keep = (max_files as usize).saturating_sub(2);
    while rotated.len() > keep {
        let oldest = rotated.remove(0);
        std::fs::remove_file(&oldest).map_err(io("removing", &oldest))?;
    }
    // The newest stays as it is (the kubelet's order); the others are compressed.
    rotated.pop();
    for path in rotated {
        if !path.to_string_lossy().ends_with(".gz") {
            compress(&path)?;
        }
    }
    Ok(())
}

/// The rotated files of `log` (`<log>.<anything>`), with their file names.
fn rotated_files(log: &Path) -> Result<Vec<(PathBuf, String)>, RotationError> {
    let (Some(dir), Some(base)) = (log.parent(), log.file_name()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{}.", base.to_string_lossy());
    let entries = std::fs::read_dir(dir).map_err(io("listing", dir))?;
    Ok(entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&prefix).then(|| (e.path(), name))
        })
        .collect())
}

/// `path` → `path.gz` (written as `path.gz.tmp`, synced, renamed), then `path` removed.
fn compress(path: &Path) -> Result<(), RotationError> {
    let gz = PathBuf::from(format!("{}.gz", path.display()));
    let tmp = PathBuf::from(format!("{}.gz.tmp", path.display()));
    let write = || -> std::io::Result<()> {
        let mut input = std::fs::File::open(path)?;
        let out = std::fs::File::create(&tmp)?;
        let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        std::io::copy(&mut input, &mut encoder)?;
        let out = encoder.finish()?;
        out.sync_all()?;
        let mode = std::fs::metadata(path)?.permissions();
        std::fs::set_permissions(&tmp, mode)?;
        std::fs::rename(&tmp, &gz)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("compressing", path)(e));
    }
    std::fs::remove_file(path).map_err(io("removing", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_keeps_max_files_and_compresses_all_but_the_newest() {
        let dir = std::env::temp_dir().join(format!("berth-logrot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("0.log");
        std::fs::write(&log, "live\n").expect("write");
        for (i, stamp) in [
            "20260101-000001",
            "20260101-000002",
            "20260101-000003",
            "20260101-000004",
        ]
        .iter()
        .enumerate()
        {
            std::fs::write(dir.join(format!("0.log.{stamp}")), format!("line {i}\n"))
                .expect("write");
        }
        std::fs::write(dir.join("0.log.20260101-000002.gz.tmp"), "half").expect("write");
        std::fs::write(dir.join("1.log"), "another container").expect("write");
        prepare(&log, 4).expect("prepare");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "0.log",
                "0.log.20260101-000003.gz",
                "0.log.20260101-000004",
                "1.log"
            ]
        );
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(
                std::fs::File::open(dir.join("0.log.20260101-000003.gz")).expect("open"),
            ),
            &mut text,
        )
        .expect("gunzip");
        assert_eq!(text, "line 2\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
