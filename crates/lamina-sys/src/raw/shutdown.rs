//! `FS_IOC_SHUTDOWN` (`<linux/fs.h>`, ext4's and xfs's `_IOR('X', 125, __u32)`): stops a
//! filesystem at once. With `NOLOGFLUSH` its log is not flushed and its dirty data is
//! never written (ext4 still records the journal's abort in the journal's superblock).

use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::io::Errno;

const FS_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587D;
/// `FS_SHUTDOWN_FLAGS_NOLOGFLUSH`.
const NOLOGFLUSH: u32 = 2;

/// Shuts down the filesystem `fd` (its root, or any file on it) is on, without flushing
/// its log.
pub fn shut_down_without_flush(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    let flags: u32 = NOLOGFLUSH;
    // SAFETY: `fd` is live for the borrow; the kernel reads one u32 through the pointer,
    // which points at `flags` for the length of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_SHUTDOWN, &flags as *const u32) };
    if rc != 0 {
        return Err(super::last_errno());
    }
    Ok(())
}
