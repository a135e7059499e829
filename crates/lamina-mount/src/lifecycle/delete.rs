//! Deleting a container. Inline (classic): unmount, then remove, before returning.
//! Deferred (stall S1): one rename out of `images/` into `trash/` and return; the reaper
//! (`reap.rs`) finishes.

use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::lifecycle::one_step::holding_id;
use crate::model::Teardown;
use crate::model::record;
use crate::{RootfsError, uppers::isolated};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    NotFound,
    /// Gone from `images/`; the reaper unmounts and removes it.
    Deferred,
}

/// Deletes container `id`. A missing container is not an error: Garden calls delete on
/// every image plugin and each must succeed.
pub fn delete(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Deleted, RootfsError> {
    // A create of this ID still in flight (importing, mounting, writing its record)
    // finishes first; then this deletes what it made.
    holding_id(store, id, || delete_locked(store, mounter, id))
}

/// [`delete`] once no create or delete of `id` runs.
fn delete_locked(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Deleted, RootfsError> {
    // Anything else working on the directory (a `clean` removing a crashed create) is
    // waited for too; held until the container has left `images/`.
    let Some(_one_step_at_a_time) = store.wait_for_container(id)? else {
        return Ok(Deleted::NotFound);
    };
    let container = match record::read(store, id) {
        Ok(container) => Some(container),
        Err(StoreError::BadRecord { why, .. }) => {
            tracing::warn!(
                container = id,
                why,
                "deleting a container whose record is unreadable"
            );
            return delete_unrecorded(store, mounter, id);
        }
        Err(_) => None,
    };
    if container.as_ref().map(|c| c.model().teardown) == Some(Teardown::Deferred) {
        return Ok(match store.trash_container(id)? {
            Some(_) => {
                // Still holding the container: a reaper that looks now must come back.
                store.pause_point("delete-trashed");
                Deleted::Deferred
            }
            None => Deleted::NotFound,
        });
    }
    mounter
        .unmount(&store.rootfs_path(id))
        .map_err(|e| RootfsError::unmounting(id, e))?;
    // An inline `isolated-quota` container: its upper is a subvolume.
    isolated::delete_subvolume_in(mounter, &store.layout().container(id))?;
    // Racing deletes of one ID: the loser finds nothing left to remove.
    if !store.remove_container_dirs(id)? {
        return Ok(Deleted::NotFound);
    }
    crate::providers::release(store, mounter, container.as_ref())?;
    Ok(Deleted::Removed)
}

/// Deletes a container whose record cannot be read, so how its rootfs was provided is
/// unknown: everything mounted in its directory (rootfs, an isolated upper filesystem)
/// is unmounted, deepest first, then the directory goes. A shared-ro lease it may hold
/// is left to `clean`, which drops leases no record names.
fn delete_unrecorded(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<Deleted, RootfsError> {
    let dir = store.layout().container(id);
    for mount in mounter.mounts_under(&dir)? {
        mounter
            .unmount(&mount)
            .map_err(|e| RootfsError::unmounting(id, e))?;
    }
    isolated::delete_subvolume_in(mounter, &dir)?;
    Ok(if store.remove_container_dirs(id)? {
        Deleted::Removed
    } else {
        Deleted::NotFound
    })
}
