//! Dropping a deleted container's written data before its overlay is unmounted: every
//! regular file with data in the upper is unlinked through the merged mount, so the
//! kernel drops its dirty pages instead of writing them back at unmount (stall S1).
//!
//! The walk runs as root over directories a container's processes may still change, so
//! it goes by directory fds, one name at a time, never following a symlink: a directory
//! swapped for a link to `/etc` mid-walk is skipped, never entered.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};

/// How deep the walk goes. Discarding is only an optimisation, and a container can make
/// its tree as deep as it likes; below this its files are written back at unmount.
const MAX_DEPTH: usize = 256;
/// How many directories wait their turn at most (two fds each): a container's wide tree
/// must not take the fds a daemon serves its other calls with. A walk holds at most
/// 2 × 128 + 3; a reaper walks up to four containers at once and holds a lock per pending
/// container, so lamina raises its soft fd limit at start ([`crate::raise_open_file_limit`]).
const MAX_PENDING: usize = 128;

/// `statfs` magic numbers (`<linux/magic.h>`).
const EXT4: u64 = 0xEF53;
const XFS: u64 = 0x5846_5342;

/// How many containers' written files are best unlinked at once on the filesystem that
/// holds `dir`: two on the ext4 driver's filesystems when the host has two CPUs or more
/// (two walks took 0.4–0.7× the time of one after the other on two cores; more gained
/// nothing there); one otherwise. On xfs two walks took 2.5× as long, both waiting on
/// one allocation group's inode buffer (`xfs_iunlink`); other filesystems are unmeasured.
pub fn unlinks_at_once(dir: &Path) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    match rustix::fs::statfs(dir) {
        Ok(fs) if fs.f_type as u64 == EXT4 => cpus.min(2),
        _ => 1,
    }
}

/// Unlinks, through `rootfs`, every non-empty regular file found in `upper` (the same
/// tree, as overlay lays it out). Errors are skipped: the unmount and removal that follow
/// are what must succeed. Returns how many files were unlinked.
pub fn unlink_written(upper: &Path, rootfs: &Path) -> usize {
    let (Some(upper), Some(rootfs)) = (open_dir(CWD, upper), open_dir(CWD, rootfs)) else {
        return 0;
    };
    let Ok(root) = rustix::fs::fstat(&rootfs) else {
        return 0;
    };
    // Depth-first with an explicit stack: no recursion for a container to exhaust, and a
    // directory's fds are held only while it waits its turn (at most MAX_PENDING pairs).
    let mut stack = vec![(upper, rootfs, 0)];
    let mut count = 0;
    while let Some((upper, rootfs, depth)) = stack.pop() {
        for (name, kind, size) in entries(&upper) {
            match kind {
                FileType::Directory if depth < MAX_DEPTH && stack.len() < MAX_PENDING => {
                    let (Some(sub_upper), Some(sub_rootfs)) =
                        (open_dir(&upper, &name), open_dir(&rootfs, &name))
                    else {
                        continue;
                    };
                    // Never into another filesystem mounted beneath the rootfs.
                    if rustix::fs::fstat(&sub_rootfs).is_ok_and(|s| s.st_dev == root.st_dev) {
                        stack.push((sub_upper, sub_rootfs, depth + 1));
                    }
                }
                FileType::RegularFile
                    if size > 0
                        && rustix::fs::unlinkat(&rootfs, &name, AtFlags::empty()).is_ok() =>
                {
                    count += 1;
                }
                _ => {}
            }
        }
    }
    count
}

fn open_dir<Fd: AsFd>(at: Fd, name: impl rustix::path::Arg) -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, name, flags, Mode::empty()).ok()
}

/// The entries of `dir` (not `.` and `..`) with their type and size, read whole and the
/// directory stream closed before anything is opened beneath it.
fn entries(dir: &OwnedFd) -> Vec<(CString, FileType, i64)> {
    let Ok(stream) = Dir::read_from(dir) else {
        return Vec::new();
    };
    stream
        .flatten()
        .map(|entry| entry.file_name().to_owned())
        .filter(|name| name.to_bytes() != b"." && name.to_bytes() != b"..")
        .filter_map(|name| {
            let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
            Some((name, FileType::from_raw_mode(stat.st_mode), stat.st_size))
        })
        .collect()
}

/// Shuts down the filesystem mounted at `mount` without flushing its log, if it is a
/// container's own upper filesystem: ext4 or xfs, on a loop device whose backing file is
/// `image`. Its dirty data and journal are then dropped, not written at unmount: what a
/// deleted isolated container's thousands of small files cost otherwise, one unlink or
/// one writeback each. Anything else at `mount` (the store's own filesystem above all) is
/// left alone: `false`, and the caller unlinks what was written instead.
pub fn shut_down_own_fs(mount: &Path, image: &Path) -> bool {
    let Some(dir) = open_dir(CWD, mount) else {
        return false;
    };
    let (Ok(here), Some(Ok(parent))) = (
        rustix::fs::fstat(&dir),
        mount.parent().map(rustix::fs::stat),
    ) else {
        return false;
    };
    let is_own_fs = here.st_dev != parent.st_dev
        && rustix::fs::fstatfs(&dir).is_ok_and(|fs| matches!(fs.f_type as u64, EXT4 | XFS))
        && backed_by(here.st_dev, image);
    if !is_own_fs {
        return false;
    }
    crate::raw::shutdown::shut_down_without_flush(dir.as_fd()).is_ok()
}

/// Whether the mount at `mount` is in use (a process's open file or working directory in
/// it, another mount on it): `umount2` with `MNT_EXPIRE` answers `EBUSY` then, and
/// `EAGAIN` (only marking it, which any use clears) when it is idle. A mount a former ask
/// marked and nobody used since is unmounted by this one: idle too (a reaper whose
/// teardown failed after asking asks again on its next try). Unknown counts as in use.
/// The reaper shuts a deleted container's own filesystem down only when no one is in it:
/// reads of a process still there would fail with EIO.
pub fn mount_in_use(mount: &Path) -> bool {
    !matches!(
        rustix::mount::unmount(mount, rustix::mount::UnmountFlags::EXPIRE),
        Ok(()) | Err(rustix::io::Errno::AGAIN)
    )
}

/// Whether block device `dev` is a loop device whose backing file is `image`.
fn backed_by(dev: u64, image: &Path) -> bool {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sysfs = format!("/sys/dev/block/{major}:{minor}/loop/backing_file");
    let (Ok(backing), Ok(image)) = (std::fs::read_to_string(sysfs), image.canonicalize()) else {
        return false;
    };
    Path::new(backing.trim_end_matches('\n')) == image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_with_data_go_and_symlinked_directories_are_never_entered() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, rootfs, outside) = (
            tmp.path().join("upper"),
            tmp.path().join("rootfs"),
            tmp.path().join("outside"),
        );
        for dir in [&upper, &rootfs, &outside] {
            std::fs::create_dir_all(dir.join("d")).unwrap();
        }
        for base in [&upper, &rootfs] {
            std::fs::write(base.join("d/written"), b"data").unwrap();
            std::fs::write(base.join("empty"), b"").unwrap();
        }
        std::fs::write(outside.join("keep"), b"keep").unwrap();
        // In the merged tree, `link` leads out; in the upper it looks like a directory
        // holding a file of that name.
        std::fs::create_dir(upper.join("link")).unwrap();
        std::fs::write(upper.join("link/keep"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, rootfs.join("link")).unwrap();

        assert_eq!(unlink_written(&upper, &rootfs), 1);
        assert!(!rootfs.join("d/written").exists());
        assert!(
            rootfs.join("empty").exists(),
            "an empty file has nothing to drop"
        );
        assert!(outside.join("keep").exists(), "a symlink is never followed");
    }

    #[test]
    fn a_tree_deeper_than_the_cap_is_walked_to_the_cap_and_no_further() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, rootfs) = (tmp.path().join("upper"), tmp.path().join("rootfs"));
        let deep: std::path::PathBuf = std::iter::repeat_n("d", MAX_DEPTH + 5).collect();
        for base in [&upper, &rootfs] {
            std::fs::create_dir_all(base.join(&deep)).unwrap();
            std::fs::write(base.join("d/shallow"), b"x").unwrap();
            std::fs::write(base.join(&deep).join("deep"), b"x").unwrap();
        }
        assert_eq!(unlink_written(&upper, &rootfs), 1);
        assert!(!rootfs.join("d/shallow").exists());
        assert!(
            rootfs.join(&deep).join("deep").exists(),
            "below the cap: left"
        );
    }
}
