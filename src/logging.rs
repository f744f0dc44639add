//! Tracing set-up: a level or `target=level` list from config or flag.
//!
//! Berth's spans (each CRI call, and the steps of creating a pod or a container) are at debug
//! level: with `--log-level debug` (or `berth=debug`) each one logs its time when it closes
//! (`time.busy` spent working, `time.idle` spent waiting: on a lock, a process, a plugin).

use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;

/// Libraries whose debug lines are their own wire traffic (every HTTP/2 frame, pool reuse):
/// kept at info unless the level names them.
const QUIET_LIBRARIES: [&str; 8] = [
    "h2",
    "loona_hpack",
    "hyper",
    "hyper_util",
    "tower",
    "kube_client",
    "rustls",
    "tonic",
];

/// Installs the global subscriber, writing to stderr.
pub fn init(level: &str) -> anyhow::Result<()> {
    let mut filter: Targets = level
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid log level {level:?}: {e}"))?;
    for lib in QUIET_LIBRARIES {
        if !level.contains(lib) {
            filter = filter.with_target(lib, tracing::Level::INFO);
        }
    }
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_span_events(FmtSpan::CLOSE)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(filter)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing logger: {e}"))?;
    Ok(())
}
