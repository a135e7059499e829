//! isolated (stalls S1 and S3): each read-write container's upper and work dirs on a
//! filesystem of its own, mounted at `<container>/upperfs`. Unmounting a container then
//! syncs only what it wrote, not its neighbours' dirty data; its directory copy-ups take
//! its own rename lock; and the filesystem's size is a hard disk limit (ENOSPC), which
//! this kernel cannot give with quotas. The cost is a loop device and a journal per
//! container (disk), or memory (tmpfs) — and a mkfs + loop attach + mount at create,
//! which a pool of ready upper filesystems takes off the create path.
//!
//! `isolated-quota` keeps the shape (`<container>/upperfs/{upper,work}`) but makes
//! `upperfs` a btrfs subvolume of the store's filesystem with a qgroup limit: the disk
//! limit (EDQUOT) at the cost of one ioctl, with no loop device, journal or kernel thread.
//! It shares the store's superblock, so it gives the limit only, not S1's or S3's relief.

use std::fs;
use std::path::Path;

use lamina_image::Digest;
use lamina_store::{ContainerDirs, Store, StoreError};
use lamina_sys::{DiskFs, Mounter, UpperFs};

use crate::RootfsError;
use crate::model::record::UpperFsRecord;
use crate::model::strategy::UpperBackend;

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
            UpperBackend::Disk | UpperBackend::Quota => DEFAULT_DISK_BYTES,
            UpperBackend::Memory => DEFAULT_MEMORY_BYTES,
        };
        UpperPlan {
            backend,
            size_bytes: size_bytes.unwrap_or(default),
            disk_fs,
        }
    }

    /// What to mount for the container in `dirs`; `format` makes a new image. `None`
    /// for a quota upper, which is a subvolume and never mounted.
    pub fn spec(&self, dirs: &ContainerDirs, format: bool) -> Option<UpperFs> {
        match self.backend {
            UpperBackend::Memory => Some(UpperFs::Memory {
                size_bytes: self.size_bytes,
            }),
            UpperBackend::Disk => Some(UpperFs::Disk {
                image: dirs.upper_image(),
                size_bytes: self.size_bytes,
                fs: self.disk_fs,
                format,
            }),
            UpperBackend::Quota => None,
        }
    }

    /// How a container's record remembers it.
    pub fn record(&self) -> UpperFsRecord {
        UpperFsRecord {
            filesystem: match self.backend {
                UpperBackend::Memory => UpperFsRecord::TMPFS.into(),
                UpperBackend::Quota => UpperFsRecord::SUBVOLUME.into(),
                UpperBackend::Disk => self.disk_fs.name().into(),
            },
            size_bytes: self.size_bytes,
        }
    }

    /// The plan a record describes.
    pub fn from_record(record: &UpperFsRecord) -> Result<Self, String> {
        let (backend, disk_fs) = match record.backend() {
            UpperBackend::Disk => (UpperBackend::Disk, disk_fs(&record.filesystem)?),
            other => (other, DiskFs::default()),
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
            UpperBackend::Quota => format!("subvolume-{}", self.size_bytes),
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
    if backend == UpperBackend::Memory
        && let Some(limit) = size
        && let Some(ceiling) = memory_ceiling()
        && limit > ceiling
    {
        // What a tmpfs holds is memory that cannot be dropped, only swapped (on a host
        // with swap): past half the host's memory (tmpfs's own default size) one
        // container could take the rest. The bound is per upper; a container's memory
        // cgroup, which its writes are charged to, bounds it further.
        return Err(RootfsError::MemoryUpperTooLarge { limit, ceiling });
    }
    Ok(UpperPlan::new(backend, size, disk_fs))
}

/// Half of the host's memory (`MemTotal`), the most one memory-backed upper may hold.
fn memory_ceiling() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024 / 2)
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
    let spec = plan.spec(&dirs, true);
    match &spec {
        Some(spec) => {
            fs::create_dir(&mount_point).map_err(StoreError::io("creating", &mount_point))?;
            mounter.mount_upper_fs(spec, &mount_point)?;
        }
        None => mounter.create_subvolume(&mount_point, plan.size_bytes)?,
    }
    for dir in [&dirs.upper, &dirs.work] {
        if let Err(e) = fs::create_dir(dir) {
            let _ = match spec {
                Some(_) => mounter.unmount(&mount_point),
                None => mounter.delete_subvolume(&mount_point),
            };
            return Err(StoreError::io("creating", dir)(e).into());
        }
    }
    Ok(dirs)
}

/// Deletes the quota upper's subvolume in container (or trashed, or staged) directory
/// `base`, if it has one, so the directory can be removed and the qgroup goes with it.
/// Every path that removes a container directory calls this first: `rm -rf` would
/// leave the qgroup to the kernel (which removes it only from Linux 6.9 on), and before
/// Linux 4.18 could not remove the subvolume at all.
pub(crate) fn delete_subvolume_in(mounter: &dyn Mounter, base: &Path) -> Result<(), RootfsError> {
    let subvolume = ContainerDirs::isolated(base.to_path_buf()).upper_fs_mount();
    if mounter.delete_subvolume(&subvolume)? {
        tracing::debug!(subvolume = %subvolume.display(), "deleted quota upper subvolume");
    }
    Ok(())
}

/// What a quota upper's qgroup counts: its written bytes, without walking the upper.
pub(crate) fn quota_usage(mounter: &dyn Mounter, dirs: &ContainerDirs) -> Result<u64, RootfsError> {
    Ok(mounter.subvolume_usage(&dirs.upper_fs_mount())?)
}

/// Mounts an isolated container's upper filesystem again if it is not mounted (after a
/// host restart): a disk image is attached and mounted as it is; a memory upper is gone,
/// and with it the container's writes. A quota upper is a subvolume of the store's
/// filesystem: there is nothing to mount, but its limit is set again, since turning
/// btrfs quotas off and on drops every qgroup's limit.
pub(crate) fn remount(
    mounter: &dyn Mounter,
    id: &str,
    dirs: &ContainerDirs,
    plan: &UpperPlan,
) -> Result<(), RootfsError> {
    let mount_point = dirs.upper_fs_mount();
    if plan.backend == UpperBackend::Quota {
        return Ok(mounter.limit_subvolume(&mount_point, plan.size_bytes)?);
    }
    if mounter.is_mountpoint(&mount_point)? {
        return Ok(());
    }
    match plan.spec(dirs, false) {
        _ if plan.backend == UpperBackend::Memory => {
            Err(RootfsError::MemoryUpperLost { id: id.into() })
        }
        Some(spec) => Ok(mounter.mount_upper_fs(&spec, &mount_point)?),
        None => Ok(()),
    }
}
