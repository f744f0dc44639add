//! Tracing set-up: a level or `target=level` list from config or flag.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// Installs the global subscriber, writing to stderr.
pub fn init(level: &str) -> anyhow::Result<()> {
    let filter: Targets = level
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid log level {level:?}: {e}"))?;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(filter)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing logger: {e}"))?;
    Ok(())
}
