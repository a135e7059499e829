//! `lamina daemon`: the store's background work as tasks in one long-lived process
//! instead of a detached child per command, and — with `--containerd-socket` — containerd's
//! snapshots service. It keeps no state of its own — all of it is in the store — so
//! killing it at any point is safe; the next start (of the daemon or any command) picks
//! the work up where it was.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use lamina_mount::Strategies;
use lamina_snapshotter::Snapshotter;
use lamina_store::Store;
use lamina_sys::{Mounter, RealMounter};

use super::Ctx;

/// `lamina daemon`'s flags; each unset one falls back to the config's `daemon:` section.
#[derive(Debug)]
pub struct Flags {
    pub interval_ms: Option<u64>,
    pub containerd_socket: Option<PathBuf>,
    pub snapshot_strategy: Option<String>,
    pub label_strategies: Option<String>,
    pub metrics_address: Option<String>,
    pub remote_snapshots: Option<String>,
}

/// `lamina daemon`, as `lamina-daemon` runs it ([`super::DaemonMain`]).
pub fn main(ctx: &Ctx, mounter: RealMounter, flags: Flags) -> anyhow::Result<()> {
    let settings = &ctx.config.daemon;
    let strategy = flags
        .snapshot_strategy
        .or(settings.snapshot_strategy.clone())
        .unwrap_or_else(|| "auto".into());
    let strategies =
        Strategies::parse(&strategy).map_err(|why| anyhow!("--snapshot-strategy: {why}"))?;
    let label_strategies = flags
        .label_strategies
        .or(settings.label_strategies.clone())
        .map(|list| {
            list.split(',')
                .map(|name| name.trim().to_string())
                .filter(|name| !name.is_empty())
                .collect()
        });
    let containerd = flags
        .containerd_socket
        .or(settings.containerd_socket.clone())
        .map(|socket| Containerd {
            socket,
            strategies,
            label_strategies,
            remote_snapshots: flags
                .remote_snapshots
                .clone()
                .or(settings.remote_snapshots.clone()),
        });
    // Serving containerd makes the store if there is none yet, as create does.
    let store = if containerd.is_some() {
        Store::init(&ctx.store_path)?
    } else {
        Store::open(&ctx.store_path)?
    }
    .with_max_layer_bytes(ctx.max_layer_bytes)
    .with_lock_timeout(ctx.lock_timeout);
    let interval = flags.interval_ms.or(settings.interval_ms).unwrap_or(200);
    let metrics_address = flags.metrics_address.or(settings.metrics_address.clone());
    run(
        &store,
        Arc::new(mounter),
        Duration::from_millis(interval),
        containerd,
        metrics_address.as_deref(),
        ctx.pull.clone(),
    )
}

/// Serving containerd, as the daemon's flags ask.
#[derive(Debug)]
pub struct Containerd {
    pub socket: PathBuf,
    /// For snapshots without a `containerd.io/snapshot/lamina.strategy` label.
    pub strategies: Strategies,
    /// What that label may name (`None`: every strategy).
    pub label_strategies: Option<std::collections::BTreeSet<String>>,
    /// Serve containerd's remote snapshots from these registries (fetching as the
    /// daemon's pull options say).
    pub remote_snapshots: Option<String>,
}

/// Fewer open files than this allowed is worth an operator's warning: a reaper's pass can
/// hold ~1,300 (a lock per pending container, four tree walks), besides the calls served.
const FEW_OPEN_FILES: u64 = 4096;

/// Reaps deferred deletes as they arrive, refills pools and serves new lazy layers
/// (fetching as `pull` says), every `interval`; with
/// `containerd`, also serves snapshots until SIGTERM or SIGINT; with `metrics_address`,
/// serves Prometheus metrics there.
pub fn run(
    store: &Store,
    mounter: Arc<dyn Mounter>,
    interval: Duration,
    containerd: Option<Containerd>,
    metrics_address: Option<&str>,
    pull: lamina_registry::PullOptions,
) -> anyhow::Result<()> {
    // Bound first: a taken or malformed address fails the start, naming it, before any
    // task runs or the socket is served.
    let metrics = metrics_address
        .map(lamina_snapshotter::metrics::bind)
        .transpose()?;
    tracing::info!(store = %store.root().display(), "daemon started");
    // Raised at start (lamina_sys::raise_open_file_limit); this asks what it came to.
    if let Some(open_files) = lamina_sys::raise_open_file_limit().filter(|n| *n < FEW_OPEN_FILES) {
        tracing::warn!(
            open_files,
            "the daemon may open only this many files; its reaper and calls can run out (raise LimitNOFILE)"
        );
    }
    {
        let (store, mounter, pull) = (store.clone(), mounter.clone(), pull.clone());
        std::thread::spawn(move || serve_lazy_forever(&store, mounter.as_ref(), pull));
    }
    let Some(containerd) = containerd else {
        if let Some(listener) = metrics {
            let exporter = lamina_snapshotter::metrics::Exporter::new(store.clone(), None);
            lamina_snapshotter::metrics::spawn(listener, exporter)?;
        }
        tell_systemd(&[sd_notify::NotifyState::Ready]);
        work_forever(store, mounter.as_ref(), interval);
    };
    let mut snapshotter = Snapshotter::open(store.clone(), mounter.clone(), containerd.strategies)?;
    if let Some(names) = containerd.label_strategies {
        snapshotter = snapshotter
            .with_label_strategies(names)
            .map_err(|e| anyhow!("--label-strategies: {e}"))?;
    }
    if let Some(list) = &containerd.remote_snapshots {
        let sources = lamina_snapshotter::RemoteSources::parse(list)
            .map_err(|e| anyhow!("--remote-snapshots: {e}"))?;
        snapshotter = snapshotter
            .with_remote_snapshots(sources, pull.clone())
            .map_err(|e| anyhow!("--remote-snapshots: {e}"))?;
    }
    if let Some(listener) = metrics {
        let exporter =
            lamina_snapshotter::metrics::Exporter::new(store.clone(), Some(snapshotter.clone()));
        lamina_snapshotter::metrics::spawn(listener, exporter)?;
    }
    let background_store = store.clone();
    std::thread::spawn(move || work_forever(&background_store, mounter.as_ref(), interval));
    lamina_snapshotter::serve_until_signalled(snapshotter, &containerd.socket, || {
        tell_systemd(&[sd_notify::NotifyState::Ready])
    })?;
    tell_systemd(&[sd_notify::NotifyState::Stopping]);
    Ok(())
}

/// Tells a `Type=notify` unit's manager the daemon's state (nothing without
/// `NOTIFY_SOCKET`). A failure is logged, not fatal: systemd then times the start out,
/// which says more than a daemon that refuses to serve.
fn tell_systemd(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "telling systemd the daemon's state failed");
    }
}

fn work_forever(store: &Store, mounter: &dyn Mounter, interval: Duration) -> ! {
    // One for the daemon's life: a container whose teardown failed waits its turn.
    let mut reaper = lamina_mount::Reaper::default();
    loop {
        // A bug that panics in one pass must not stop reaping and refills for good.
        let pass = std::panic::AssertUnwindSafe(|| work_once(store, mounter, &mut reaper));
        if std::panic::catch_unwind(pass).is_err() {
            tracing::error!("a reap or pool refill panicked; retrying");
        }
        std::thread::sleep(interval);
    }
}

/// Serves the store's lazy layers, on a thread of its own so no reap or refill delays a
/// create waiting for its layers: as the store's one server while no other process is
/// (tried again every tick), and no longer once the store it served is deleted.
fn serve_lazy_forever(
    store: &Store,
    mounter: &dyn Mounter,
    pull: lamina_registry::PullOptions,
) -> ! {
    let mut server = None;
    loop {
        if server
            .as_ref()
            .is_some_and(|s: &lamina_lazy::serve::Server| !s.still_the_stores())
        {
            tracing::warn!(
                "the store's lazy layers are no longer this daemon's (the store was deleted): stopped serving them"
            );
            // Let go without unmounting by path: a new store may have a mount there.
            if let Some(server) = server.take() {
                server.abandon();
            }
        }
        if server.is_none() && lamina_lazy::layer::lazy_root(store.root()).is_dir() {
            match lamina_lazy::serve::Server::start(store, pull.clone()) {
                Ok(started) => server = started,
                Err(e) => tracing::warn!(error = %e, "cannot serve lazy layers; retrying"),
            }
        }
        if let Some(server) = server.as_mut() {
            server.serve_new(mounter);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn work_once(store: &Store, mounter: &dyn Mounter, reaper: &mut lamina_mount::Reaper) {
    // A reaper at work (a lingering one a CLI delete started) reaps what is there; waiting
    // for its lock would hold up this loop, and with it the lazy layers' serving.
    if store.trash_entries().is_ok_and(|t| !t.is_empty()) && !lamina_mount::reaper_running(store) {
        match reaper.reap(store, mounter) {
            // Each failure is warned of when it is tried; a pass that removed nothing
            // has nothing to say (it runs every interval while a busy one waits).
            Ok(reaped) if reaped.removed > 0 => {
                tracing::info!(removed = reaped.removed, failed = reaped.failed, "reaped")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reaping failed; retrying"),
        }
    }
    match lamina_mount::pool::refill_all(store, mounter) {
        Ok(0) => {}
        Ok(added) => tracing::info!(added, "refilled pools"),
        Err(e) => tracing::warn!(error = %e, "refilling pools failed; retrying"),
    }
}
