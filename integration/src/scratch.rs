//! A filesystem of the test's own, mounted on a fresh temp dir. Dropping it unmounts
//! everything mounted beneath it (deepest first), then itself, so a panicking test
//! leaks no mount and no loop device.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug)]
pub struct ScratchFs {
    dir: tempfile::TempDir,
    image: Option<PathBuf>,
    /// The backing file of a [`SecondDevice`].
    second_image: Option<PathBuf>,
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
        Self {
            dir,
            image: None,
            second_image: None,
        }
    }

    /// A loop-backed ext4 of `size_mb` (the loop device is released on unmount): the
    /// filesystem a production store is likely on, and far faster to fill than `/` here.
    pub fn ext4(size_mb: u64) -> Self {
        Self::loop_backed(FsKind::Ext4, size_mb, false)
    }

    /// A loop-backed `kind` filesystem of `size_mb`. With `direct_io` the loop device
    /// writes straight to the disk instead of through the backing file's page cache, so a
    /// sync of this filesystem costs what it costs on a real disk (what benchmarks of
    /// writeback stalls need). The loop device is detached as soon as it is mounted, which
    /// makes the kernel release it at unmount: a killed process leaks no loop device.
    pub fn loop_backed(kind: FsKind, size_mb: u64, direct_io: bool) -> Self {
        let options = LoopOptions {
            direct_io,
            ..LoopOptions::default()
        };
        Self::loop_backed_with(kind, size_mb, &options)
    }

    /// [`ScratchFs::loop_backed`] with `mkfs` arguments, mount options or a loop sector
    /// size of the test's choosing: the configurations a feature must detect.
    pub fn loop_backed_with(kind: FsKind, size_mb: u64, options: &LoopOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lamina-test-")
            .tempdir()
            .expect("temp dir");
        let image = dir.path().with_extension(format!("{}.img", kind.name()));
        let file = std::fs::File::create(&image).expect("image file");
        file.set_len(size_mb * 1024 * 1024).expect("sizing image");
        let mut losetup = vec!["--find", "--show"];
        if options.direct_io {
            losetup.push("--direct-io=on");
        }
        let sector_size = options.sector_size.map(|s| s.to_string());
        if let Some(size) = &sector_size {
            losetup.extend(["--sector-size", size]);
        }
        losetup.push(path_str(&image));
        let device = run("losetup", &losetup).trim().to_string();
        let (mkfs, force) = match kind {
            FsKind::Ext4 => ("mkfs.ext4", "-F"),
            FsKind::Xfs => ("mkfs.xfs", "-f"),
            FsKind::Btrfs => ("mkfs.btrfs", "-f"),
        };
        let second = options
            .second_device
            .map(|kind| (kind, SecondImage::attach(dir.path(), &device)));
        let detach_all = |e: String| -> ! {
            for dev in std::iter::once(&device).chain(second.as_ref().map(|(_, s)| &s.device)) {
                let _ = Command::new("losetup").args(["--detach", dev]).status();
            }
            panic!("{e}")
        };
        let mut args: Vec<String> = vec!["-q".into(), force.into()];
        args.extend(options.mkfs.iter().map(|a| a.to_string()));
        let mut mount_options: Vec<String> = options.mount.iter().map(|o| o.to_string()).collect();
        if let Some((kind, second)) = &second {
            let dev = &second.device;
            match kind {
                SecondDevice::XfsLog => {
                    args.extend(["-l".into(), format!("logdev={dev}")]);
                    mount_options.push(format!("logdev={dev}"));
                }
                SecondDevice::Ext4Journal => {
                    try_run(
                        "mke2fs",
                        &["-q", "-F", "-O", "journal_dev", "-b", "4096", dev],
                    )
                    .unwrap_or_else(|e| detach_all(e));
                    args.extend([
                        "-b".into(),
                        "4096".into(),
                        "-J".into(),
                        format!("device={dev}"),
                    ]);
                }
            }
        }
        args.push(device.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        try_run(mkfs, &args).unwrap_or_else(|e| detach_all(e));
        let joined = mount_options.join(",");
        let mut mount = Vec::new();
        if !joined.is_empty() {
            mount.extend(["-o", joined.as_str()]);
        }
        mount.extend([device.as_str(), path_str(dir.path())]);
        try_run("mount", &mount).unwrap_or_else(|e| detach_all(e));
        // Detached while mounted: the kernel releases each device at unmount.
        run("losetup", &["--detach", &device]);
        if let Some((_, second)) = &second {
            run("losetup", &["--detach", &second.device]);
        }
        Self {
            dir,
            image: Some(image),
            second_image: second.map(|(_, s)| s.image),
        }
    }

    /// A loop-backed btrfs of `size_mb` with quotas enabled (`btrfs quota enable`): where
    /// strategy `isolated-quota` puts each container's upper in a subvolume with a qgroup
    /// limit. Needs btrfs-progs.
    pub fn btrfs_with_quotas(size_mb: u64) -> Self {
        let fs = Self::loop_backed(FsKind::Btrfs, size_mb, false);
        run("btrfs", &["quota", "enable", path_str(fs.path())]);
        fs
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A power cut, as near as a test gets: the filesystem is shut down without flushing
    /// its journal (`xfs_io -x -c shutdown`; ext4 takes the same ioctl), so only what a
    /// commit already carried survives; then everything beneath is unmounted and the
    /// image mounted again, as after a reboot. Loop-backed filesystems only.
    pub fn crash_and_remount(&self) {
        self.cut_power();
        self.remount_after_cut();
    }

    /// The power cut alone: the filesystem is shut down without flushing its journal.
    /// Whatever still holds files on it (a database connection, whose close would
    /// otherwise write and sync) can then be dropped before [`ScratchFs::remount_after_cut`].
    pub fn cut_power(&self) {
        run("xfs_io", &["-x", "-c", "shutdown", path_str(self.path())]);
    }

    /// After [`ScratchFs::cut_power`]: everything beneath is unmounted and the image
    /// mounted again, as after a reboot.
    pub fn remount_after_cut(&self) {
        let image = self.image.as_ref().expect("a loop-backed filesystem");
        // Detached, in case the test still holds a file on it; the superblock goes when
        // the last reference does, and the image must not be mounted twice.
        for mount in mounts_under(self.path()) {
            rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH)
                .unwrap_or_else(|e| panic!("unmounting {} after the crash: {e}", mount.display()));
        }
        let released = || {
            !run("losetup", &["--list", "--noheadings", "-O", "BACK-FILE"])
                .contains(path_str(image))
        };
        for _ in 0..500 {
            if released() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            released(),
            "the crashed filesystem's loop device is still attached"
        );
        let device = run("losetup", &["--find", "--show", path_str(image)])
            .trim()
            .to_string();
        run_or_detach(&device, "mount", &[&device, path_str(self.path())]);
        run("losetup", &["--detach", &device]);
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        for mount in mounts_under(self.path()) {
            let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
        }
        for image in self.image.iter().chain(&self.second_image) {
            let _ = std::fs::remove_file(image);
        }
    }
}

/// Mount points at or below `root`, deepest first, read from /proc/self/mountinfo.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    lamina_sys::mounts_under(root).expect("reading /proc/self/mountinfo")
}

/// Disk bytes in use on the filesystem holding `path`, after its writeback: what the
/// filesystem itself counts, so extents two files share count once (`du` counts them
/// for each file).
pub fn used_bytes(path: &Path) -> u64 {
    let dir = std::fs::File::open(path).expect("opening a directory to statfs");
    lamina_sys::HostFs::syncfs(&lamina_sys::RealHost, &dir, path).expect("syncfs");
    let st = rustix::fs::fstatvfs(&dir).expect("statfs");
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// How [`ScratchFs::loop_backed_with`] makes its filesystem.
#[derive(Debug, Default, Clone)]
pub struct LoopOptions {
    /// The loop device writes straight to the disk.
    pub direct_io: bool,
    /// The loop device's logical sector size in bytes.
    pub sector_size: Option<u32>,
    /// Extra arguments to `mkfs`.
    pub mkfs: Vec<&'static str>,
    /// `mount -o` options.
    pub mount: Option<&'static str>,
    /// A second loop device the filesystem is made across.
    pub second_device: Option<SecondDevice>,
}

/// What a [`LoopOptions::second_device`] holds: configurations where a filesystem's log
/// or data is not on its main device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecondDevice {
    /// xfs's log (`mkfs.xfs -l logdev=`, `mount -o logdev=`).
    XfsLog,
    /// ext4's journal (`mke2fs -O journal_dev`, then `mkfs.ext4 -J device=`).
    Ext4Journal,
}

/// A 64 MiB file attached to a loop device, beside the scratch filesystem's image.
struct SecondImage {
    image: PathBuf,
    device: String,
}

impl SecondImage {
    fn attach(dir: &Path, main_device: &str) -> Self {
        let image = dir.with_extension("second.img");
        let file = std::fs::File::create(&image).expect("second image file");
        file.set_len(64 * 1024 * 1024).expect("sizing second image");
        let device = run_or_detach(
            main_device,
            "losetup",
            &["--find", "--show", path_str(&image)],
        )
        .trim()
        .to_string();
        Self { image, device }
    }
}

/// A filesystem `ScratchFs::loop_backed` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
        }
    }
}

/// `run`, detaching loop `device` first if the command fails.
fn run_or_detach(device: &str, cmd: &str, args: &[&str]) -> String {
    try_run(cmd, args).unwrap_or_else(|e| {
        let _ = Command::new("losetup").args(["--detach", device]).status();
        panic!("{e}")
    })
}

/// Runs `cmd`, returning its stdout; panics with its stderr if it fails.
pub(crate) fn run(cmd: &str, args: &[&str]) -> String {
    try_run(cmd, args).unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn try_run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("running {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
