//! Where a read-write overlay's upper lives: in the container's directory on the
//! store's filesystem, or on a filesystem of the container's own (`isolated`: a
//! loop-mounted disk image, a tmpfs, a btrfs subvolume with a quota). Every overlay
//! provider takes its upper from here; none decides it again.

pub mod isolated;

use std::fs;
use std::path::Path;

use lamina_store::StoreError;
use lamina_sys::Mounter;

use crate::RootfsError;

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
