//! Dropping a deleted container's written data before its overlay is unmounted: every
//! regular file with data in the upper is unlinked through the merged mount, so the
//! kernel drops its dirty pages instead of writing them back at unmount (stall S1).
//!
//! The walk runs as root over directories a container's processes may still change, so
//! it goes by directory fds, one name at a time, never following a symlink: a directory
//! swapped for a link to `/etc` mid-walk is skipped, never entered.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};

/// Unlinks, through `rootfs`, every non-empty regular file found in `upper` (the same
/// tree, as overlay lays it out). Errors are skipped: the unmount and removal that follow
/// are what must succeed. Returns how many files were unlinked.
pub fn unlink_written(upper: &Path, rootfs: &Path) -> usize {
    match (open_dir(CWD, upper), open_dir(CWD, rootfs)) {
        (Some(upper), Some(rootfs)) => walk(&upper, &rootfs),
        _ => 0,
    }
}

fn open_dir<Fd: AsFd>(at: Fd, name: impl rustix::path::Arg) -> Option<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, name, flags, Mode::empty()).ok()
}

fn walk(upper: &OwnedFd, rootfs: &OwnedFd) -> usize {
    let Ok(dir) = Dir::read_from(upper) else {
        return 0;
    };
    let mut count = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(stat) = rustix::fs::statat(upper, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                if let (Some(sub_upper), Some(sub_rootfs)) =
                    (open_dir(upper, name), open_dir(rootfs, name))
                {
                    count += walk(&sub_upper, &sub_rootfs);
                }
            }
            FileType::RegularFile
                if stat.st_size > 0
                    && rustix::fs::unlinkat(rootfs, name, AtFlags::empty()).is_ok() =>
            {
                count += 1;
            }
            _ => {}
        }
    }
    count
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
}
