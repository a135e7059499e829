//! Fault injection for crash tests: with `LAMINA_PAUSE_AT=<point>` in its environment, a
//! lamina process that reaches that named point writes `run/paused-<point>.<pid>` and
//! sleeps until killed. A test waits for the file, SIGKILLs the process, and checks that
//! the next command recovers. With `LAMINA_PAUSE_SECS=N` too, the process sleeps N
//! seconds there and then goes on: how a test holds a step open while another process
//! races it. With `LAMINA_FAIL_ONCE_AT=<point>`, the first time the process reaches that
//! point the step fails (as a full disk would fail it), and every later time it goes on:
//! how a test makes a step fail in a process that must then recover from it. Without the
//! variables a point costs one env lookup.

use std::time::Duration;

use crate::Store;

const VAR: &str = "LAMINA_PAUSE_AT";
const FAIL_VAR: &str = "LAMINA_FAIL_ONCE_AT";
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

    /// A named step a test may fail once (`LAMINA_FAIL_ONCE_AT`): `ENOSPC` the first time
    /// this process reaches it.
    pub fn fail_point(&self, point: &str) -> Result<(), crate::StoreError> {
        static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if std::env::var(FAIL_VAR).is_ok_and(|wanted| wanted == point)
            && !FAILED.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::warn!(point, "failing this step once for a test ({FAIL_VAR})");
            return Err(crate::StoreError::io(
                "at fail point",
                std::path::Path::new(point),
            )(std::io::Error::from_raw_os_error(28)));
        }
        Ok(())
    }
}
