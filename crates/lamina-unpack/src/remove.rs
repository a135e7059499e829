//! Removing an entry a later tar entry replaces, without following symlinks inside it.

use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{AtFlags, Dir, Mode, OFlags};
use rustix::io::Errno;

/// Removes `name` in `parent`, recursively if it is a directory.
pub fn remove_at(parent: BorrowedFd<'_>, name: &[u8], is_dir: bool) -> Result<(), Errno> {
    if !is_dir {
        return rustix::fs::unlinkat(parent, name, AtFlags::empty());
    }
    let dir = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut children = Vec::new();
    for entry in Dir::read_from(&dir)? {
        let entry = entry?;
        let child = entry.file_name().to_bytes();
        if child != b"." && child != b".." {
            children.push((
                child.to_vec(),
                entry.file_type() == rustix::fs::FileType::Directory,
            ));
        }
    }
    for (child, child_is_dir) in children {
        remove_at(dir.as_fd(), &child, child_is_dir)?;
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}
