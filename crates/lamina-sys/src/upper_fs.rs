//! A container's own upper filesystem (strategy `isolated`): what to mount, and the real
//! mounting of it. On its own superblock a container's upper has its own sync at unmount
//! and its own rename lock, and its size is a hard disk limit (ENOSPC) with no quotas.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::io::Errno;
use rustix::mount::MountFlags;

use crate::MountError;
use crate::raw::loop_dev;

/// Which filesystem a container's upper lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpperFs {
    /// tmpfs with `size=`: never written back, held in memory (and swap).
    Memory { size_bytes: u64 },
    /// A sparse image file, formatted `fs`, on a loop device with direct I/O.
    Disk {
        image: PathBuf,
        size_bytes: u64,
        fs: DiskFs,
        /// Create and format `image` first; `false` mounts an existing one again.
        format: bool,
    },
}

/// Filesystems a disk-backed upper can be formatted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskFs {
    /// The default: formats in milliseconds at any size from 8 MiB.
    #[default]
    Ext4,
    Xfs,
}

impl DiskFs {
    pub fn name(self) -> &'static str {
        match self {
            DiskFs::Ext4 => "ext4",
            DiskFs::Xfs => "xfs",
        }
    }

    /// The smallest image this filesystem formats: xfsprogs refuses below 300 MiB; ext4
    /// needs room for its journal.
    pub fn min_bytes(self) -> u64 {
        match self {
            DiskFs::Ext4 => 8 << 20,
            DiskFs::Xfs => 300 << 20,
        }
    }

    fn mkfs(self, image: &Path) -> Command {
        let mut command = match self {
            // No reserved blocks: the limit is the container's to use. Lazy init: a sparse
            // image's inode tables and journal already read as zeroes.
            DiskFs::Ext4 => {
                let mut c = Command::new("mkfs.ext4");
                c.args(["-q", "-F", "-b", "4096", "-m", "0"])
                    .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"]);
                c
            }
            DiskFs::Xfs => {
                let mut c = Command::new("mkfs.xfs");
                c.args(["-q", "-f", "-K"]);
                c
            }
        };
        command.arg(image);
        command
    }

    /// Mount options: ext4 skips zeroing inode tables in the background, which on a
    /// fresh sparse image would only write zeroes over holes.
    fn mount_data(self) -> &'static std::ffi::CStr {
        match self {
            DiskFs::Ext4 => c"noinit_itable",
            DiskFs::Xfs => c"",
        }
    }
}

impl UpperFs {
    pub fn size_bytes(&self) -> u64 {
        match self {
            UpperFs::Memory { size_bytes } | UpperFs::Disk { size_bytes, .. } => *size_bytes,
        }
    }
}

/// Mounts `fs` on the existing directory `target`. A failure leaves no image file (when
/// this call made it), no loop device and no mount.
pub(crate) fn mount(fs: &UpperFs, target: &Path) -> Result<(), MountError> {
    match fs {
        UpperFs::Memory { size_bytes } => {
            let data = std::ffi::CString::new(format!("size={size_bytes},mode=0755"))
                .expect("no NUL in digits");
            rustix::mount::mount(
                "tmpfs",
                target,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                Some(data.as_c_str()),
            )
            .map_err(|e| MountError::new("mount tmpfs upper at", target, e))
        }
        UpperFs::Disk {
            image,
            size_bytes,
            fs,
            format,
        } => {
            if *format {
                create_image(image, *size_bytes, *fs).inspect_err(|_| {
                    let _ = std::fs::remove_file(image);
                })?;
            }
            let mounted = mount_image(image, *fs, target);
            if mounted.is_err() && *format {
                let _ = std::fs::remove_file(image);
            }
            mounted
        }
    }
}

/// Creates `image` (never over an existing file), sparse at `size_bytes`, and formats it.
fn create_image(image: &Path, size_bytes: u64, fs: DiskFs) -> Result<(), MountError> {
    if size_bytes < fs.min_bytes() {
        return Err(
            MountError::new("create upper image", image, Errno::INVAL).with_detail(format!(
                "{size_bytes} bytes is below {}'s minimum of {} bytes",
                fs.name(),
                fs.min_bytes()
            )),
        );
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| MountError::new("create upper image", image, io_errno(&e)))?;
    file.set_len(size_bytes)
        .map_err(|e| MountError::new("size upper image", image, io_errno(&e)))?;
    drop(file);
    let mut mkfs = fs.mkfs(image);
    let output = mkfs.output().map_err(|e| {
        MountError::new("format upper image", image, io_errno(&e)).with_detail(format!(
            "cannot run {:?}: install {}",
            mkfs.get_program(),
            match fs {
                DiskFs::Ext4 => "e2fsprogs",
                DiskFs::Xfs => "xfsprogs",
            }
        ))
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(
            MountError::new("format upper image", image, Errno::IO).with_detail(format!(
                "{:?} failed: {}",
                mkfs.get_program(),
                stderr.trim().replace('\n', "; ")
            )),
        );
    }
    Ok(())
}

/// Attaches `image` to a loop device and mounts it; the device is closed before
/// returning, so from then on the mount alone keeps it attached.
fn mount_image(image: &Path, fs: DiskFs, target: &Path) -> Result<(), MountError> {
    let backing = open_backing(image)?;
    let device =
        loop_dev::attach(&backing).map_err(|(op, path, errno)| MountError::new(op, path, errno))?;
    drop(backing);
    rustix::mount::mount(
        &device.path,
        target,
        fs.name(),
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(fs.mount_data()),
    )
    .map_err(|e| {
        MountError::new("mount upper filesystem at", target, e).with_detail(format!(
            "{} on {}",
            fs.name(),
            device.path.display()
        ))
    })
}

fn open_backing(image: &Path) -> Result<File, MountError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)
        .map_err(|e| MountError::new("open upper image", image, io_errno(&e)))
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// Detaches a loop device a crash left attached (`lamina check --repair`).
pub fn detach_loop_device(device: &Path) -> Result<(), MountError> {
    loop_dev::detach(device).map_err(|e| MountError::new("detach loop device", device, e))
}

/// Attached loop devices and their backing files, from sysfs: how `clean` and the tests
/// find a loop device still attached to one of a store's image files.
pub fn loop_backing_files() -> Vec<(PathBuf, PathBuf)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            found.push((
                Path::new("/dev").join(&name),
                PathBuf::from(backing.trim_end_matches('\n')),
            ));
        }
    }
    found
}
