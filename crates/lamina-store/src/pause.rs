//! Fault injection for crash tests: with `LAMINA_PAUSE_AT=<point>` in its environment, a
//! lamina process that reaches that named point writes `run/paused-<point>.<pid>` and
//! sleeps until killed. A test waits for the file, SIGKILLs the process, and checks that
//! the next command recovers. With `LAMINA_PAUSE_SECS=N` too, the process sleeps N
//! seconds there and then goes on: how a test holds a step open while another process
//! races it. Without the variable a point costs one env lookup.

use std::time::Duration;

use crate::Store;

const VAR: &str = "LAMINA_PAUSE_AT";
const SECS_VAR: &str = "LAMINA_PAUSE_SECS";

impl Store {
    /// A named point where a test may stop (and kill) this process.
    pub fn pause_point(&self, point: &str) {
        if std::env::var(VAR).is_ok_and(|wanted| wanted == point) {
            let marker = self
                .layout
                .run()
                .join(format!("paused-{point}.{}", std::process::id()));
            let _ = std::fs::write(&marker, b"");
            if let Some(secs) = std::env::var(SECS_VAR).ok().and_then(|s| s.parse().ok()) {
                tracing::warn!(point, secs, "paused for a test ({VAR}); going on after");
                std::thread::sleep(Duration::from_secs(secs));
                return;
            }
            tracing::warn!(point, "paused for a test ({VAR}); waiting to be killed");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}
