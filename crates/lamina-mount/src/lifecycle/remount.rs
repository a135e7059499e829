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

use lamina_store::{ContainerDirs, Store, StoreError};
use lamina_sys::Mounter;

use crate::lifecycle::one_step::holding_id;
use crate::model::Provider;
use crate::model::record::{self, Container, flavor_of};
use crate::{
    RootfsError, UpperPlan, fsutil::volatile_marker, lowers::plan, providers::shared_ro,
    uppers::isolated,
};

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
    let volatile = flavor_of(&container.rootfs).volatile;
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

/// Mounts `container`'s own upper filesystem again if it has one and it is not mounted
/// (after a host restart); a memory upper is gone, which is an error.
pub(crate) fn mount_upper_fs(
    mounter: &dyn Mounter,
    container: &Container,
    dirs: &ContainerDirs,
) -> Result<(), RootfsError> {
    let Some(upper) = &container.rootfs.upper_fs else {
        return Ok(());
    };
    let plan = UpperPlan::from_record(upper).map_err(|why| StoreError::BadRecord {
        id: container.id().into(),
        path: dirs.base.join("container.json"),
        why,
    })?;
    isolated::remount(mounter, container.id(), dirs, &plan)
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
    mount_upper_fs(mounter, &container, &dirs)?;
    match container.model().provider {
        Provider::SharedRo => {
            // The shared mount may be gone (host restart): take a fresh lease, then drop
            // the old one.
            let acquired = shared_ro::acquire(store, mounter, &container.record.layers)?;
            if let Err(e) = mounter.bind_read_only(&acquired.rootfs, &dirs.rootfs) {
                shared_ro::release(store, mounter, &acquired.lease)?;
                return Err(e.into());
            }
            let old = container.rootfs.lease.replace(acquired.lease.clone());
            container.rootfs.bind_source = Some(acquired.rootfs.clone());
            finish(store, &mut container)?;
            if let Some(old) = old.filter(|o| *o != acquired.lease) {
                shared_ro::release(store, mounter, &old)?;
            }
            return Ok(());
        }
        Provider::Direct => {
            let source = container.rootfs.bind_source.clone().unwrap_or_default();
            mounter.bind_read_only(&source, &dirs.rootfs)?;
        }
        Provider::Fresh { flavor, read_only } => {
            remount_overlay(store, mounter, &mut container, flavor, read_only)?;
        }
        Provider::Pooled { flavor } => {
            // A claimed pool slot is an ordinary read-write overlay once unmounted.
            remount_overlay(store, mounter, &mut container, flavor, false)?;
        }
    }
    finish(store, &mut container)
}

/// Mounts an overlay container's rootfs again: refused if a volatile upper was not
/// cleanly unmounted; read-only if create mounted it read-only.
fn remount_overlay(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
    flavor: crate::Flavor,
    read_only: bool,
) -> Result<(), RootfsError> {
    let dirs = container.dirs(store);
    if flavor.volatile && volatile_marker(&dirs.work).exists() {
        return Err(RootfsError::VolatileUnclean {
            id: container.id().into(),
        });
    }
    // The image's metadata image mounted again after a host restart, and built again
    // from the layers if it is gone (removed by hand, or by `check --verify --repair` as
    // damaged): under the layers lock, as a create builds it, so no clean takes its
    // objects before the image names them.
    let _layers_in_use = if flavor.composefs {
        let lock = store.use_layers()?;
        crate::lowers::composefs::mounted(store, mounter, &container.record.layers)?;
        Some(lock)
    } else {
        None
    };
    let mut spec = plan::read_write(store, &container.record.layers, &dirs, flavor);
    spec.read_only = read_only;
    plan::own_idmap(&mut spec, container.rootfs.idmap.as_ref());
    mounter.mount_overlay(&spec, &dirs.rootfs)?;
    container.rootfs.mount_options = spec.option_strings();
    Ok(())
}

fn finish(store: &Store, container: &mut Container) -> Result<(), RootfsError> {
    container.rootfs.mounted = true;
    record::write(store, container)?;
    Ok(())
}
