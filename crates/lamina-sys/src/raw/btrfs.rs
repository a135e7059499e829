//! The btrfs ioctls a quota-backed upper needs (`<linux/btrfs.h>`): create and delete a
//! subvolume, find its ID and the filesystem's UUID, and set or destroy its qgroup. Usage
//! and "are quotas enabled" are read from sysfs (`/sys/fs/btrfs/<fsid>/qgroups`), which
//! needs no ioctl.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use rustix::io::Errno;

/// `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`.
const BTRFS_IOC_SUBVOL_CREATE: libc::c_ulong = 0x5000_940E;
/// `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`.
const BTRFS_IOC_SNAP_DESTROY: libc::c_ulong = 0x5000_940F;
/// `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)`.
const BTRFS_IOC_INO_LOOKUP: libc::c_ulong = 0xD000_9412;
/// `_IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)`.
const BTRFS_IOC_FS_INFO: libc::c_ulong = 0x8400_941F;
/// `_IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)`.
const BTRFS_IOC_QGROUP_CREATE: libc::c_ulong = 0x4010_942A;
/// `_IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)`.
const BTRFS_IOC_QGROUP_LIMIT: libc::c_ulong = 0x8030_942B;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`: limit the bytes the qgroup references.
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
/// `BTRFS_FIRST_FREE_OBJECTID`: the inode number of every subvolume's root directory.
pub const SUBVOLUME_ROOT_INO: u64 = 256;
/// `BTRFS_SUPER_MAGIC` from `<linux/magic.h>`.
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// `BTRFS_PATH_NAME_MAX`.
const PATH_NAME_MAX: usize = 4087;

/// `struct btrfs_ioctl_vol_args` (4096 bytes).
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_ino_lookup_args` (4096 bytes).
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args` (1024 bytes); only `fsid` is read.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 1024 - 32],
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args` with its `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<InoLookupArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<FsInfoArgs>() == 1024);
const _: () = assert!(std::mem::size_of::<QgroupCreateArgs>() == 16);
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);

fn vol_args(name: &OsStr) -> Result<Box<VolArgs>, Errno> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > PATH_NAME_MAX || bytes.contains(&0) {
        return Err(Errno::NAMETOOLONG);
    }
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    });
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

fn check(rc: libc::c_int) -> Result<(), Errno> {
    if rc < 0 {
        Err(super::last_errno())
    } else {
        Ok(())
    }
}

/// Creates subvolume `name` in the directory `parent` (on btrfs).
pub fn create_subvolume(parent: &File, name: &OsStr) -> Result<(), Errno> {
    let mut args = vol_args(name)?;
    // SAFETY: `parent` is open for the call; `args` is a valid, NUL-terminated
    // `btrfs_ioctl_vol_args` the kernel only reads.
    check(unsafe {
        libc::ioctl(
            parent.as_raw_fd(),
            BTRFS_IOC_SUBVOL_CREATE,
            &mut *args as *mut VolArgs,
        )
    })
}

/// Deletes subvolume `name` in the directory `parent`.
pub fn delete_subvolume(parent: &File, name: &OsStr) -> Result<(), Errno> {
    let mut args = vol_args(name)?;
    // SAFETY: as in `create_subvolume`.
    check(unsafe {
        libc::ioctl(
            parent.as_raw_fd(),
            BTRFS_IOC_SNAP_DESTROY,
            &mut *args as *mut VolArgs,
        )
    })
}

/// The ID of the subvolume `file` (any file in it) is in.
pub fn subvolume_id(file: &File) -> Result<u64, Errno> {
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: SUBVOLUME_ROOT_INO,
        name: [0; 4080],
    });
    // SAFETY: `file` is open for the call; `args` is a writable `btrfs_ioctl_ino_lookup_args`.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BTRFS_IOC_INO_LOOKUP,
            &mut *args as *mut InoLookupArgs,
        )
    })?;
    Ok(args.treeid)
}

/// The UUID of the btrfs filesystem `file` is on, as sysfs names its directory.
pub fn fsid(file: &File) -> Result<String, Errno> {
    let mut args = Box::new(FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        rest: [0; 1024 - 32],
    });
    // SAFETY: `file` is open for the call; `args` is a writable `btrfs_ioctl_fs_info_args`
    // whose input flags (in `rest`) are zero.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BTRFS_IOC_FS_INFO,
            &mut *args as *mut FsInfoArgs,
        )
    })?;
    let hex: Vec<String> = args.fsid.iter().map(|b| format!("{b:02x}")).collect();
    let hex = hex.concat();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// Limits the qgroup of the subvolume `file` is the root of to `max_referenced` bytes.
pub fn limit_qgroup(file: &File, max_referenced: u64) -> Result<(), Errno> {
    let mut args = QgroupLimitArgs {
        // 0: the qgroup of the subvolume `file` is in.
        qgroupid: 0,
        flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
        max_rfer: max_referenced,
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    // SAFETY: `file` is open for the call; `args` is a valid `btrfs_ioctl_qgroup_limit_args`.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BTRFS_IOC_QGROUP_LIMIT,
            &mut args as *mut QgroupLimitArgs,
        )
    })
}

/// Destroys level-0 qgroup `0/<subvolume>` of the filesystem `file` is on.
pub fn destroy_qgroup(file: &File, subvolume: u64) -> Result<(), Errno> {
    let mut args = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume,
    };
    // SAFETY: `file` is open for the call; `args` is a valid `btrfs_ioctl_qgroup_create_args`.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BTRFS_IOC_QGROUP_CREATE,
            &mut args as *mut QgroupCreateArgs,
        )
    })
}
