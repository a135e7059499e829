//! Which parts of the new mount API this kernel has, asked of the kernel directly: an
//! overlay filesystem context is opened and configured but never created or mounted.

use std::os::fd::AsFd;

use rustix::io::Errno;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountApiSupport {
    /// fsopen/fsconfig/fsmount/move_mount exist (5.2+).
    pub new_mount_api: bool,
    /// overlay takes one lower layer per `lowerdir+` call (6.8+).
    pub lowerdir_plus: bool,
}

pub fn probe_mount_api() -> MountApiSupport {
    let fs = match rustix::mount::fsopen("overlay", rustix::mount::FsOpenFlags::FSOPEN_CLOEXEC) {
        Ok(fd) => fd,
        Err(Errno::NOSYS) | Err(_) => {
            return MountApiSupport {
                new_mount_api: false,
                lowerdir_plus: false,
            };
        }
    };
    let lowerdir_plus = rustix::mount::fsconfig_set_string(fs.as_fd(), "lowerdir+", "/").is_ok();
    MountApiSupport {
        new_mount_api: true,
        lowerdir_plus,
    }
}
