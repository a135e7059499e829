//! The kernel calls rustix does not wrap: `mount_setattr(2)`, the loop device ioctls and the
//! btrfs subvolume and qgroup ioctls, xfs's geometry ioctl, `FIDEDUPERANGE` and
//! `FS_IOC_ENABLE_VERITY`, `FS_IOC_SHUTDOWN`, and `sync_file_range(2)`.
//! This is the only module in the workspace allowed `unsafe`; each submodule exposes safe
//! functions over borrowed or owned file descriptors, and every `unsafe` block says why
//! it is sound.

#![allow(unsafe_code)]

pub mod btrfs;
pub mod dedupe;
pub mod loop_dev;
pub mod setattr;
pub mod shutdown;
pub mod verity;
pub mod writeback;
pub mod xfs;

/// The error the raw call that just failed set (`errno`).
pub(crate) fn last_errno() -> rustix::io::Errno {
    let e = std::io::Error::last_os_error();
    rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO)
}
