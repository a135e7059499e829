//! Crash recovery and `lamina clean`: finish what dead processes left. Everything here is
//! recomputed from the store and the mount table, never from memory: unfinished work is
//! found by its place (`tmp/`, `trash/`) and by locks nobody holds any more.

use std::fs;
use std::path::Path;

use lamina_snapshot_index::StoreSnapshots;
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;
use serde::Serialize;

use crate::uppers::remove_unmounted;
use crate::{RootfsError, gc::collect, providers::pooled::pool, providers::shared_ro};

/// What `clean` found, finished and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CleanReport {
    /// Deleted containers torn down from `trash/`.
    pub reaped: usize,
    /// Left in `trash/` (busy or failing; logged).
    pub reap_failed: usize,
    /// Containers whose create died before writing their record.
    pub crashed_creates: usize,
    /// Unfinished work removed from `tmp/` (imports, flattenings, pool slots, probes).
    pub tmp_removed: usize,
    /// Per-ID lock files of containers that never came to be (their create was killed).
    pub id_locks_removed: usize,
    /// Shared read-only image mounts nobody uses any more.
    pub shared_released: usize,
    /// Pool slots with nothing mounted any more (a host restart), removed. Ready slots
    /// stay: `pool drain` releases those.
    pub pool_released: usize,
    /// Layers no container (and no pool target) references, removed.
    pub layers_removed: usize,
    /// Flattened trees no container binds, removed.
    pub flattened_removed: usize,
    /// composefs metadata images of images nothing uses, and objects no remaining
    /// metadata image references, removed.
    pub composefs_images_removed: usize,
    pub objects_removed: usize,
    /// Containers whose record is unreadable (empty, truncated, garbage). While there are
    /// any, no layer, flattened tree or shared mount lease is collected: what they use is
    /// unknown. `lamina check` reports them; `lamina delete` removes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_records: Vec<String>,
    /// What the removed layers and trees held on disk.
    pub bytes_freed: u64,
    /// With a threshold: the store's usage before cleaning, and the threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_bytes: Option<u64>,
    /// The store used no more than the threshold, so nothing but crashed work was touched
    /// (crashed work was still finished).
    pub skipped: bool,
    /// One line for an operator: what happened.
    pub message: String,
}

/// Finishes crashed work (trash, crashed creates, `tmp/` leftovers), then — unless the
/// store uses no more than `threshold_bytes` — releases what nothing uses: shared mounts,
/// stale pool slots, flattened trees and layers. A pool's ready slots, and its layers,
/// stay: a pool is an operator's standing order. Cleans run one at a time; creates run
/// alongside and keep their layers.
pub fn clean(
    store: &Store,
    mounter: &dyn Mounter,
    threshold_bytes: Option<u64>,
) -> Result<CleanReport, RootfsError> {
    let _one_clean = store.lock("clean")?;
    let mut report = CleanReport {
        tmp_removed: sweep_tmp(store, mounter)?,
        crashed_creates: sweep_crashed_creates(store, mounter)?,
        id_locks_removed: store.sweep_id_locks()?,
        threshold_bytes,
        ..CleanReport::default()
    };
    let reaped = crate::lifecycle::reap::reap(store, mounter)?;
    report.reaped = reaped.removed;
    report.reap_failed = reaped.failed;
    report.bad_records = unreadable_records(store)?;
    if let Some(threshold) = threshold_bytes.filter(|t| *t > 0) {
        let used = store.usage()?;
        report.store_bytes = Some(used);
        if used <= threshold {
            report.skipped = true;
            report.message = format!(
                "threshold not reached: skipping clean (the store uses {used} bytes, threshold is {threshold}: no layers removed)"
            );
            tracing::info!(?report, "cleaned store");
            return Ok(report);
        }
    }
    report.shared_released = shared_ro::recount(store, mounter)?;
    report.pool_released = pool::release_stale(store, mounter)?;
    let collected = collect::collect_unused(store, mounter)?;
    report.layers_removed = collected.layers;
    report.flattened_removed = collected.flattened;
    report.composefs_images_removed = collected.composefs_images;
    report.objects_removed = collected.objects;
    report.bytes_freed = collected.bytes;
    report.crashed_creates += collected.crashed_creates;
    report.message = match &collected.kept_all {
        Some(why) => format!("kept every layer and flattened tree: {why}"),
        None if collected.composefs_images + collected.objects > 0 => format!(
            "removed {} unused layers, {} flattened trees, {} composefs images and {} objects ({} bytes)",
            collected.layers,
            collected.flattened,
            collected.composefs_images,
            collected.objects,
            collected.bytes
        ),
        None => format!(
            "removed {} unused layers and {} flattened trees ({} bytes)",
            collected.layers, collected.flattened, collected.bytes
        ),
    };
    tracing::info!(?report, "cleaned store");
    Ok(report)
}

/// Containers in `images/` without a record whose creator is gone.
pub(crate) fn sweep_crashed_creates(
    store: &Store,
    mounter: &dyn Mounter,
) -> Result<usize, RootfsError> {
    let mut removed = 0;
    for (dir, _lock) in crashed_creates(store)? {
        tracing::info!(dir = %dir.display(), "removing a container whose create crashed");
        remove_unmounted(mounter, &dir)?;
        removed += 1;
    }
    Ok(removed)
}

/// Removes container `id`'s directory if it is a crashed create: no record, and its
/// creator's lock free (what `clean` removes). True if it was one.
pub fn remove_crashed_create(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<bool, RootfsError> {
    let dir = store.layout().container(id);
    if !dir.exists() {
        return Ok(false);
    }
    let Some(_lock) = crashed_create_lock(store, &dir)? else {
        return Ok(false);
    };
    remove_unmounted(mounter, &dir)?;
    Ok(true)
}

/// The lock of container directory `dir`, taken, if it is a crashed create: no record,
/// and its creator's lock free. `None` for a container, or a create in progress.
fn crashed_create_lock(
    store: &Store,
    dir: &Path,
) -> Result<Option<lamina_store::DirLock>, RootfsError> {
    if has_record(store, dir)? {
        return Ok(None);
    }
    let Some(lock) = store.try_lock_dir(dir)? else {
        return Ok(None); // a create in progress
    };
    if has_record(store, dir)? {
        return Ok(None); // it finished between our two looks
    }
    Ok(Some(lock))
}

/// Container directories in `images/` with no record whose creator's lock is free, each
/// with that lock, taken: nobody else can start on them while it is held.
pub(crate) fn crashed_creates(
    store: &Store,
) -> Result<Vec<(std::path::PathBuf, lamina_store::DirLock)>, RootfsError> {
    let images = store.layout().images();
    let mut found = Vec::new();
    for entry in fs::read_dir(&images).map_err(StoreError::io("listing", &images))? {
        let dir = entry.map_err(StoreError::io("listing", &images))?.path();
        if let Some(lock) = crashed_create_lock(store, &dir)? {
            found.push((dir, lock));
        }
    }
    Ok(found)
}

/// Whether `dir` holds a record, readable or not. A container whose record is torn was
/// created (its record is written last), so it is never taken for a crashed create.
fn has_record(store: &Store, dir: &Path) -> Result<bool, StoreError> {
    match crate::model::record::read_in(store, dir) {
        Ok(record) => Ok(record.is_some()),
        Err(StoreError::BadRecord { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Containers in `images/` whose record cannot be read: each is reported, and while any
/// is there no layer is collected (what it uses is unknown).
fn unreadable_records(store: &Store) -> Result<Vec<String>, StoreError> {
    let scan = crate::model::record::scan(store)?;
    for bad in &scan.bad {
        tracing::warn!(container = %bad.id, record = %bad.path.display(), why = %bad.why, "container record is unreadable: run `lamina check`");
    }
    Ok(scan.bad.into_iter().map(|b| b.id).collect())
}

/// `tmp/` entries whose owner is gone, judged by the lock each kind of work holds.
fn sweep_tmp(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    let mut removed = 0;
    for path in abandoned_tmp(store)? {
        tracing::info!(path = %path.display(), "removing abandoned work");
        remove_unmounted(mounter, &path)?;
        removed += 1;
    }
    Ok(removed)
}

/// The `tmp/` entries nobody is working on any more. Only trustworthy to act on under
/// the clean lock (a `gc-*` entry is a running clean's until then).
pub(crate) fn abandoned_tmp(store: &Store) -> Result<Vec<std::path::PathBuf>, RootfsError> {
    let tmp = store.layout().tmp();
    let mut found = Vec::new();
    for entry in fs::read_dir(&tmp).map_err(StoreError::io("listing", &tmp))? {
        let path = entry.map_err(StoreError::io("listing", &tmp))?.path();
        if is_abandoned(store, &path)? {
            found.push(path);
        }
    }
    Ok(found)
}

/// Whether the `tmp/` entry at `path` is nobody's any more, judged by the lock its kind of
/// work holds. An entry that is gone by the time its lock is free was finished, not
/// abandoned: its owner published it (a pool slot, a container, a layer) between our
/// listing and our look at the lock, and a lock file that is missing reads as free.
fn is_abandoned(store: &Store, path: &Path) -> Result<bool, RootfsError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let free = if name.starts_with("new-") || name.starts_with("pool-") {
        store.try_lock_dir(path)?.is_some()
    } else if let Some(rest) = name.strip_prefix("flat-") {
        let hex = rest.split('-').next().unwrap_or_default();
        store.try_lock(&format!("flat-{hex}"))?.is_some()
    } else if let Some(rest) = name.strip_prefix("composefs-") {
        let hex = rest.split('-').next().unwrap_or_default();
        store.try_lock(&format!("composefs-{hex}"))?.is_some()
    } else if let Some(hex) = name.strip_prefix("layer-") {
        // An interrupted commit's upper waits here for the daemon's next start to put it
        // back or publish it: the snapshot's files, however free the lock.
        store.try_lock(&format!("layer-{hex}"))?.is_some() && !committing_to(store, hex)?
    } else if name.starts_with(collect::DOOMED_PREFIX) {
        true // collected; we hold the clean lock, so no other clean is removing it
    } else if let Some(pid) = name.strip_prefix("probe-") {
        !Path::new("/proc").join(pid).exists()
    } else if let Some(staged) = name.strip_prefix(lamina_store::STAGING_PREFIX) {
        // A directory being staged: its creator's while its lock is held (a create
        // stages its container here until it publishes it), and before the lock, while
        // the creator lives (a pid another pid namespace cannot see is only the fallback).
        let pid = staged.split('-').nth(1).unwrap_or_default();
        store.try_lock_dir(path)?.is_some()
            && (pid.is_empty() || !Path::new("/proc").join(pid).exists())
    } else {
        name.starts_with("delete-") // an older lamina's removals
    };
    Ok(free && path.symlink_metadata().is_ok())
}

/// Whether a containerd snapshot's recorded commit intent names layer `hex`.
fn committing_to(store: &Store, hex: &str) -> Result<bool, RootfsError> {
    let Some(snapshots) = store.snapshots_if_any()? else {
        return Ok(false);
    };
    Ok(snapshots
        .commit_intents()?
        .iter()
        .any(|(_, committing)| committing.layer.hex() == hex))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool slot or container published between `clean`'s listing of `tmp/` and its look
    /// at the entry's lock is finished work; reporting it made `check` fail beside a
    /// background pool refill (seen once in the SIGKILL crash test).
    #[test]
    fn an_entry_published_after_the_listing_is_not_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path()).unwrap();
        let tmp = store.layout().tmp();
        for name in [
            "pool-1-2-3",
            "new-1-2-3",
            "layer-abc",
            "flat-abc-1",
            "delete-x",
        ] {
            assert!(!is_abandoned(&store, &tmp.join(name)).unwrap(), "{name}");
        }
        let left = tmp.join("pool-4-5-6");
        fs::create_dir(&left).unwrap();
        assert!(
            is_abandoned(&store, &left).unwrap(),
            "a lockless slot left behind"
        );
    }
}
