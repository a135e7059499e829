//! Work the CLI leaves to a detached child: the reaper after a deferred delete (or when a
//! start finds trash a crash left) and pool refills after a claim. The child runs this
//! same binary in its own process group with no stdin/stdout, so the caller's command
//! returns at once and a caller killing its process group does not kill the child. Its
//! logs go to the configured log file, or `<store>/run/background.log`.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use lamina_store::Store;

/// Where background work logs (`run/background.log` without a file) and at what level
/// (never quieter than `warn`).
#[derive(Debug, Clone, Copy)]
pub struct Log<'a> {
    pub file: Option<&'a Path>,
    pub level: &'a str,
}

/// Starts `lamina --store STORE ARGS...` detached, logging as `log` says. Failure to start is logged, not
/// fatal: `lamina clean` (or the next start) finishes the work.
pub fn spawn(store: &Store, log: Log<'_>, args: &[&str]) {
    // Work in the background says what went wrong only in its log (a container the reaper
    // could not remove stays in trash until someone reads why): warnings at least, even
    // where the command that started it logs only what is fatal.
    let level = match log.level {
        "off" | "fatal" | "error" => "warn",
        more => more,
    };
    let log = log
        .file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| store.layout().run().join("background.log"));
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
        .arg("--log-level")
        .arg(level)
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

/// How long a reaper started in the background looks for more trash once it emptied it:
/// a delete meanwhile finds it running and starts none (a process start each, in a burst of
/// deletes). Short, because `delete-store` waits for it.
const REAPER_LINGER_MS: &str = "500";

/// Starts a reaper in the background, which lingers (see [`REAPER_LINGER_MS`]).
pub fn spawn_reaper(store: &Store, log: Log<'_>) {
    spawn(store, log, &["reap", "--linger-ms", REAPER_LINGER_MS]);
}

/// Every start: if a crash (or a reaper that could not finish) left containers in
/// `trash/` and no reaper is running, start one.
pub fn finish_crashed_deletes(store: &Store, log: Log<'_>) {
    let pending = store.trash_entries().is_ok_and(|t| !t.is_empty());
    if pending && store.try_lock("reaper").is_ok_and(|l| l.is_some()) {
        spawn_reaper(store, log);
    }
}
