//! Starting the server of a store's lazy layers from a command (a `lazy` create): `lamina
//! daemon` for the store, detached as background work is (its own process group, no
//! stdio, logging where background work logs), with the command's shared registry
//! settings (timeouts, certificates, auth file; each layer's credentials and plain HTTP
//! are in its record). The daemon serves until stopped; later creates reuse it. A daemon
//! started this way lives in the caller's cgroup: a host that restarts its caller's unit
//! with its whole cgroup runs the packaged `lamina` unit instead.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use lamina_mount::LazyServer;
use lamina_store::Store;

use super::Ctx;

/// The create's way to start the server, for [`lamina_mount::CreateOptions`].
pub fn starter(ctx: &Ctx) -> LazyServer {
    let log = ctx.background_log();
    let level = match log.level {
        "off" | "fatal" | "error" => "warn".to_string(),
        more => more.to_string(),
    };
    let log_file = log.file.map(Path::to_path_buf);
    let pull = ctx.pull.clone();
    let config = ctx.config_path.clone();
    LazyServer(Arc::new(move |store: &Store| {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
        let log_file = log_file
            .clone()
            .unwrap_or_else(|| store.layout().run().join("background.log"));
        let mut command = Command::new(exe);
        command
            .arg("--store")
            .arg(store.root())
            .arg("--log-file")
            .arg(&log_file)
            .arg("--log-level")
            .arg(&level)
            .arg("--registry-timeout-seconds")
            .arg(pull.stall_timeout.as_secs().max(1).to_string())
            .arg("--lock-timeout-seconds")
            .arg(store.lock_timeout().as_secs().max(1).to_string());
        if let Some(config) = &config {
            command.arg("--config").arg(config);
        }
        if let Some(dir) = &pull.certs_dir {
            command.arg("--registry-certs-dir").arg(dir);
        }
        if let Some(file) = &pull.auth_file {
            command.arg("--registry-auth-file").arg(file);
        }
        // Credentials and plain HTTP are each lazy layer's own (its record): the daemon
        // serves every tenant's layers, and is given no one's.
        command.env_remove(crate::PASSWORD_ENV);
        let child = command
            .arg("daemon")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting `lamina daemon`: {e}"))?;
        tracing::info!(pid = child.id(), log = %log_file.display(), "started lamina daemon to serve lazy layers");
        Ok(())
    }))
}
