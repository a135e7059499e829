//! `lamina daemon`: the store's background work as tasks in one long-lived process
//! instead of a detached child per command, and — with `--containerd-socket` — containerd's
//! snapshots service. It keeps no state of its own — all of it is in the store — so
//! killing it at any point is safe; the next start (of the daemon or any command) picks
//! the work up where it was.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lamina_mount::Strategies;
use lamina_snapshotter::Snapshotter;
use lamina_store::Store;
use lamina_sys::Mounter;

/// Serving containerd, as the daemon's flags ask.
#[derive(Debug)]
pub struct Containerd {
    pub socket: PathBuf,
    /// For snapshots without a `containerd.io/snapshot/lamina.strategy` label.
    pub strategies: Strategies,
}

/// Reaps deferred deletes as they arrive and refills pools, every `interval`; with
/// `containerd`, also serves snapshots until SIGTERM or SIGINT; with `metrics_address`,
/// serves Prometheus metrics there.
pub fn run(
    store: &Store,
    mounter: Arc<dyn Mounter>,
    interval: Duration,
    containerd: Option<Containerd>,
    metrics_address: Option<&str>,
) -> anyhow::Result<()> {
    // Bound first: a taken or malformed address fails the start, naming it, before any
    // task runs or the socket is served.
    let metrics = metrics_address
        .map(lamina_snapshotter::metrics::bind)
        .transpose()?;
    tracing::info!(store = %store.root().display(), "daemon started");
    let Some(containerd) = containerd else {
        if let Some(listener) = metrics {
            let exporter = lamina_snapshotter::metrics::Exporter::new(store.clone(), None);
            lamina_snapshotter::metrics::spawn(listener, exporter)?;
        }
        work_forever(store, mounter.as_ref(), interval);
    };
    let snapshotter = Snapshotter::open(store.clone(), mounter.clone(), containerd.strategies)?;
    if let Some(listener) = metrics {
        let exporter =
            lamina_snapshotter::metrics::Exporter::new(store.clone(), Some(snapshotter.clone()));
        lamina_snapshotter::metrics::spawn(listener, exporter)?;
    }
    let background_store = store.clone();
    std::thread::spawn(move || work_forever(&background_store, mounter.as_ref(), interval));
    lamina_snapshotter::serve_until_signalled(snapshotter, &containerd.socket)?;
    Ok(())
}

fn work_forever(store: &Store, mounter: &dyn Mounter, interval: Duration) -> ! {
    loop {
        work_once(store, mounter);
        std::thread::sleep(interval);
    }
}

fn work_once(store: &Store, mounter: &dyn Mounter) {
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
}
