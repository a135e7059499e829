//! Where a read-write overlay's upper lives: in the container's directory on the
//! store's filesystem, or on a filesystem of the container's own (`isolated`: a
//! loop-mounted disk image, a tmpfs, a btrfs subvolume with a quota). Every overlay
//! provider takes its upper from here; none decides it again.

pub mod isolated;

use std::fs;
use std::path::Path;

use lamina_image::Digest;
use lamina_store::Store;
use lamina_store::{ContainerDirs, StoreError};
use lamina_sys::{DiskFs, Mounter};

use crate::RootfsError;
use crate::model::record::Container;
use crate::model::strategy::UpperBackend;
use isolated::{DiskLimit, UpperPlan};

/// Unmounts everything beneath `dir` (deepest first), deletes a quota upper's subvolume
/// in it, then removes it.
pub(crate) fn remove_unmounted(mounter: &dyn Mounter, dir: &Path) -> Result<(), RootfsError> {
    for mount in mounter.mounts_under(dir)? {
        mounter.unmount(&mount)?;
    }
    // A file (a composefs image being written) has nothing mounted or made beneath it.
    if dir.symlink_metadata().is_ok_and(|m| !m.is_dir()) {
        return fs::remove_file(dir).map_err(|e| StoreError::io("removing", dir)(e).into());
    }
    isolated::delete_subvolume_in(mounter, dir)?;
    match lamina_store::remove_tree(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("removing", dir)(e).into()),
    }
}

/// Mounts `container`'s own upper filesystem again if it has one and it is not mounted
/// (after a host restart); a memory upper is gone, which is an error.
pub(crate) fn mount_again(
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

/// The upper filesystem of `backend` (a model's or a pool's: `None`, a directory on the
/// store's filesystem) for a container of `chain_ids`, sized by its disk limit.
pub(crate) fn plan(
    store: &Store,
    chain_ids: &[Digest],
    backend: Option<UpperBackend>,
    disk_limit: Option<DiskLimit>,
    disk_fs: DiskFs,
) -> Result<Option<UpperPlan>, RootfsError> {
    backend
        .map(|backend| isolated::plan_for(store, chain_ids, backend, disk_limit, disk_fs))
        .transpose()
}
