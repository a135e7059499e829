//! A filesystem of the test's own, mounted on a fresh temp dir. Dropping it unmounts
//! everything mounted beneath it (deepest first), then itself, so a panicking test
//! leaks no mount and no loop device.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug)]
pub struct ScratchFs {
    dir: tempfile::TempDir,
    image: Option<PathBuf>,
}

impl ScratchFs {
    /// A tmpfs: fast, and overlay accepts it as upper and lower.
    pub fn tmpfs() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lamina-test-")
            .tempdir()
            .expect("temp dir");
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=2g,mode=0755",
                "lamina-test",
                path_str(dir.path()),
            ],
        );
        Self { dir, image: None }
    }

    /// A loop-backed ext4 of `size_mb` (the loop device is released on unmount): the
    /// filesystem a production store is likely on, and far faster to fill than `/` here.
    pub fn ext4(size_mb: u64) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lamina-test-")
            .tempdir()
            .expect("temp dir");
        let image = dir.path().with_extension("ext4.img");
        let file = std::fs::File::create(&image).expect("image file");
        file.set_len(size_mb * 1024 * 1024).expect("sizing image");
        run("mkfs.ext4", &["-q", "-F", path_str(&image)]);
        run(
            "mount",
            &["-o", "loop", path_str(&image), path_str(dir.path())],
        );
        Self {
            dir,
            image: Some(image),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        for mount in mounts_under(self.path()) {
            let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
        }
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

/// Mount points at or below `root`, deepest first, read from /proc/self/mountinfo.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    lamina_sys::mounts_under(root).expect("reading /proc/self/mountinfo")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
