//! Deleting a container. Inline (classic): unmount, then remove, before returning.
//! Deferred (stall S1): one rename out of `images/` into `trash/` and return; the reaper
//! finishes — one teardown at a time per store, so parallel deletes never queue on the
//! same upper filesystem's sync, and after unlinking the container's written files
//! through the mount, so their dirty pages are dropped instead of written back.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::lifecycle::one_step::holding_id;
use crate::model::Teardown;
use crate::model::record::{self, Container};
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
            Some(_) => Deleted::Deferred,
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

/// What a reaper pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reaped {
    pub removed: usize,
    /// Left in `trash/` for the next pass (busy, or an error that was logged).
    pub failed: usize,
}

/// Tears down everything in `trash/`, one container at a time. Only one reaper runs per
/// store: a second waits, then finds what is left (usually nothing).
pub fn reap(store: &Store, mounter: &dyn Mounter) -> Result<Reaped, RootfsError> {
    reap_lingering(store, mounter, Duration::ZERO)
}

/// How often a lingering reaper looks for more trash.
const LINGER_POLL: Duration = Duration::from_millis(10);

/// [`reap`], then, still the store's reaper, looking for more trash for `linger` (every
/// 10 ms) before exiting: a delete in that time finds a reaper running and starts none
/// (see [`reaper_running`]), which saves a burst of deletes a process start each.
///
/// Invariant: a container renamed into `trash/` before a delete found the reaper lock
/// held is reaped by that holder, because the holder looks at `trash/` once more after
/// it lets go of the lock and takes the lock back for anything new.
pub fn reap_lingering(
    store: &Store,
    mounter: &dyn Mounter,
    linger: Duration,
) -> Result<Reaped, RootfsError> {
    let mut lock = Some(store.lock("reaper")?);
    let mut seen = HashSet::new();
    let mut reaped = Reaped::default();
    while lock.is_some() {
        drain(store, mounter, &mut seen, &mut reaped)?;
        let deadline = std::time::Instant::now() + linger;
        while !more_than(store, &seen)? && std::time::Instant::now() < deadline {
            std::thread::sleep(LINGER_POLL);
        }
        if more_than(store, &seen)? {
            continue;
        }
        store.pause_point("reaper-letting-go");
        lock = None;
        if more_than(store, &seen)? {
            // None: another reaper took the lock, and the container with it.
            lock = store.try_lock("reaper")?;
        }
    }
    Ok(reaped)
}

/// Whether a reaper holds the store's reaper lock: a deferred delete then leaves its
/// container to it (see [`reap_lingering`]'s invariant) instead of starting another.
/// An unanswerable lock says no, so a reaper is started.
pub fn reaper_running(store: &Store) -> bool {
    matches!(store.try_lock("reaper"), Ok(None))
}

/// Whether `trash/` holds a container not in `seen`.
fn more_than(store: &Store, seen: &HashSet<PathBuf>) -> Result<bool, RootfsError> {
    Ok(store.trash_entries()?.iter().any(|p| !seen.contains(p)))
}

/// Reaps until `trash/` holds nothing this reaper has not tried.
fn drain(
    store: &Store,
    mounter: &dyn Mounter,
    seen: &mut HashSet<PathBuf>,
    reaped: &mut Reaped,
) -> Result<(), RootfsError> {
    loop {
        let pending: Vec<_> = store
            .trash_entries()?
            .into_iter()
            .filter(|p| !seen.contains(p))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        // One read of the mount table per pass, not one per container: with a thousand
        // binds mounted, each read costs about a millisecond. Listed after `pending`, so
        // it includes every pending container's mounts (renames carry mounts along).
        let mounted = mounter.mounts_under(&store.layout().trash())?;
        let pending: Vec<_> = pending
            .into_iter()
            .map(|dir| {
                let record = record::read_in(store, &dir).unwrap_or(None);
                let mounts: Vec<PathBuf> = mounted
                    .iter()
                    .filter(|m| m.starts_with(&dir))
                    .cloned()
                    .collect();
                (dir, record, mounts)
            })
            .collect();
        // Discard every pending container's written data before the first unmount:
        // each unmount syncs the whole upper filesystem, so one container's unmount
        // would otherwise write back the data of every container still waiting here.
        for (dir, record, mounts) in &pending {
            discard(dir, record.as_ref(), mounts);
        }
        for (dir, record, mounts) in pending {
            seen.insert(dir.clone());
            // An inline delete renames its container here and removes it itself, holding
            // the directory's lock: not the reaper's to touch (both removing one tree
            // fails one of them with ENOENT).
            let _held = match store.try_lock_dir(&dir) {
                Ok(Some(held)) => held,
                Ok(None) => continue,
                Err(e) => {
                    // Left for the next reap, and said: skipped silently, it would
                    // stay in trash for ever.
                    tracing::warn!(dir = %dir.display(), error = %e, "reaper left a container in trash");
                    reaped.failed += 1;
                    continue;
                }
            };
            match teardown(store, mounter, &dir, record, mounts) {
                Ok(()) => reaped.removed += 1,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "reaper left a container in trash");
                    reaped.failed += 1;
                }
            }
        }
    }
}

/// Unlinks a trashed read-write overlay's written files through its mount, so its
/// unmount — and every other unmount on the same upper filesystem — has nothing of it
/// to write back. Anything else (read-only binds, unmounted dirs) is left alone.
fn discard(dir: &Path, container: Option<&Container>, mounts: &[PathBuf]) {
    let Some(container) = container.filter(|c| c.rootfs.mounted) else {
        return;
    };
    // Read-only, or a tmpfs upper that is never written back: nothing to save.
    if !container.model().writes_back() {
        return;
    }
    let dirs = container.dirs_in(dir.to_path_buf());
    if mounts.contains(&dirs.rootfs) {
        let discarded = lamina_sys::unlink_written(&dirs.upper, &dirs.rootfs);
        tracing::debug!(dir = %dir.display(), discarded, "unlinked written files before unmount");
    }
}

/// Unmounts `mounts` (what is mounted in container directory `dir`, deepest first),
/// removes the directory, and drops the shared-mount lease its `record` names.
fn teardown(
    store: &Store,
    mounter: &dyn Mounter,
    dir: &Path,
    container: Option<Container>,
    mounts: Vec<PathBuf>,
) -> Result<(), RootfsError> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    for mount in mounts {
        mounter
            .unmount(&mount)
            .map_err(|e| RootfsError::unmounting(&name, e))?;
    }
    isolated::delete_subvolume_in(mounter, dir)?;
    lamina_store::remove_tree(dir).map_err(StoreError::io("removing", dir))?;
    crate::providers::release(store, mounter, container.as_ref())?;
    Ok(())
}
