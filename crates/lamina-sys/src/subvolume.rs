//! A container's upper as a btrfs subvolume with a qgroup limit (strategy
//! `isolated-quota`): the store's own filesystem enforces the disk limit (EDQUOT), with no
//! loop device, journal or kernel thread per container. The real calls, behind
//! [`crate::Mounter`]'s subvolume methods.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::MountError;
use crate::raw::btrfs;

fn open(path: &Path, op: &'static str) -> Result<File, MountError> {
    File::open(path).map_err(|e| MountError::new(op, path, io_errno(&e)))
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

fn parent_and_name(path: &Path) -> Result<(PathBuf, &std::ffi::OsStr), MountError> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent.to_path_buf(), name)),
        _ => Err(MountError::new("create subvolume", path, Errno::INVAL)),
    }
}

// `f_type` is an i64 here and a narrower or unsigned type on other architectures.
#[allow(clippy::unnecessary_cast)]
fn on_btrfs(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|s| s.f_type as i64 == btrfs::BTRFS_SUPER_MAGIC)
}

/// Creates subvolume `path` (which must not exist) and limits its qgroup to `limit_bytes`
/// referenced bytes. A failure leaves no subvolume.
pub(crate) fn create(path: &Path, limit_bytes: u64) -> Result<(), MountError> {
    let (parent, name) = parent_and_name(path)?;
    let parent_dir = open(&parent, "open subvolume parent")?;
    btrfs::create_subvolume(&parent_dir, name)
        .map_err(|e| MountError::new("create subvolume", path, e))?;
    let limited = open(path, "open subvolume").and_then(|root| {
        btrfs::limit_qgroup(&root, limit_bytes).map_err(|e| {
            MountError::new("limit qgroup of subvolume", path, e).with_detail(format!(
                "{limit_bytes} bytes; are quotas enabled (`btrfs quota enable`)?"
            ))
        })
    });
    if limited.is_err() {
        let _ = delete(path);
    }
    limited
}

/// Limits the qgroup of subvolume `path` to `limit_bytes` (creating the qgroup's limit
/// again after quotas were turned off and on).
pub(crate) fn limit(path: &Path, limit_bytes: u64) -> Result<(), MountError> {
    let root = open(path, "open subvolume")?;
    btrfs::limit_qgroup(&root, limit_bytes).map_err(|e| {
        MountError::new("limit qgroup of subvolume", path, e).with_detail(format!(
            "{limit_bytes} bytes; are quotas enabled (`btrfs quota enable`)?"
        ))
    })
}

/// Deletes subvolume `path` and its qgroup. `Ok(false)`: `path` is missing or not a
/// subvolume's root. A qgroup the kernel still counts the dropped subvolume's extents in
/// (EBUSY until its cleaner thread has freed them) is removed by the kernel itself once
/// they are freed (Linux 6.9+), so that refusal is not an error.
pub(crate) fn delete(path: &Path) -> Result<bool, MountError> {
    let (parent, name) = parent_and_name(path)?;
    let parent_dir = match File::open(&parent) {
        Ok(dir) => dir,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(MountError::new(
                "open subvolume parent",
                &parent,
                io_errno(&e),
            ));
        }
    };
    // `path` may be anything an image put there (a directory being swept from `tmp/`):
    // never follow a symlink, never wait on a FIFO, never open a device.
    let flags = rustix::fs::OFlags::RDONLY
        | rustix::fs::OFlags::DIRECTORY
        | rustix::fs::OFlags::NOFOLLOW
        | rustix::fs::OFlags::NONBLOCK
        | rustix::fs::OFlags::CLOEXEC;
    let root = match rustix::fs::openat(&parent_dir, name, flags, rustix::fs::Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return Ok(false),
        Err(e) => return Err(MountError::new("open subvolume", path, e)),
    };
    let is_root = root
        .metadata()
        .is_ok_and(|m| m.is_dir() && m.ino() == btrfs::SUBVOLUME_ROOT_INO);
    if !is_root || !on_btrfs(&root) {
        return Ok(false);
    }
    let id =
        btrfs::subvolume_id(&root).map_err(|e| MountError::new("look up subvolume", path, e))?;
    drop(root);
    btrfs::delete_subvolume(&parent_dir, name)
        .map_err(|e| MountError::new("delete subvolume", path, e))?;
    match btrfs::destroy_qgroup(&parent_dir, id) {
        // ENOENT: quotas are off, or the kernel removed it already.
        Ok(()) | Err(Errno::BUSY) | Err(Errno::NOENT) | Err(Errno::NOTCONN) => Ok(true),
        Err(e) => Err(MountError::new("destroy qgroup of subvolume", path, e)
            .with_detail(format!("qgroup 0/{id}"))),
    }
}

/// What the qgroup of subvolume `path` counts: the bytes it references, as of the last
/// transaction commit.
pub(crate) fn usage(path: &Path) -> Result<u64, MountError> {
    let root = open(path, "open subvolume")?;
    let fsid = btrfs::fsid(&root).map_err(|e| MountError::new("read btrfs fsid of", path, e))?;
    let id =
        btrfs::subvolume_id(&root).map_err(|e| MountError::new("look up subvolume", path, e))?;
    let counter = qgroups_dir(&fsid).join(format!("0_{id}/referenced"));
    let text = std::fs::read_to_string(&counter)
        .map_err(|e| MountError::new("read qgroup usage", &counter, io_errno(&e)))?;
    text.trim()
        .parse()
        .map_err(|_| MountError::new("parse qgroup usage", &counter, Errno::INVAL))
}

/// Whether `dir` is on btrfs with quotas enabled.
pub(crate) fn quotas_enabled(dir: &Path) -> bool {
    let Ok(file) = File::open(dir) else {
        return false;
    };
    if !on_btrfs(&file) {
        return false;
    }
    let Ok(fsid) = btrfs::fsid(&file) else {
        return false;
    };
    std::fs::read_to_string(qgroups_dir(&fsid).join("enabled")).is_ok_and(|s| s.trim() == "1")
}

fn qgroups_dir(fsid: &str) -> PathBuf {
    Path::new("/sys/fs/btrfs").join(fsid).join("qgroups")
}
