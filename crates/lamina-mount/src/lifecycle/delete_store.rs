//! `delete-store` (Garden's teardown of a whole store): unmount everything lamina mounted
//! beneath the store — containers, trash, pool slots, shared image mounts — then remove
//! the directory (deleting quota uppers' subvolumes first). No file is removed until every unmount has succeeded: a busy rootfs
//! fails the command with every directory and record still in place, and a retry once
//! the process is gone finishes the job.

use std::fs;

use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;

/// Unmounts everything under the store and removes it. Returns how many mounts went.
pub fn delete_store(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    let root = store.root();
    // A running reaper finishes its pass first, and no new one starts meanwhile; so do
    // creates and background builds of composefs images, which hold the layers shared:
    // a build that outlived the store would make its directories again.
    let _reaper = store.lock("reaper")?;
    let _no_create_or_build = store.collect_layers_lock()?;
    let mounts = mounter.mounts_under(root)?;
    for mount in &mounts {
        let name = mount
            .strip_prefix(root)
            .unwrap_or(mount)
            .display()
            .to_string();
        mounter
            .unmount(mount)
            .map_err(|e| RootfsError::unmounting(&name, e))?;
    }
    // Quota uppers are subvolumes: deleted as such, so their qgroups go with them.
    for parent in [
        store.layout().images(),
        store.layout().trash(),
        store.layout().tmp(),
    ] {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            crate::uppers::isolated::delete_subvolume_in(mounter, &entry.path())?;
        }
    }
    lamina_store::remove_tree(root).map_err(StoreError::io("removing", root))?;
    tracing::info!(store = %root.display(), unmounted = mounts.len(), "deleted store");
    Ok(mounts.len())
}
