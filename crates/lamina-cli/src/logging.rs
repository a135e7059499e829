//! Structured JSON log lines from `tracing`, on stderr or in `--log-file`. stdout is
//! reserved for results and errors (GrootFS's convention, which Garden parses).

use std::path::Path;

use tracing_subscriber::EnvFilter;

pub fn init(level: &str, file: Option<&Path>) -> anyhow::Result<()> {
    // EnvFilter would take any word as a target name; only plain levels are a level.
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
        anyhow::bail!("log level `{level}` is not one of {}", LEVELS.join(", "));
    }
    let filter = EnvFilter::try_new(level)?;
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
