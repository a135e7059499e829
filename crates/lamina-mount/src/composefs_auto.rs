//! How `auto` comes to mount a deep image through composefs without any caller waiting
//! for the build: a create that would have used composefs, had the image's metadata image
//! been built, is served from the layers and asks its front-end to build the image in the
//! background ([`build_for`] its layers; the CLI starts `lamina build-metadata-image
//! CHAIN_ID...` detached, the snapshotter a thread). The layers are named, not the
//! container: a container may be gone (containerd's `ctr run --rm`) before the build
//! starts, and its image is still worth building.
//! Later creates find it built and mount it. A build that refuses the image (past a
//! bound, an xattr EROFS cannot hold, or a full disk) leaves `<top>.erofs.refused` with
//! the reason, and `auto` keeps to the layers for that image until `clean` forgets the
//! refusal.

use std::fs;
use std::path::PathBuf;

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::choose::MetadataImage;
use crate::composefs::image_path;

/// Where the metadata image of the image whose top layer is `top` stands.
pub fn state(store: &Store, chain_ids: &[Digest]) -> MetadataImage {
    let Some(top) = chain_ids.last() else {
        return MetadataImage::Absent;
    };
    let image = image_path(store, top);
    if image.is_file() {
        MetadataImage::Built
    } else if refused_path(&image).is_file() {
        MetadataImage::Refused
    } else {
        MetadataImage::Absent
    }
}

/// Where a build's refusal of metadata image `image` is recorded.
pub fn refused_path(image: &std::path::Path) -> PathBuf {
    let mut name = image.as_os_str().to_os_string();
    name.push(".refused");
    PathBuf::from(name)
}

/// What [`build_for`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Built {
    /// The image's metadata image is built (now, or by someone before).
    Built,
    /// A layer is no longer in the store (collected meanwhile): nothing to build.
    NothingToBuild,
    /// Another build of the same image is running.
    InProgress,
    /// The build refused the image; recorded, with this reason.
    Refused(String),
}

/// Builds the metadata image of the image made of `chain_ids` (bottom first), as `auto`
/// asks after serving a deep image from its layers. Holds the layers-in-use lock, so
/// `clean` neither takes the layers from under the build nor collects the image
/// half-written.
pub fn build_for(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<Built, RootfsError> {
    let _layers_in_use = store.use_layers()?;
    let Some(top) = chain_ids.last() else {
        return Ok(Built::NothingToBuild);
    };
    if chain_ids.iter().any(|c| !store.has_layer(c)) {
        return Ok(Built::NothingToBuild);
    }
    // Concurrent creates of a new deep image each ask for a build: one runs.
    let Some(_building) = store.try_lock(&format!("build-metadata-image-{}", top.hex()))? else {
        return Ok(Built::InProgress);
    };
    match crate::composefs::ensure(store, mounter, chain_ids) {
        Ok(_) => Ok(Built::Built),
        // Someone else (a named composefs create, `pool fill`) is building it: theirs
        // will do, and nothing is refused.
        Err(e @ StoreError::LockTimeout { .. }) => Err(e.into()),
        Err(e) => {
            let why = e.to_string();
            let mark = refused_path(&image_path(store, top));
            // Every failure is recorded, a full disk too: each retry would hash the whole
            // image again on every create. `clean` forgets them.
            store.write_durably(&mark, why.as_bytes())?;
            tracing::warn!(image = %top, why, "composefs refused the image: auto keeps to its layers");
            Ok(Built::Refused(why))
        }
    }
}

/// Removes every recorded refusal (`clean`): an image refused by an older release, or
/// whose layers were damaged then, gets one more background build.
pub(crate) fn forget_refusals(store: &Store) -> Result<usize, StoreError> {
    let mut forgotten = 0;
    for path in crate::composefs_collect::entries(&store.layout().composefs())? {
        if path.to_string_lossy().ends_with(".erofs.refused") {
            fs::remove_file(&path).map_err(StoreError::io("removing", &path))?;
            forgotten += 1;
        }
    }
    Ok(forgotten)
}
