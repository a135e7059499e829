//! A filesystem on a [`RecordingDisk`], and the images a power cut may leave of it, each
//! mounted in turn where the filesystem was: what makes flush ordering testable (a
//! recorded run, then every cut image checked against what had returned before it).

use std::path::{Path, PathBuf};

use crate::FsKind;
use crate::recording_disk::{CutImage, Recording, RecordingDisk};
use crate::scratch::{mounts_under, run, try_run};

/// The filesystem, mounted until [`RecordedFs::stop`] or drop.
#[allow(missing_debug_implementations)]
pub struct RecordedFs {
    kind: FsKind,
    mountpoint: tempfile::TempDir,
    // Declared after the mount point: dropped after everything on it is unmounted.
    disk: RecordingDisk,
}

impl RecordedFs {
    /// A `kind` filesystem of `size_mb` on a new recording disk, not yet recording.
    pub fn new(kind: FsKind, size_mb: u64) -> Self {
        let disk = RecordingDisk::new(size_mb * 1024 * 1024);
        let mountpoint = tempfile::Builder::new()
            .prefix("lamina-recorded-")
            .tempdir()
            .expect("temp dir");
        let fs = Self {
            kind,
            mountpoint,
            disk,
        };
        let device = attach(&fs.disk.path());
        // No discard or lazy zeroing: every block the filesystem uses is written now, by
        // mkfs, into the base image.
        let made = match kind {
            FsKind::Ext4 => try_run(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                    &device,
                ],
            ),
            FsKind::Xfs => try_run("mkfs.xfs", &["-q", "-f", "-K", &device]),
            FsKind::Btrfs => try_run("mkfs.btrfs", &["-q", "-f", "-K", &device]),
        };
        if let Err(e) = made {
            detach(&device);
            panic!("{e}");
        }
        fs.mount(&device);
        fs
    }

    /// Where the filesystem is mounted (and each cut image after it).
    pub fn path(&self) -> &Path {
        self.mountpoint.path()
    }

    /// Syncs what the set-up wrote and starts recording.
    pub fn start(&self) {
        let dir = std::fs::File::open(self.path()).expect("opening the filesystem");
        lamina_sys::HostFs::syncfs(&lamina_sys::RealHost, &dir, self.path()).expect("syncfs");
        self.disk.start();
    }

    /// Notes that `what` returned: the cut images after it must show it done.
    pub fn mark(&self, what: &str) {
        self.disk.mark(what);
    }

    /// Stops recording and unmounts everything on the filesystem.
    pub fn stop(&self) -> Recording {
        let recording = self.disk.stop();
        self.unmount_all();
        recording
    }

    /// Mounts each of `cuts` of `recording` where the filesystem was (replaying its
    /// journal) and calls `check` with it; unmounts it after, even if `check` panics,
    /// and has the filesystem's own checker (`e2fsck -n`, `xfs_repair -n`) find nothing
    /// wrong with what is left. The images are written under `scratch` (a tmpfs, so no
    /// disk is worn writing them), each to a new file.
    pub fn check_each(
        &self,
        recording: &Recording,
        cuts: &[CutImage],
        scratch: &Path,
        mut check: impl FnMut(&CutImage),
    ) {
        for (n, cut) in cuts.iter().enumerate() {
            assert!(
                mounts_under(self.path()).is_empty(),
                "the previous image is still mounted"
            );
            let image_path = scratch.join(format!("cut-{n}.img"));
            std::fs::write(&image_path, recording.image(cut)).expect("writing a cut image");
            let device = attach(&image_path);
            self.mount(&device);
            let unmount = Unmount(self.path().to_path_buf());
            check(cut);
            drop(unmount);
            let checked = match self.kind {
                FsKind::Ext4 => try_run("e2fsck", &["-f", "-n", path_str(&image_path)]),
                FsKind::Xfs => try_run("xfs_repair", &["-n", "-f", path_str(&image_path)]),
                FsKind::Btrfs => try_run("btrfs", &["check", "--readonly", path_str(&image_path)]),
            };
            if let Err(e) = checked {
                panic!("{}: the filesystem is damaged: {e}", cut.label);
            }
            let _ = std::fs::remove_file(&image_path);
        }
    }

    /// Mounts `device` here, detaching it so the kernel releases it at unmount.
    fn mount(&self, device: &str) {
        let mounted = try_run(
            "mount",
            &["-t", self.kind.name(), device, path_str(self.path())],
        );
        detach(device);
        if let Err(e) = mounted {
            panic!("{e}");
        }
    }

    fn unmount_all(&self) {
        unmount_all(self.path());
    }
}

impl Drop for RecordedFs {
    fn drop(&mut self) {
        for mount in mounts_under(self.path()) {
            let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Unmounts everything at and under a path when dropped.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for mount in mounts_under(&self.0) {
                let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
            }
        } else {
            unmount_all(&self.0);
        }
    }
}

/// Unmounts everything at and under `root`, deepest first; a mount still busy after a
/// few tries fails the test (the next image must not be mounted over it).
fn unmount_all(root: &Path) {
    for mount in mounts_under(root) {
        let mut tries = 0;
        while let Err(e) = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::empty()) {
            tries += 1;
            assert!(
                e == rustix::io::Errno::BUSY && tries < 50,
                "unmounting {}: {e}",
                mount.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

fn attach(file: &Path) -> String {
    run(
        "losetup",
        &["--find", "--show", "--direct-io=off", path_str(file)],
    )
    .trim()
    .to_string()
}

fn detach(device: &str) {
    let _ = std::process::Command::new("losetup")
        .args(["--detach", device])
        .status();
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}
