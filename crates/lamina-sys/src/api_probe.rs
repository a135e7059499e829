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

/// Whether overlay accepts an idmapped lower layer: `lower` is cloned with `open_tree`,
/// idmapped with the user namespace `userns` (an open `/proc/<pid>/ns/user`), and passed
/// as a `lowerdir+` fd above `other`. The overlay is created but never attached.
pub fn probe_idmapped_layers(
    lower: &std::path::Path,
    other: &std::path::Path,
    userns: std::os::fd::BorrowedFd<'_>,
) -> bool {
    use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, OpenTreeFlags};
    let attempt = || -> Result<(), Errno> {
        let tree = rustix::mount::open_tree(
            rustix::fs::CWD,
            lower,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        crate::raw::setattr::set_idmap(tree.as_fd(), userns)?;
        let fs = rustix::mount::fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
        rustix::mount::fsconfig_set_fd(fs.as_fd(), "lowerdir+", tree.as_fd())?;
        rustix::mount::fsconfig_set_string(fs.as_fd(), "lowerdir+", other)?;
        rustix::mount::fsconfig_create(fs.as_fd())?;
        rustix::mount::fsmount(
            fs.as_fd(),
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_RDONLY,
        )?;
        Ok(())
    };
    attempt().is_ok()
}
