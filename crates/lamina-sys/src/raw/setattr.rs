//! `mount_setattr(2)`, which rustix does not wrap: safe functions taking a borrowed
//! mount fd.

use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::io::Errno;

/// `struct mount_attr` from `<linux/mount.h>` (version 0, 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY` from `<linux/mount.h>`.
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;

/// `MOUNT_ATTR_IDMAP` from `<linux/mount.h>`.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Makes the (detached or attached) mount `mount_fd` refers to read-only.
pub fn set_read_only(mount_fd: BorrowedFd<'_>) -> Result<(), Errno> {
    mount_setattr(
        mount_fd,
        &MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        },
    )
}

/// Idmaps the detached mount `mount_fd` with the mappings of user namespace `userns`.
pub fn set_idmap(mount_fd: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> Result<(), Errno> {
    let userns_fd = u64::try_from(userns.as_raw_fd()).map_err(|_| Errno::BADF)?;
    mount_setattr(
        mount_fd,
        &MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd,
        },
    )
}

fn mount_setattr(mount_fd: BorrowedFd<'_>, attr: &MountAttr) -> Result<(), Errno> {
    let empty_path = c"";
    // SAFETY: `mount_fd` is a live descriptor for the borrow's duration; `empty_path` is a
    // NUL-terminated static string; `attr` is a properly laid out `struct mount_attr`
    // borrowed for the whole call, and its exact size is passed so the kernel reads no further. The
    // kernel only reads through both pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount_fd.as_raw_fd(),
            empty_path.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(super::last_errno())
    }
}
