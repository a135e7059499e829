//! Ownership, mode, xattrs and times for an entry once it exists.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, Gid, Mode, Timespec, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

/// What a tar header (and its PAX records) says about an entry's metadata.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Overlay and lamina set `trusted.overlay.*` themselves; a layer that ships them could
/// forge redirects, metacopy or opaque markers, so they are dropped on import.
pub fn is_reserved_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.")
}

pub fn timestamps(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Applies everything through an fd of the object itself (regular files, directories).
/// Owner first: chown clears setuid/setgid, so the mode must come after it.
pub fn apply_fd(fd: BorrowedFd<'_>, meta: &Meta) -> Result<(), Errno> {
    rustix::fs::fchown(
        fd,
        Some(Uid::from_raw(meta.uid)),
        Some(Gid::from_raw(meta.gid)),
    )?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode & 0o7777))?;
    for (name, value) in &meta.xattrs {
        rustix::fs::fsetxattr(fd, name.as_slice(), value, XattrFlags::empty())?;
    }
    rustix::fs::futimens(fd, &timestamps(meta.mtime))
}

/// Applies metadata to `name` in `parent` without following it (symlinks, device nodes,
/// FIFOs: objects that cannot be opened for this safely). `chmod` is skipped for
/// symlinks, whose mode Linux ignores.
pub fn apply_at(
    parent: BorrowedFd<'_>,
    name: &[u8],
    meta: &Meta,
    is_symlink: bool,
) -> Result<(), Errno> {
    rustix::fs::chownat(
        parent,
        name,
        Some(Uid::from_raw(meta.uid)),
        Some(Gid::from_raw(meta.gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    if !is_symlink {
        rustix::fs::chmodat(
            parent,
            name,
            Mode::from_raw_mode(meta.mode & 0o7777),
            AtFlags::empty(),
        )?;
    }
    if !meta.xattrs.is_empty() {
        // lsetxattr on /proc/self/fd/N/NAME: the magic link pins the parent we already
        // resolved safely, and the final component is not followed.
        let path = via_proc(parent, name);
        for (xname, value) in &meta.xattrs {
            rustix::fs::lsetxattr(&path, xname.as_slice(), value, XattrFlags::empty())?;
        }
    }
    rustix::fs::utimensat(
        parent,
        name,
        &timestamps(meta.mtime),
        AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Sets one xattr on `name` in `parent` without following it.
pub fn set_xattr_at(
    parent: BorrowedFd<'_>,
    name: &[u8],
    xname: &str,
    value: &[u8],
) -> Result<(), Errno> {
    rustix::fs::lsetxattr(via_proc(parent, name), xname, value, XattrFlags::empty())
}

fn via_proc(parent: BorrowedFd<'_>, name: &[u8]) -> PathBuf {
    let mut path = PathBuf::from(format!("/proc/self/fd/{}", parent.as_fd().as_raw_fd()));
    path.push(OsStr::from_bytes(name));
    path
}
