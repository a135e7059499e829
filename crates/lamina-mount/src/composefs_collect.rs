//! composefs's part of layer collection (`clean`): metadata images whose image no
//! container, pool or snapshot names any more, then objects no remaining metadata image
//! references. Runs under the exclusive layers-in-use lock, like the layers' collection:
//! every create builds its image (and writes its objects) while holding that lock
//! shared, so no image is half-built and no object is about to be referenced.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use composefs::fsverity::{FsVerityHashValue, Sha256HashValue};
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;

/// What composefs collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CollectedObjects {
    pub images: usize,
    pub objects: usize,
    /// Bytes freed: an object still linked from a layer frees nothing.
    pub bytes: u64,
}

/// Removes images not in `in_use` (top chain ID hex of the images composefs containers
/// mount), then
/// the objects the remaining images do not reference. When a remaining image cannot be
/// read, what it references is unknown and every object stays.
pub(crate) fn collect(
    store: &Store,
    mounter: &dyn Mounter,
    in_use: &HashSet<String>,
) -> Result<CollectedObjects, RootfsError> {
    let mut collected = CollectedObjects::default();
    let images_dir = store.layout().composefs();
    let mut referenced = HashSet::new();
    let mut unknown = false;
    for entry in read_dir(&images_dir)? {
        let path = entry
            .map_err(StoreError::io("listing", &images_dir))?
            .path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if let Some(top) = name.strip_suffix(".mnt") {
            // A mount whose image goes (below) or is gone: unmounted and removed. No
            // overlay needs it mounted: each holds its own reference to the EROFS.
            if !in_use.contains(top) {
                crate::clean::remove_unmounted(mounter, &path)?;
            }
            continue;
        }
        let Some(top) = name.strip_suffix(".erofs") else {
            continue; // its digest: removed with the image
        };
        if !in_use.contains(top) {
            collected.bytes += size_freed(&path)?;
            fs::remove_file(&path).map_err(StoreError::io("removing", &path))?;
            let digest = crate::composefs::digest_path(&path);
            match fs::remove_file(&digest) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("removing", &digest)(e).into()),
            }
            collected.images += 1;
            continue;
        }
        match fs::read(&path)
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
    let objects_dir = store.layout().objects();
    for fan_out in read_dir(&objects_dir)? {
        let fan_out = fan_out
            .map_err(StoreError::io("listing", &objects_dir))?
            .path();
        let prefix = fan_out
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !fan_out.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            // Nothing but fan-out directories belongs here (an older build staged its
            // copies here): no image can reference it.
            collected.bytes += size_freed(&fan_out)?;
            fs::remove_file(&fan_out).map_err(StoreError::io("removing", &fan_out))?;
            collected.objects += 1;
            continue;
        }
        for object in read_dir(&fan_out)? {
            let object = object.map_err(StoreError::io("listing", &fan_out))?.path();
            let name = object.file_name().unwrap_or_default().to_string_lossy();
            if referenced.contains(&format!("{prefix}/{name}")) {
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

/// `dir`'s entries; none when it does not exist (a store from before composefs).
fn read_dir(dir: &Path) -> Result<Box<dyn Iterator<Item = io::Result<fs::DirEntry>>>, StoreError> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(Box::new(entries)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Box::new(std::iter::empty())),
        Err(e) => Err(StoreError::io("listing", dir)(e)),
    }
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
