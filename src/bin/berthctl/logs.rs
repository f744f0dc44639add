//! `berthctl logs`: a container's log from its CRI log file, as `kubectl logs` shows it
//! (follow, tail, since, timestamps, limit, the previous instance).

use anyhow::{Context, bail};
use berth::client::CriClient;
use berth::logs::LogOptions;
use k8s_cri::v1 as cri;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What to show.
#[derive(clap::Args)]
pub struct LogsArgs {
    /// Container id (or a unique prefix).
    pub container: String,
    /// Keep printing as the container writes, until it ends.
    #[arg(long, short)]
    pub follow: bool,
    /// Only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// Only lines newer than a duration (`30s`, `5m`, `2h`) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Prefix each line with its time.
    #[arg(long, short)]
    pub timestamps: bool,
    /// Stop after N bytes.
    #[arg(long, value_name = "N")]
    pub limit_bytes: Option<u64>,
    /// The log of the same container's previous instance in its pod.
    #[arg(long, short)]
    pub previous: bool,
}

/// `30s`, `5m`, `2h`, `1h30m` (as kubectl's `--since`) or an RFC 3339 time.
fn since(text: &str, now: Timestamp) -> anyhow::Result<Timestamp> {
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let mut secs = 0i64;
    let mut number = String::new();
    for ch in text.chars() {
        if ch.is_ascii_digit() {
            number.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => bail!("--since {text:?}: not a duration (30s, 5m, 2h) or an RFC 3339 time"),
        };
        let n: i64 = number
            .parse()
            .with_context(|| format!("--since {text:?}: a number must come before {ch:?}"))?;
        secs = secs.saturating_add(n.saturating_mul(unit));
        number.clear();
    }
    if !number.is_empty() || secs == 0 {
        bail!("--since {text:?}: not a duration (30s, 5m, 2h) or an RFC 3339 time");
    }
    now.checked_sub(SignedDuration::from_secs(secs))
        .map_err(|e| anyhow::anyhow!("--since {text:?}: {e}"))
}

async fn status(client: &CriClient, id: &str) -> anyhow::Result<cri::ContainerStatus> {
    client
        .runtime()
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await
        .map_err(|e| anyhow::anyhow!("container {id}: {}", e.message()))?
        .into_inner()
        .status
        .with_context(|| format!("container {id}: the runtime gave no status"))
}

/// The instance of the same container (same pod, same name) created just before `of`.
async fn previous(client: &CriClient, of: &cri::ContainerStatus) -> anyhow::Result<String> {
    let name = of
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let all = client
        .runtime()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|e| anyhow::anyhow!("ListContainers: {}", e.message()))?
        .into_inner()
        .containers;
    let Some(mine) = all.iter().find(|c| c.id == of.id) else {
        bail!("container {} is gone", of.id);
    };
    all.iter()
        .filter(|c| {
            c.pod_sandbox_id == mine.pod_sandbox_id
                && c.metadata.as_ref().is_some_and(|m| m.name == name)
                && c.created_at < mine.created_at
        })
        .max_by_key(|c| c.created_at)
        .map(|c| c.id.clone())
        .with_context(|| {
            format!(
                "previous terminated container {name:?} of {} not found",
                of.id
            )
        })
}

/// Prints the log.
pub async fn logs(client: &CriClient, args: LogsArgs) -> anyhow::Result<()> {
    let opts = LogOptions {
        follow: args.follow,
        tail_lines: args.tail,
        since: args
            .since
            .as_deref()
            .map(|s| since(s, Timestamp::now()))
            .transpose()?,
        timestamps: args.timestamps,
        limit_bytes: args.limit_bytes,
    };
    let mut st = status(client, &args.container).await?;
    if args.previous {
        let id = previous(client, &st).await?;
        st = status(client, &id).await?;
    }
    if st.log_path.is_empty() {
        bail!("container {} has no log file", st.id);
    }
    let path = std::path::PathBuf::from(&st.log_path);
    let id = st.id.clone();
    let client = client.clone();
    let handle = tokio::runtime::Handle::current();
    let mut was_running = st.state == cri::ContainerState::ContainerRunning as i32;
    let copied = tokio::task::spawn_blocking(move || {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut running = || {
            was_running = was_running
                && handle
                    .block_on(status(&client, &id))
                    .is_ok_and(|s| s.state == cri::ContainerState::ContainerRunning as i32);
            was_running
        };
        berth::logs::copy(&path, &opts, &mut out, &mut running)
            .with_context(|| format!("reading {}", path.display()))
    })
    .await
    .context("log reader")?;
    match copied {
        Ok(_) => Ok(()),
        // `berthctl logs ... | head` closes the pipe early: not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_and_times() {
        let now: Timestamp = "2026-12-03T10:00:00Z".parse().expect("now");
        let at = |s: &str| since(s, now).map(|t| t.to_string());
        assert_eq!(at("30s").expect("30s"), "2026-12-03T09:59:30Z");
        assert_eq!(at("1h30m").expect("1h30m"), "2026-12-03T08:30:00Z");
        assert_eq!(
            at("2026-12-01T00:00:00Z").expect("time"),
            "2026-12-01T00:00:00Z"
        );
        for bad in ["", "5", "m", "5d", "yesterday"] {
            assert!(since(bad, now).is_err(), "{bad}");
        }
    }
}
