//! Layer collection (GrootFS's `clean`): remove the layers and flattened trees no
//! container references. Runs under the exclusive layers-in-use lock, which every create
//! holds shared from before its import until its record names its layers, so a layer a
//! create in flight is about to mount is never taken. Doomed layers are renamed into
//! `tmp/gc-*` under the lock (one rename each) and removed after it is released, so
//! creates wait only for the renames; a crash mid-removal leaves `tmp/gc-*` for the next
//! clean.

use lamina_snapshot_index::StoreSnapshots;
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{Store, StoreError, list_dirs};
use lamina_sys::Mounter;

use crate::fsutil::file_name;
use crate::{RootfsError, gc::clean, providers::pooled::pool};

/// Name prefix of a collected layer or tree waiting in `tmp/` to be removed.
pub(crate) const DOOMED_PREFIX: &str = "gc-";

/// What collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// Why nothing was collected, when what containers use could not be known.
    pub kept_all: Option<String>,
    pub layers: usize,
    pub flattened: usize,
    /// composefs metadata images and objects nothing uses any more.
    pub composefs_images: usize,
    pub objects: usize,
    /// Dead creates found under the lock (after clean's own sweep).
    pub crashed_creates: usize,
    /// Bytes the removed trees held (du -x).
    pub bytes: u64,
}

/// Removes every layer no container record (in `images/` or still in `trash/`), no pool
/// target and no containerd snapshot names, and every flattened tree no container binds.
pub(crate) fn collect_unused(
    store: &Store,
    mounter: &dyn Mounter,
) -> Result<Collected, RootfsError> {
    let lock = store.collect_layers_lock()?;
    // With the lock held no create is in flight, so a container directory without a
    // record is a dead create's; it may still have an overlay of our layers mounted.
    let mut collected = Collected {
        crashed_creates: clean::sweep_crashed_creates(store, mounter)?,
        ..Collected::default()
    };
    let References {
        keep,
        bound,
        composefs,
        tops,
    } = match referenced(store)? {
        Ok(references) => references,
        Err(why) => {
            tracing::warn!(why, "layers left alone");
            collected.kept_all = Some(why);
            return Ok(collected);
        }
    };

    let mut doomed = Vec::new();
    for layer in list_dirs(&store.layout().layers())? {
        let name = file_name(&layer);
        if keep.contains(&name) {
            continue;
        }
        doomed.push(set_aside(store, &layer, "layer", &name)?);
        collected.layers += 1;
    }
    for tree in list_dirs(&store.layout().flat())? {
        if bound.iter().any(|source| source.starts_with(&tree)) {
            continue;
        }
        let name = file_name(&tree);
        doomed.push(set_aside(store, &tree, "flat", &name)?);
        collected.flattened += 1;
    }
    // Short links (`l/`) to the layers just set aside go with them.
    store.sweep_layer_links()?;
    let composefs = crate::gc::composefs_collect::collect(store, mounter, &tops, &composefs)?;
    collected.composefs_images = composefs.images;
    collected.objects = composefs.objects;
    collected.bytes += composefs.bytes;
    store.pause_point("collect-locked");
    drop(lock);

    for path in doomed {
        collected.bytes += lamina_store::disk_usage(&path)?;
        lamina_store::remove_tree(&path).map_err(StoreError::io("removing", &path))?;
    }
    tracing::info!(
        layers = collected.layers,
        flattened = collected.flattened,
        bytes = collected.bytes,
        "collected unused layers"
    );
    Ok(collected)
}

/// Layer names (chain ID hex) that records and pool targets name, and the trees
/// containers bind; `Err` with the reason if what some container uses is unknown: a live
/// process holds a container directory that has no record yet (it did not take the
/// layers lock), or a record is unreadable (it may name any layer).
fn referenced(store: &Store) -> Result<Result<References, String>, RootfsError> {
    let mut keep = HashSet::new();
    let mut bound = HashSet::new();
    let mut composefs = HashSet::new();
    let mut tops = HashSet::new();
    let mut unreadable = Vec::new();
    let mut name = |layers: &[Digest]| keep.extend(layers.iter().map(|l| l.hex().to_string()));
    for dir in store.all_container_dirs()? {
        match crate::model::record::read_in(store, &dir) {
            Ok(Some(container)) => {
                name(&container.record.layers);
                tops.extend(container.record.layers.last().map(|t| t.hex().to_string()));
                composefs.extend(crate::lowers::composefs::image_of(&container));
                bound.extend(container.rootfs.bind_source);
            }
            Ok(None) if store.try_lock_dir(&dir)?.is_none() => {
                return Ok(Err(format!(
                    "{} is being created and has no record yet",
                    dir.display()
                )));
            }
            Ok(None) => {}
            Err(StoreError::BadRecord { path, .. }) => unreadable.push(path.display().to_string()),
            Err(e) => return Err(e.into()),
        }
    }
    if !unreadable.is_empty() {
        return Ok(Err(format!(
            "container records are unreadable ({}), so what they use is unknown; `lamina check` reports them, `lamina delete` removes them",
            unreadable.join(", ")
        )));
    }
    for layers in pool::target_layers(store) {
        tops.extend(layers.last().map(|t| t.hex().to_string()));
        name(&layers);
    }
    composefs.extend(pool::composefs_target_images(store));
    // containerd's committed snapshots, and commits in flight: any of them may be the
    // top of an image containerd runs, so a chain's metadata image stays with its top.
    if let Some(snapshots) = store.snapshots_if_any()? {
        let layers: Vec<Digest> = snapshots.layers()?.into_iter().collect();
        tops.extend(layers.iter().map(|l| l.hex().to_string()));
        name(&layers);
    }
    tops.extend(composefs.iter().cloned());
    Ok(Ok(References {
        keep,
        bound,
        composefs,
        tops,
    }))
}

/// What is in use.
struct References {
    /// Layer names (chain ID hex) to keep.
    keep: HashSet<String>,
    /// The directories containers bind.
    bound: HashSet<PathBuf>,
    /// The images (top chain ID hex) whose composefs metadata image a container or pool
    /// slot mounts.
    composefs: HashSet<String>,
    /// The images whose metadata image stays (a superset of `composefs`): a container,
    /// pool or committed snapshot is made of each. `auto` builds one in the background
    /// for the creates after a layers-served one, so a clean keeps it before anything
    /// mounts it.
    tops: HashSet<String>,
}

/// Renames `path` to `tmp/gc-<kind>-<name>-<unique>`.
fn set_aside(store: &Store, path: &Path, kind: &str, name: &str) -> Result<PathBuf, StoreError> {
    let doomed = store.layout().tmp().join(format!(
        "{DOOMED_PREFIX}{kind}-{name}-{}",
        lamina_store::unique_suffix()
    ));
    fs::rename(path, &doomed).map_err(StoreError::io("collecting", path))?;
    tracing::debug!(path = %path.display(), "collecting");
    Ok(doomed)
}
