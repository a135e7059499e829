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

use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::fsutil::volatile_marker;
use crate::lifecycle::one_step::holding_id;
use crate::model::record;

/// Unmounts container `id`'s rootfs and keeps everything else.
pub fn unmount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    holding_id(store, id, || unmount_held(store, mounter, id))
}

pub(crate) fn unmount_held(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<(), RootfsError> {
    let mut container = record::read(store, id)?;
    let dirs = container.dirs(store);
    let volatile = container.model().volatile();
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
    // Rewritten (two flushes) only if it said mounted: a containerd snapshot's record
    // never does, as containerd mounts it, and each of its commits comes through here.
    if container.rootfs.mounted {
        container.rootfs.mounted = false;
        record::write(store, &container)?;
    }
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

/// Mounts container `id`'s rootfs again as its record describes — the same provider,
/// flavour and read-only-ness as create gave it. Already mounted: no-op.
pub fn mount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), RootfsError> {
    holding_id(store, id, || mount_held(store, mounter, id))
}

pub(crate) fn mount_held(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<(), RootfsError> {
    let mut container = record::read(store, id)?;
    let dirs = container.dirs(store);
    if mounter.is_mountpoint(&dirs.rootfs)? {
        return Ok(());
    }
    crate::providers::mount_again(store, mounter, &mut container)
}
