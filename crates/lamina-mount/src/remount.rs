//! Unmounting a container while keeping it, and mounting it again (after `unmount`, or
//! after a host restart took its mounts away). The one hazard is a volatile upper: the
//! kernel leaves `work/work/incompat/volatile` behind and refuses to mount over it,
//! because after a crash the upper may have lost writes. lamina removes that marker only
//! after a clean unmount where `syncfs` on the overlay reported no writeback error and
//! the upper filesystem was then synced; otherwise it refuses to remount.
//!
//! An isolated container's own upper filesystem stays mounted across `unmount` (a
//! memory upper would otherwise lose the writes `unmount` promises to keep); `mount`
//! mounts it again only if a host restart took it away.

use std::fs;

use lamina_store::{ContainerDirs, ContainerRecord, Store, StoreError};
use lamina_sys::Mounter;

use crate::one_step::holding_id;
use crate::{RootfsError, Strategies, UpperPlan, isolated, plan, shared, volatile_marker};

/// Unmounts container `id`'s rootfs and keeps everything else.
pub fn unmount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    holding_id(store, id, || unmount_held(store, mounter, id))
}

fn unmount_held(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    let mut record = store.record(id)?;
    let dirs = dirs_of(store, &record);
    let volatile = strategies(&record).volatile;
    let mounted = mounter.is_mountpoint(&dirs.rootfs)?;
    let mut writeback = None;
    if mounted {
        if volatile && let Err(e) = mounter.sync_filesystem(&dirs.rootfs) {
            writeback = Some(e);
        }
        mounter
            .unmount(&dirs.rootfs)
            .map_err(|e| RootfsError::unmounting(id, e))?;
    }
    record.mounted = false;
    store.write_record(&record)?;
    if let Some(source) = writeback {
        return Err(RootfsError::VolatileWriteback {
            id: id.into(),
            source,
        });
    }
    let marker = volatile_marker(&dirs.work);
    if mounted && volatile && marker.exists() {
        // No error was reported while mounted: make the writes durable, then allow reuse.
        mounter.sync_filesystem(&dirs.upper)?;
        // The marker is a directory holding a `dirty` file.
        fs::remove_dir_all(&marker).map_err(StoreError::io("removing", &marker))?;
    }
    Ok(())
}

/// Mounts container `id`'s rootfs again as its record describes. Already mounted: no-op.
pub fn mount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    holding_id(store, id, || mount_held(store, mounter, id))
}

fn mount_held(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    let mut record = store.record(id)?;
    let dirs = dirs_of(store, &record);
    if mounter.is_mountpoint(&dirs.rootfs)? {
        return Ok(());
    }
    let s = strategies(&record);
    if let Some(upper) = &record.upper_fs {
        let plan = UpperPlan::from_record(upper).map_err(|why| {
            StoreError::io("reading the record of", &store.layout().container(id))(
                std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            )
        })?;
        isolated::remount(mounter, id, &dirs, &plan)?;
    }
    if s.volatile && volatile_marker(&dirs.work).exists() {
        return Err(RootfsError::VolatileUnclean { id: id.into() });
    }
    if s.shared_ro {
        // The shared mount may be gone (host restart): take a fresh lease, then drop the old.
        let acquired = shared::acquire(store, mounter, &record.layers)?;
        if let Err(e) = mounter.bind_read_only(&acquired.rootfs, &dirs.rootfs) {
            shared::release(store, mounter, &acquired.lease)?;
            return Err(e.into());
        }
        let old = record.lease.replace(acquired.lease.clone());
        record.bind_source = Some(acquired.rootfs.clone());
        finish(store, &mut record)?;
        if let Some(old) = old.filter(|o| *o != acquired.lease) {
            shared::release(store, mounter, &old)?;
        }
        return Ok(());
    }
    if let Some(source) = &record.bind_source {
        mounter.bind_read_only(source, &dirs.rootfs)?;
    } else {
        let mut spec = plan::read_write(store, &record.layers, &dirs, s.mount_flavor());
        // A read-only container comes back read-only, as create mounted it.
        spec.read_only = record.read_only;
        mounter.mount_overlay(&spec, &dirs.rootfs)?;
        record.mount_options = spec.option_strings();
    }
    finish(store, &mut record)
}

fn finish(store: &Store, record: &mut ContainerRecord) -> Result<(), RootfsError> {
    record.mounted = true;
    store.write_record(record)?;
    Ok(())
}

/// A container's directories in the shape its strategy gave them.
fn dirs_of(store: &Store, record: &ContainerRecord) -> ContainerDirs {
    let base = store.layout().container(&record.id);
    ContainerDirs::shaped(base, record.upper_fs.is_some())
}

fn strategies(record: &ContainerRecord) -> Strategies {
    Strategies::parse(&record.strategy).unwrap_or_default()
}
