//! isolated (stalls S1 and S3): each read-write container's upper and work dirs on a
//! filesystem of its own, mounted at `<container>/upperfs`. Unmounting a container then
//! syncs only what it wrote, not its neighbours' dirty data; its directory copy-ups take
//! its own rename lock; and the filesystem's size is a hard disk limit (ENOSPC), which
//! this kernel cannot give with quotas. The cost is a loop device and a journal per
//! container (disk), or memory (tmpfs) — and a mkfs + loop attach + mount at create,
//! which a pool of ready upper filesystems takes off the create path.

use std::fs;
use std::path::Path;

use lamina_image::Digest;
use lamina_store::{ContainerDirs, Store, StoreError};
use lamina_sys::{DiskFs, Mounter, UpperFs};

use crate::RootfsError;
use crate::record::UpperFsRecord;
use crate::strategy::UpperBackend;

/// A disk-backed upper without a disk limit: sparse, so only written blocks use space.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;
/// A memory-backed upper without a disk limit: tmpfs only uses what is written.
pub const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;

/// The upper filesystem one isolated container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperPlan {
    pub backend: UpperBackend,
    pub size_bytes: u64,
    /// What a disk-backed upper is formatted with.
    pub disk_fs: DiskFs,
}

impl UpperPlan {
    /// `size_bytes` is the container's disk limit, if it has one.
    pub fn new(backend: UpperBackend, size_bytes: Option<u64>, disk_fs: DiskFs) -> Self {
        let default = match backend {
            UpperBackend::Disk => DEFAULT_DISK_BYTES,
            UpperBackend::Memory => DEFAULT_MEMORY_BYTES,
        };
        UpperPlan {
            backend,
            size_bytes: size_bytes.unwrap_or(default),
            disk_fs,
        }
    }

    /// What to mount for the container in `dirs`; `format` makes a new image.
    pub fn spec(&self, dirs: &ContainerDirs, format: bool) -> UpperFs {
        match self.backend {
            UpperBackend::Memory => UpperFs::Memory {
                size_bytes: self.size_bytes,
            },
            UpperBackend::Disk => UpperFs::Disk {
                image: dirs.upper_image(),
                size_bytes: self.size_bytes,
                fs: self.disk_fs,
                format,
            },
        }
    }

    /// How a container's record remembers it.
    pub fn record(&self) -> UpperFsRecord {
        UpperFsRecord {
            filesystem: match self.backend {
                UpperBackend::Memory => UpperFsRecord::TMPFS.into(),
                UpperBackend::Disk => self.disk_fs.name().into(),
            },
            size_bytes: self.size_bytes,
        }
    }

    /// The plan a record describes.
    pub fn from_record(record: &UpperFsRecord) -> Result<Self, String> {
        let (backend, disk_fs) = if record.in_memory() {
            (UpperBackend::Memory, DiskFs::default())
        } else {
            (UpperBackend::Disk, disk_fs(&record.filesystem)?)
        };
        Ok(UpperPlan {
            backend,
            size_bytes: record.size_bytes,
            disk_fs,
        })
    }

    /// Part of a pool's name: pools of different sizes or filesystems never mix.
    pub fn pool_suffix(&self) -> String {
        match self.backend {
            UpperBackend::Memory => format!("tmpfs-{}", self.size_bytes),
            UpperBackend::Disk => format!("{}-{}", self.disk_fs.name(), self.size_bytes),
        }
    }
}

/// A container's disk limit, with GrootFS's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskLimit {
    pub bytes: u64,
    /// `--exclude-image-from-quota`: the limit is for the container's writes alone;
    /// otherwise the image's size counts against it too.
    pub exclude_image: bool,
}

/// The upper filesystem for an isolated container of the image `chain_ids` (imported)
/// with disk limit `limit`: the limit, less the image's size unless the image is
/// excluded from it (GrootFS's meaning); no limit, the backend's default size.
pub fn plan_for(
    store: &Store,
    chain_ids: &[Digest],
    backend: UpperBackend,
    limit: Option<DiskLimit>,
    disk_fs: DiskFs,
) -> Result<UpperPlan, RootfsError> {
    let size = match limit {
        None => None,
        Some(limit) if limit.exclude_image => Some(limit.bytes),
        Some(limit) => {
            let mut image = 0;
            for chain_id in chain_ids {
                image += store.layer_record(chain_id)?.size;
            }
            match limit.bytes.checked_sub(image).filter(|room| *room > 0) {
                Some(room) => Some(room),
                None => {
                    return Err(RootfsError::DiskLimitTooSmall {
                        limit: limit.bytes,
                        image,
                    });
                }
            }
        }
    };
    Ok(UpperPlan::new(backend, size, disk_fs))
}

/// Parses a disk filesystem name as the config and pool targets spell it.
pub fn disk_fs(name: &str) -> Result<DiskFs, String> {
    match name {
        "ext4" => Ok(DiskFs::Ext4),
        "xfs" => Ok(DiskFs::Xfs),
        other => Err(format!(
            "unknown filesystem `{other}` for isolated uppers (available: ext4, xfs)"
        )),
    }
}

/// Gives the freshly staged container directory `base` (rootfs, upper, work, lock) its
/// own upper filesystem, and returns its directories in the isolated shape. On failure
/// nothing is left mounted; the caller removes `base`.
pub(crate) fn make(
    mounter: &dyn Mounter,
    base: &Path,
    plan: &UpperPlan,
) -> Result<ContainerDirs, RootfsError> {
    let plain = ContainerDirs::under(base.to_path_buf());
    let dirs = ContainerDirs::isolated(base.to_path_buf());
    // The staged upper and work are unused: theirs live on the new filesystem.
    for unused in [&plain.upper, &plain.work] {
        fs::remove_dir(unused).map_err(StoreError::io("removing", unused))?;
    }
    let mount_point = dirs.upper_fs_mount();
    fs::create_dir(&mount_point).map_err(StoreError::io("creating", &mount_point))?;
    mounter.mount_upper_fs(&plan.spec(&dirs, true), &mount_point)?;
    for dir in [&dirs.upper, &dirs.work] {
        if let Err(e) = fs::create_dir(dir) {
            let _ = mounter.unmount(&mount_point);
            return Err(StoreError::io("creating", dir)(e).into());
        }
    }
    Ok(dirs)
}

/// Mounts an isolated container's upper filesystem again if it is not mounted (after a
/// host restart): a disk image is attached and mounted as it is; a memory upper is gone,
/// and with it the container's writes.
pub(crate) fn remount(
    mounter: &dyn Mounter,
    id: &str,
    dirs: &ContainerDirs,
    plan: &UpperPlan,
) -> Result<(), RootfsError> {
    let mount_point = dirs.upper_fs_mount();
    if mounter.is_mountpoint(&mount_point)? {
        return Ok(());
    }
    match plan.backend {
        UpperBackend::Memory => Err(RootfsError::MemoryUpperLost { id: id.into() }),
        UpperBackend::Disk => Ok(mounter.mount_upper_fs(&plan.spec(dirs, false), &mount_point)?),
    }
}
