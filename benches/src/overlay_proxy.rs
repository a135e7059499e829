//! containerd's own overlayfs snapshotter (v2.4.2) served as a proxy snapshotter by
//! `benches/overlay-proxy` (a Go program of a few lines), so that a benchmark can compare
//! lamina with it across the same gRPC hop lamina pays — the baseline issue 23 measured
//! against — as well as with containerd's built-in one.
//!
//! Built with the Go toolchain on first use (the module proxy supplies containerd's
//! module); a host without `go` runs the benchmarks without this contender.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running overlay-proxy; stopped on drop.
#[derive(Debug)]
pub struct OverlayProxy {
    pub socket: PathBuf,
    child: Child,
}

impl OverlayProxy {
    /// Builds overlay-proxy into `bin_dir` and starts it with its snapshots under
    /// `root`, serving on `socket`. `None`, with the reason on stderr, when there is no
    /// Go toolchain or the build fails.
    pub fn start(bin_dir: &Path, root: &Path, socket: &Path) -> Option<OverlayProxy> {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("overlay-proxy");
        let binary = bin_dir.join("overlay-proxy");
        let built = Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(&source)
            .status();
        match built {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("overlay-proxy: `go build` failed ({status}); running without it");
                return None;
            }
            Err(e) => {
                eprintln!("overlay-proxy: no Go toolchain ({e}); running without it");
                return None;
            }
        }
        let log = std::fs::File::create(bin_dir.join("overlay-proxy.log")).unwrap();
        let child = Command::new(&binary)
            .arg(root)
            .arg(socket)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        lamina_integration::wait_until("overlay-proxy to listen", || socket.exists());
        Some(OverlayProxy {
            socket: socket.to_path_buf(),
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OverlayProxy {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}
