//! The mounter that really mounts: the new mount API (fsopen/fsconfig/fsmount/move_mount)
//! with one `lowerdir+` call per layer, so images with hundreds of layers mount; classic
//! mount(2) only where the kernel lacks the new API or `lowerdir+`.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, OFlags};
use rustix::io::Errno;
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MoveMountFlags, OpenTreeFlags,
    UnmountFlags,
};

use crate::{MountError, Mounter, OverlaySpec, UpperFs, UserNsMaps};

/// fsconfig string values longer than this are rejected by the kernel; such layer paths
/// are passed as O_PATH file descriptors instead.
const FSCONFIG_MAX_STRING: usize = 255;

/// Classic mount(2) takes at most one page of options.
const LEGACY_OPTIONS_MAX: usize = 4095;

#[derive(Debug, Default, Clone)]
pub struct RealMounter {
    /// Skip the new mount API (for tests of the fallback path).
    pub force_legacy: bool,
}

impl RealMounter {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Mounter for RealMounter {
    fn mount_overlay(&self, spec: &OverlaySpec, target: &Path) -> Result<(), MountError> {
        if let (Some(upper), Some((uid, gid))) = (&spec.upper, spec.upper_owner) {
            rustix::fs::chownat(
                CWD,
                upper,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| MountError::new("chown upper dir", upper, e))?;
        }
        if !self.force_legacy {
            match mount_with_fsopen(spec, target) {
                Err(NewApi::Unsupported) => {}
                Err(NewApi::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
        mount_legacy(spec, target)
    }

    fn unmount(&self, target: &Path) -> Result<bool, MountError> {
        match rustix::mount::unmount(target, UnmountFlags::NOFOLLOW) {
            Ok(()) => Ok(true),
            Err(Errno::INVAL) if !self.is_mountpoint(target)? => Ok(false),
            Err(Errno::NOENT) => Ok(false),
            Err(errno) => Err(MountError::new("unmount", target, errno)),
        }
    }

    fn in_use(&self, mount: &Path) -> bool {
        crate::mount_in_use(mount)
    }

    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError> {
        crate::is_mount_root(path).map_err(|e| MountError::new("statx", path, e))
    }

    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let fail = |op| move |e| MountError::new(op, target, e);
        let tree = rustix::mount::open_tree(
            CWD,
            source,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(|e| MountError::new("clone mount for bind", source, e))?;
        crate::raw::setattr::set_read_only(tree.as_fd())
            .map_err(fail("make read-only bind for"))?;
        attach(tree, target).map_err(fail("attach read-only bind at"))
    }

    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| MountError::new("open for syncfs", path, e))?;
        rustix::fs::syncfs(&dir).map_err(|e| MountError::new("syncfs", path, e))
    }

    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError> {
        crate::upper_fs::mount(fs, target)
    }

    fn mount_erofs(&self, image: &Path, target: &Path) -> Result<(), MountError> {
        let mnt = mount_erofs_detached(image)
            .map_err(|e| MountError::new(crate::MOUNT_EROFS_OP, image, e))?;
        attach(mnt, target).map_err(|e| MountError::new("attach EROFS image at", target, e))
    }

    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError> {
        crate::mounts_under(dir).map_err(|e| {
            MountError::new(
                "read /proc/self/mountinfo for",
                dir,
                Errno::from_io_error(&e).unwrap_or(Errno::IO),
            )
        })
    }

    fn writable_mount_of(
        &self,
        upper: &Path,
        except: &Path,
    ) -> Result<Option<PathBuf>, MountError> {
        crate::writable_mount_of(upper, except).map_err(|e| {
            MountError::new(
                "read /proc/self/mountinfo for",
                upper,
                Errno::from_io_error(&e).unwrap_or(Errno::IO),
            )
        })
    }

    fn probe_mount_api(&self) -> crate::MountApiSupport {
        crate::probe_mount_api()
    }

    fn probe_idmapped_layers(&self, lower: &Path, other: &Path, maps: &UserNsMaps) -> bool {
        crate::user_namespace(maps)
            .is_ok_and(|ns| crate::probe_idmapped_layers(lower, other, ns.as_fd()))
    }

    fn detach_loop_device(&self, device: &Path) -> Result<(), MountError> {
        crate::detach_loop_device(device)
    }

    fn loop_backing_files(&self) -> Vec<(PathBuf, PathBuf)> {
        crate::loop_backing_files()
    }

    fn create_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        crate::subvolume::create(path, limit_bytes)
    }

    fn delete_subvolume(&self, path: &Path) -> Result<bool, MountError> {
        crate::subvolume::delete(path)
    }

    fn subvolume_usage(&self, path: &Path) -> Result<u64, MountError> {
        crate::subvolume::usage(path)
    }

    fn limit_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        crate::subvolume::limit(path, limit_bytes)
    }

    fn btrfs_quotas(&self, dir: &Path) -> bool {
        crate::subvolume::quotas_enabled(dir)
    }
}

enum NewApi {
    /// The kernel lacks fsopen or `lowerdir+`: try mount(2).
    Unsupported,
    Failed(MountError),
}

fn mount_with_fsopen(spec: &OverlaySpec, target: &Path) -> Result<(), NewApi> {
    let fs = match rustix::mount::fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC) {
        Ok(fd) => fd,
        Err(Errno::NOSYS) => return Err(NewApi::Unsupported),
        Err(e) => {
            return Err(NewApi::Failed(MountError::new(
                "fsopen overlay for",
                target,
                e,
            )));
        }
    };
    let fail = |e: Errno| {
        NewApi::Failed(with_kernel_log(
            &fs,
            MountError::new("mount overlay at", target, e),
        ))
    };

    // Each idmapped lower is a detached clone, held until the superblock is created.
    let userns = match &spec.lower_idmap {
        Some(maps) => Some(crate::user_namespace(maps).map_err(|e| {
            NewApi::Failed(MountError::new(
                "make a user namespace to idmap the layers of",
                target,
                Errno::from_io_error(&e).unwrap_or(Errno::INVAL),
            ))
        })?),
        None => None,
    };
    let mut idmapped = Vec::new();
    for (i, lower) in spec.lowers.iter().enumerate() {
        let set = match &userns {
            Some(ns) => idmapped_tree(lower, ns.as_fd()).and_then(|tree| {
                let set = rustix::mount::fsconfig_set_fd(fs.as_fd(), "lowerdir+", tree.as_fd());
                idmapped.push(tree);
                set
            }),
            None => set_path(fs.as_fd(), "lowerdir+", lower),
        };
        match set {
            // Kernels before 6.8 do not know `lowerdir+`; only the first call can tell us.
            Err(Errno::INVAL) if i == 0 && kernel_log(&fs).contains("lowerdir+") => {
                return Err(NewApi::Unsupported);
            }
            Err(e) => return Err(fail(e)),
            Ok(()) => {}
        }
    }
    for data in &spec.data_lowers {
        set_path(fs.as_fd(), "datadir+", data).map_err(fail)?;
    }
    if let Some(upper) = &spec.upper {
        set_path(fs.as_fd(), "upperdir", upper).map_err(fail)?;
    }
    if let Some(work) = &spec.work {
        set_path(fs.as_fd(), "workdir", work).map_err(fail)?;
    }
    for (key, value) in &spec.options {
        match value {
            Some(v) => rustix::mount::fsconfig_set_string(fs.as_fd(), key.as_str(), v.as_str()),
            None => rustix::mount::fsconfig_set_flag(fs.as_fd(), key.as_str()),
        }
        .map_err(fail)?;
    }
    rustix::mount::fsconfig_create(fs.as_fd()).map_err(fail)?;
    drop(idmapped);
    let attrs = if spec.read_only {
        MountAttrFlags::MOUNT_ATTR_RDONLY
    } else {
        MountAttrFlags::empty()
    };
    let mnt =
        rustix::mount::fsmount(fs.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, attrs).map_err(fail)?;
    attach(mnt, target).map_err(fail)
}

/// Attaches the detached mount `mnt` (from fsmount or open_tree) at `target`, and closes
/// its fd before returning: while it is open, a later umount fails with EBUSY.
fn attach(mnt: OwnedFd, target: &Path) -> Result<(), Errno> {
    rustix::mount::move_mount(
        mnt.as_fd(),
        "",
        CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
}

/// A detached read-only EROFS mount of the image file `image` (a file-backed EROFS:
/// no loop device).
fn mount_erofs_detached(image: &Path) -> Result<OwnedFd, Errno> {
    // EROFS opens its source by name; the image is named through an fd of ours, so a
    // long store path needs no special case and the file opened is the one checked.
    let file = rustix::fs::open(
        image,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        rustix::fs::Mode::empty(),
    )?;
    let fs = rustix::mount::fsopen("erofs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    let source = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
    rustix::mount::fsconfig_set_string(fs.as_fd(), "source", source.as_str())?;
    rustix::mount::fsconfig_set_flag(fs.as_fd(), "ro")?;
    rustix::mount::fsconfig_create(fs.as_fd())?;
    rustix::mount::fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
}

/// A detached clone of `dir`'s mount, idmapped with the user namespace `userns`.
fn idmapped_tree(dir: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let tree = rustix::mount::open_tree(
        CWD,
        dir,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?;
    crate::raw::setattr::set_idmap(tree.as_fd(), userns)?;
    Ok(tree)
}

/// Sets a path-valued overlay parameter, as a string when the kernel's 255-byte limit
/// allows and as an O_PATH descriptor otherwise.
fn set_path(fs: BorrowedFd<'_>, key: &str, path: &Path) -> Result<(), Errno> {
    if path.as_os_str().len() <= FSCONFIG_MAX_STRING {
        return rustix::mount::fsconfig_set_string(fs, key, path);
    }
    let dir: OwnedFd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::mount::fsconfig_set_fd(fs, key, dir.as_fd())
}

/// Messages the kernel queued on the filesystem context ("e overlay: ...").
fn kernel_log(fs: &OwnedFd) -> String {
    let mut lines = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = rustix::io::read(fs, &mut buf) {
        if n == 0 {
            break;
        }
        lines.push(String::from_utf8_lossy(&buf[..n]).trim().to_string());
    }
    lines.join("; ")
}

fn with_kernel_log(fs: &OwnedFd, err: MountError) -> MountError {
    let log = kernel_log(fs);
    if log.is_empty() {
        err
    } else {
        err.with_detail(log)
    }
}

fn mount_legacy(spec: &OverlaySpec, target: &Path) -> Result<(), MountError> {
    if spec.lower_idmap.is_some() {
        return Err(
            MountError::new("mount overlay at", target, Errno::OPNOTSUPP).with_detail(
                "idmapped layers need the new mount API with `lowerdir+`, which this kernel lacks"
                    .to_string(),
            ),
        );
    }
    let data = spec
        .option_strings()
        .into_iter()
        .filter(|o| o != "ro")
        .collect::<Vec<_>>()
        .join(",");
    if data.len() > LEGACY_OPTIONS_MAX {
        return Err(MountError::new("mount overlay at", target, Errno::NAMETOOLONG).with_detail(format!(
            "{} bytes of options exceed mount(2)'s one-page limit and this kernel lacks fsopen/lowerdir+",
            data.len()
        )));
    }
    let data = CString::new(data.as_bytes()).map_err(|_| {
        MountError::new("mount overlay at", target, Errno::INVAL).with_detail("option contains NUL")
    })?;
    let flags = if spec.read_only {
        MountFlags::RDONLY
    } else {
        MountFlags::empty()
    };
    rustix::mount::mount("overlay", target, "overlay", flags, Some(data.as_c_str()))
        .map_err(|e| MountError::new("mount overlay at", target, e))
}
