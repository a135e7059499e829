//! Structured JSON log lines from `tracing`, on stderr or in `--log-file`. stdout is
//! reserved for results and errors (GrootFS's convention, which Garden parses).

use std::path::Path;

use tracing_subscriber::EnvFilter;

pub fn init(level: &str, file: Option<&Path>) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level).map_err(|_| {
        anyhow::anyhow!("log level `{level}` is not one of error, warn, info, debug, trace")
    })?;
    let builder = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false);
    match file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("log file {}: {e}", path.display()))?;
            builder.with_writer(std::sync::Mutex::new(file)).init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}
