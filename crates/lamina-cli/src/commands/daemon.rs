//! `lamina daemon`: the store's background work as tasks in one long-lived process
//! instead of a detached child per command. It keeps no state of its own — all of it is
//! in the store — so killing it at any point is safe; the next start (of the daemon or
//! any command) picks the work up where it was.

use std::time::Duration;

use lamina_store::Store;
use lamina_sys::Mounter;

/// Reaps deferred deletes as they arrive and refills pools, every `interval`, forever.
pub fn run(store: &Store, mounter: &dyn Mounter, interval: Duration) -> anyhow::Result<()> {
    tracing::info!(store = %store.root().display(), "daemon started");
    loop {
        if store.trash_entries().is_ok_and(|t| !t.is_empty()) {
            match lamina_mount::reap(store, mounter) {
                Ok(reaped) => {
                    tracing::info!(removed = reaped.removed, failed = reaped.failed, "reaped")
                }
                Err(e) => tracing::warn!(error = %e, "reaping failed; retrying"),
            }
        }
        match lamina_mount::pool::refill_all(store, mounter) {
            Ok(0) => {}
            Ok(added) => tracing::info!(added, "refilled pools"),
            Err(e) => tracing::warn!(error = %e, "refilling pools failed; retrying"),
        }
        std::thread::sleep(interval);
    }
}
