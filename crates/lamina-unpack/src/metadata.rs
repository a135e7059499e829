//! Ownership, mode, xattrs and times for an entry once it exists. Ownership and xattrs
//! go through the kernel seam ([`HostFs`]): they need privilege (a chown to another
//! user, `trusted.*`, `security.capability`) that a test on the fake does not have.

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;

use lamina_sys::{At, HostFs};
use rustix::fs::{AtFlags, Timespec, Timestamps};
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
pub fn apply_fd(host: &dyn HostFs, fd: BorrowedFd<'_>, meta: &Meta) -> Result<(), Errno> {
    host.chown(At::Fd(fd), meta.uid, meta.gid)?;
    host.set_mode(At::Fd(fd), meta.mode)?;
    for (name, value) in &meta.xattrs {
        host.set_xattr(At::Fd(fd), OsStr::from_bytes(name), value)?;
    }
    rustix::fs::futimens(fd, &timestamps(meta.mtime))
}

/// Applies metadata to `name` in `parent` without following it (symlinks, device nodes,
/// FIFOs: objects that cannot be opened for this safely). `chmod` is skipped for
/// symlinks, whose mode Linux ignores.
pub fn apply_at(
    host: &dyn HostFs,
    parent: BorrowedFd<'_>,
    name: &[u8],
    meta: &Meta,
    is_symlink: bool,
) -> Result<(), Errno> {
    let at = At::Child(parent, OsStr::from_bytes(name));
    host.chown(at, meta.uid, meta.gid)?;
    if !is_symlink {
        host.set_mode(at, meta.mode)?;
    }
    // The seam sets these with lsetxattr on /proc/self/fd/N/NAME: the magic link pins
    // the parent we already resolved safely, and the final component is not followed.
    for (xname, value) in &meta.xattrs {
        host.set_xattr(at, OsStr::from_bytes(xname), value)?;
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
    host: &dyn HostFs,
    parent: BorrowedFd<'_>,
    name: &[u8],
    xname: &str,
    value: &[u8],
) -> Result<(), Errno> {
    host.set_xattr(
        At::Child(parent, OsStr::from_bytes(name)),
        OsStr::new(xname),
        value,
    )
}
