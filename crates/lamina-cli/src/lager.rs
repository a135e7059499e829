//! Log lines in lager's shape, the format of Cloud Foundry's logger and of GrootFS: Garden
//! reads an image plugin's stderr with lager's `chug` and relogs each line it parses;
//! a line it cannot parse lands in Garden's log as an unparsed error.
//!
//! `{"timestamp":"<seconds since the epoch, nine decimals>","source":"lamina",
//! "message":"lamina.<command>.<event>","log_level":<0 debug, 1 info, 2 error>,
//! "data":{"session":"1",<the event's fields>}}` — lager has no warn level: a warning is
//! an info line with `"warning":true` in its data. An error's cause is `data.error`, a
//! string, as chug reads it.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// lager's levels.
const DEBUG: u8 = 0;
const INFO: u8 = 1;
const ERROR: u8 = 2;

/// Formats each event as one lager line for the command `command`.
pub struct Lager {
    command: &'static str,
}

impl Lager {
    pub fn new(command: &'static str) -> Self {
        Lager { command }
    }

    /// The line for an event with `message`, `level` and `fields`, at `now`.
    fn line(
        &self,
        level: &Level,
        message: &str,
        mut data: Map<String, Value>,
        now: SystemTime,
    ) -> Value {
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let log_level = match *level {
            Level::ERROR => ERROR,
            Level::WARN | Level::INFO => INFO,
            Level::DEBUG | Level::TRACE => DEBUG,
        };
        if *level == Level::WARN {
            data.insert("warning".into(), Value::Bool(true));
        }
        // One process, one session: lager's sessions nest within a process.
        data.insert("session".into(), Value::String("1".into()));
        serde_json::json!({
            "timestamp": format!("{}.{:09}", since.as_secs(), since.subsec_nanos()),
            "source": "lamina",
            "message": format!("lamina.{}.{}", self.command, message),
            "log_level": log_level,
            "data": data,
        })
    }
}

impl<S, N> FormatEvent<S, N> for Lager
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = self.line(
            event.metadata().level(),
            &fields.message,
            fields.data,
            SystemTime::now(),
        );
        writeln!(writer, "{line}")
    }
}

/// An event's fields: its message apart, the rest as lager's data.
#[derive(Default)]
struct Fields {
    message: String,
    data: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match (field.name(), value) {
            ("message", Value::String(text)) => self.message = text,
            (name, value) => {
                self.data.insert(name.to_string(), value);
            }
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_lagers_fields_and_levels() {
        let lager = Lager::new("create");
        let at = UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 5);
        let mut data = Map::new();
        data.insert("id".into(), Value::String("web-1".into()));
        let line = lager.line(&Level::WARN, "created rootfs", data, at);
        assert_eq!(
            line,
            serde_json::json!({
                "timestamp": "1700000000.000000005",
                "source": "lamina",
                "message": "lamina.create.created rootfs",
                "log_level": 1,
                "data": {"id": "web-1", "warning": true, "session": "1"},
            })
        );
        let levels: Vec<Value> = [Level::TRACE, Level::DEBUG, Level::INFO, Level::ERROR]
            .iter()
            .map(|level| lager.line(level, "m", Map::new(), at)["log_level"].clone())
            .collect();
        assert_eq!(levels, [0, 0, 1, 2]);
    }
}
