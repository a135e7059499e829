//! composefs's part of layer collection (`clean`): metadata images whose image no
//! container, pool or snapshot names any more, then objects neither a remaining metadata
//! image nor a remaining layer's manifest (`lamina_store::file_objects`) references. Runs under the exclusive layers-in-use lock, like the layers' collection:
//! every create builds its image (and writes its objects) while holding that lock
//! shared, so no image is half-built and no object is about to be referenced.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use composefs::fsverity::{FsVerityHashValue, Sha256HashValue};
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::fsutil::entries;
use crate::fsutil::file_name;

/// What composefs collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CollectedObjects {
    pub images: usize,
    pub objects: usize,
    /// Bytes freed: an object still linked from a layer frees nothing.
    pub bytes: u64,
}

/// Removes images not in `keep` (top chain ID hex of the images containers, pools and
/// committed snapshots are made of), then the objects the remaining images do not
/// reference, nor any remaining layer's files. When a remaining image cannot be read, or an image in `in_use` (mounted by
/// a composefs container or pool slot) is gone, what is referenced is unknown and every
/// object stays.
pub(crate) fn collect(
    store: &Store,
    mounter: &dyn Mounter,
    keep: &HashSet<String>,
    in_use: &HashSet<String>,
) -> Result<CollectedObjects, RootfsError> {
    let mut collected = CollectedObjects::default();
    crate::lowers::composefs::auto::forget_stale_refusals(store)?;
    let images_dir = store.layout().composefs();
    let in_images = entries(&images_dir)?;
    // First the mounts no composefs container or pool slot uses: unmounted and removed
    // (no overlay needs it mounted: each holds its own reference to the EROFS), even of
    // an image that stays; the next composefs create mounts it again. One a process
    // holds busy keeps its image, and so its objects, for a later clean, rather than
    // failing every clean.
    let mut kept = keep.clone();
    for path in &in_images {
        let name = file_name(path);
        let Some(top) = name.strip_suffix(".mnt") else {
            continue;
        };
        if !in_use.contains(top)
            && let Err(e) = crate::uppers::remove_unmounted(mounter, path)
        {
            tracing::warn!(mount = %path.display(), error = %e, "composefs image mount busy: kept for a later clean");
            kept.insert(top.to_string());
        }
    }
    // An image a container uses whose file is gone references objects nobody can list,
    // and running containers may read them: keep them all.
    let mut unknown = in_use
        .iter()
        .any(|top| !images_dir.join(format!("{top}.erofs")).is_file());
    let mut referenced = HashSet::new();
    for path in in_images {
        let name = file_name(&path);
        let Some(top) = name.strip_suffix(".erofs") else {
            continue; // a mount (above), a digest or verity mark (removed with its
            // image), or a refusal (forgotten above once stale)
        };
        if !kept.contains(top) {
            collected.bytes += size_freed(&path)?;
            crate::lowers::composefs::remove_image(&path)?;
            collected.images += 1;
            continue;
        }
        match lamina_store::read_regular_file(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                composefs::erofs::reader::collect_objects::<Sha256HashValue>(&bytes)
                    .map_err(|e| format!("{e:#}"))
            }) {
            Ok(objects) => referenced.extend(objects.iter().map(|o| o.to_object_pathname())),
            Err(why) => {
                tracing::warn!(image = %path.display(), why, "composefs image unreadable: keeping every object (`lamina check --verify` names it)");
                unknown = true;
            }
        }
    }
    if unknown {
        return Ok(collected);
    }
    // What the layers left hold: a later import links its files to these (issue 24's
    // one copy per content, for every strategy), so they stay while their layers do.
    // A layer that keeps its data in objects names them by their short names too, and
    // one whose manifest cannot be read keeps every object: its stubs need some.
    let object_layers = store.properties().layer_data_in_objects;
    for layer in entries(&store.layout().layers())? {
        match lamina_store::file_objects::read_manifest(&layer) {
            Some(digests) => {
                referenced.extend(digests.iter().map(|o| o.to_object_pathname()));
                if object_layers {
                    referenced.extend(digests.iter().map(lamina_store::object_layers::short_name));
                }
            }
            // A record that cannot be read may be a stub layer's.
            None if object_layers
                && lamina_store::LayerRecord::read(&layer).map_or(true, |r| r.objects) =>
            {
                tracing::warn!(layer = %layer.display(), "a layer keeping its data in objects has no readable manifest: keeping every object");
                return Ok(collected);
            }
            None => {}
        }
    }
    let objects_dir = store.layout().objects();
    for fan_out in entries(&objects_dir)? {
        let prefix = file_name(&fan_out);
        if !fan_out.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            // Nothing but fan-out directories belongs here (an older build staged its
            // copies here): no image can reference it.
            collected.bytes += size_freed(&fan_out)?;
            fs::remove_file(&fan_out).map_err(StoreError::io("removing", &fan_out))?;
            collected.objects += 1;
            continue;
        }
        for object in entries(&fan_out)? {
            if referenced.contains(&format!("{prefix}/{}", file_name(&object))) {
                continue;
            }
            collected.bytes += size_freed(&object)?;
            fs::remove_file(&object).map_err(StoreError::io("removing", &object))?;
            collected.objects += 1;
        }
        // Empty fan-out directories go too; a non-empty one stays (ENOTEMPTY).
        let _ = fs::remove_dir(&fan_out);
    }
    Ok(collected)
}

/// What removing `path` frees: its blocks when this is its last link.
fn size_freed(path: &Path) -> Result<u64, StoreError> {
    let meta = fs::symlink_metadata(path).map_err(StoreError::io("reading", path))?;
    Ok(if meta.nlink() <= 1 {
        meta.blocks() * 512
    } else {
        0
    })
}
