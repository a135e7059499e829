//! Structured JSON log lines from `tracing`, on stderr or in `--log-file`. stdout is
//! reserved for results and errors (GrootFS's convention, which Garden parses).
//!
//! Two shapes: lager's (Cloud Foundry's logger, GrootFS's format: Garden relogs an image
//! plugin's stderr by parsing it with lager's `chug`), the default for every command but
//! `daemon`; and tracing's own JSON (`--log-format json`), the daemon's default.

use std::io::Write;
use std::path::Path;

use indicatif::MultiProgress;
use tracing_subscriber::filter::LevelFilter;

/// How log lines are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// lager's lines, `source` `lamina`, each message `lamina.<command>.<event>`.
    Lager { command: &'static str },
    /// tracing-subscriber's JSON.
    Json,
}

impl Format {
    /// The format `name` asks for (`--log-format`, `log_format`), else the command's default.
    pub fn named(name: Option<&str>, command: &'static str) -> anyhow::Result<Format> {
        match name {
            Some("lager") => Ok(Format::Lager { command }),
            Some("json") => Ok(Format::Json),
            Some(other) => anyhow::bail!("log format `{other}` is not one of lager, json"),
            None if command == "daemon" => Ok(Format::Json),
            None => Ok(Format::Lager { command }),
        }
    }
}

/// `bars`: progress bars drawn on stderr, which log lines on stderr must go above.
pub fn init(
    level: &str,
    file: Option<&Path>,
    bars: Option<MultiProgress>,
    format: Format,
) -> anyhow::Result<()> {
    // EnvFilter would take any word as a target name; only plain levels are a level.
    const LEVELS: [&str; 7] = ["off", "fatal", "error", "warn", "info", "debug", "trace"];
    let lower = level.to_ascii_lowercase();
    if !LEVELS.contains(&lower.as_str()) {
        anyhow::bail!("log level `{level}` is not one of {}", LEVELS.join(", "));
    }
    // GrootFS's levels (lager) end at `fatal`, its default; tracing has no level above
    // `error`, which is the nearest: a GrootFS config works unchanged.
    let filter = match lower.as_str() {
        "off" => LevelFilter::OFF,
        "fatal" | "error" => LevelFilter::ERROR,
        "warn" => LevelFilter::WARN,
        "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let file = match file {
        Some(path) => Some(std::sync::Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("log file {}: {e}", path.display()))?,
        ))),
        None => None,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(filter)
        .with_writer(move || -> Box<dyn Write> {
            match (&file, &bars) {
                (Some(file), _) => Box::new(Escaped(LockedFile(file.clone()))),
                (None, Some(bars)) => Box::new(Line {
                    bars: bars.clone(),
                    text: Vec::new(),
                }),
                (None, None) => Box::new(Escaped(std::io::stderr())),
            }
        });
    match format {
        Format::Lager { command } => builder
            .event_format(crate::lager::Lager::new(command))
            .init(),
        Format::Json => builder.json().with_current_span(false).init(),
    }
    Ok(())
}

/// A log line's JSON with DEL and C1 controls escaped (see [`crate::output::escape_c1`]):
/// image strings reach log fields, and serde_json leaves those characters raw. tracing
/// writes each event with one `write_all` of the whole line, so no character is split.
struct Escaped<W: Write>(W);

impl<W: Write> Write for Escaped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self
                .0
                .write_all(crate::output::escape_c1(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The log file, shared by every event's writer.
struct LockedFile(std::sync::Arc<std::sync::Mutex<std::fs::File>>);

impl Write for LockedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut file = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        file.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One event's line, buffered and written whole when the event is done, on stderr with
/// the progress bars lifted out of the way.
struct Line {
    bars: MultiProgress,
    text: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let text = std::mem::take(&mut self.text);
        let text = match String::from_utf8(text) {
            Ok(text) => crate::output::escape_c1(&text).into_bytes(),
            Err(raw) => raw.into_bytes(),
        };
        self.bars.suspend(|| {
            let _ = std::io::stderr().write_all(&text);
        });
    }
}
