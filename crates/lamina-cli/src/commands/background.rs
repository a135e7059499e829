//! Work the CLI leaves to a detached child: the reaper after a deferred delete (or when a
//! start finds trash a crash left) and pool refills after a claim. The child runs this
//! same binary in its own process group with no stdin/stdout, so the caller's command
//! returns at once and a caller killing its process group does not kill the child. Its
//! logs go to the configured log file, or `<store>/run/background.log`. A deferred
//! delete's reap is a forked copy of the deleting process instead, where it can be
//! ([`reap_detached`]).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use lamina_store::Store;

/// After a deferred delete: reaps the trash in a forked copy of this process, detached as
/// [`spawn`]'s child is — or, where this process cannot fork (more than one thread), in a
/// spawned `lamina reap`. The fork costs the delete a fraction of the spawn (which waits
/// for the child to reset its signals and start its exec) and spares the host a new
/// process starting up beside the caller's next command.
pub fn reap_detached(store: &Store, log_file: Option<&Path>, mounter: &dyn lamina_sys::Mounter) {
    let log = log_path(store, log_file);
    // On a terminal, log lines go through the progress bars' writer, which a copy would
    // keep drawing with into the log file: a person at a shell can wait for a spawn.
    let forked = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        Err(std::io::Error::other("stderr is a terminal"))
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|file| lamina_sys::fork_detached(&file))
    };
    match forked {
        Ok(lamina_sys::ForkedSide::Parent) => {}
        Ok(lamina_sys::ForkedSide::Child) => {
            // As `lamina reap` would: its report logged, its failure the exit status. A
            // panic must not unwind into the delete this copy was forked from.
            let reaped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                lamina_mount::reap(store, mounter)
            }));
            let code = match reaped {
                Ok(Ok(reaped)) => {
                    tracing::info!(
                        removed = reaped.removed,
                        failed = reaped.failed,
                        "reaped deferred deletes"
                    );
                    0
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "reaping deferred deletes");
                    1
                }
                Err(_) => 101,
            };
            std::process::exit(code);
        }
        Err(e) => {
            tracing::debug!(error = %e, "reaping in a new process instead of a fork");
            spawn(store, log_file, &["reap"]);
        }
    }
}

fn log_path(store: &Store, log_file: Option<&Path>) -> std::path::PathBuf {
    log_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| store.layout().run().join("background.log"))
}

/// Starts `lamina --store STORE ARGS...` detached. Failure to start is logged, not
/// fatal: `lamina clean` (or the next start) finishes the work.
pub fn spawn(store: &Store, log_file: Option<&Path>, args: &[&str]) {
    let log = log_path(store, log_file);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!(error = %e, ?args, "cannot find own binary to start background work");
            return;
        }
    };
    let spawned = Command::new(exe)
        .arg("--store")
        .arg(store.root())
        .arg("--log-file")
        .arg(&log)
        // The child waits for locks no longer than its parent was told to.
        .arg("--lock-timeout-seconds")
        .arg(store.lock_timeout().as_secs().max(1).to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        // Not waited for: it outlives us and is reparented to init when we exit.
        Ok(child) => tracing::debug!(pid = child.id(), ?args, "started background work"),
        Err(e) => tracing::warn!(error = %e, ?args, "could not start background work"),
    }
}

/// Every start: if a crash (or a reaper that could not finish) left containers in
/// `trash/` and no reaper is running, start one.
pub fn finish_crashed_deletes(store: &Store, log_file: Option<&Path>) {
    let pending = store.trash_entries().is_ok_and(|t| !t.is_empty());
    if pending && store.try_lock("reaper").is_ok_and(|l| l.is_some()) {
        spawn(store, log_file, &["reap"]);
    }
}
