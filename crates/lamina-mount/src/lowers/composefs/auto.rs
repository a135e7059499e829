//! How `auto` comes to mount a deep image through composefs without any caller waiting
//! for the build: a create that would have used composefs, had the image's metadata image
//! been built, is served from the layers and asks its front-end to build the image in the
//! background ([`build_for`] its layers; the CLI starts `lamina build-metadata-image
//! CHAIN_ID...` detached, the snapshotter a thread). The layers are named, not the
//! container: a container may be gone (containerd's `ctr run --rm`) before the build
//! starts, and its image is still worth building. `clean` keeps a metadata image while a
//! container, pool or committed snapshot is made of its image (`collect.rs`).
//!
//! Bounded: one build at a time per store (the others find it busy and leave their image
//! to a later create). What the image makes fail — a bound, an xattr EROFS cannot hold,
//! a path too long, the kernel refusing to mount it, builds that died twice in a row in
//! one boot (killed, out of memory: the `<top>.erofs.building` mark counts them) —
//! leaves `<top>.erofs.refused` with the reason, and `auto` keeps to the layers for that
//! image; a full disk, an I/O error or a lock held too long is not recorded. The
//! operator's composefs mounting the image removes a refusal; `clean` forgets one once
//! the image's top layer is gone or another lamina release or kernel wrote it.

use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::choose::{Choice, MetadataImage};
use crate::lowers::composefs::{beside, image_path};
use crate::model::Model;

/// Where the metadata image of the image whose top layer is `top` stands. A refusal
/// wins over a built image: an image that failed to mount is not tried again.
pub fn state(store: &Store, chain_ids: &[Digest]) -> MetadataImage {
    let Some(top) = chain_ids.last() else {
        return MetadataImage::Absent;
    };
    let image = image_path(store, top);
    if refused_path(&image).is_file() {
        MetadataImage::Refused
    } else if image.is_file() {
        MetadataImage::Built
    } else {
        MetadataImage::Absent
    }
}

/// Where a refusal of metadata image `image` is recorded.
pub fn refused_path(image: &Path) -> PathBuf {
    beside(image, ".refused")
}

/// Where a build of `image` in progress is marked; still there after it died.
pub(crate) fn building_path(image: &Path) -> PathBuf {
    beside(image, ".building")
}

/// The first line of a refusal: which lamina release wrote it, on which kernel. Either
/// changing makes `clean` forget it: another release may build what this one refused,
/// and another kernel may mount what this one would not.
fn release_line() -> String {
    format!(
        "lamina {} on Linux {}",
        env!("CARGO_PKG_VERSION"),
        crate::choose::probe::kernel_release()
    )
}

/// Records that `auto` must not mount image `top` through composefs, and why. Best
/// effort: a mark that cannot be written costs a later build, never a create.
pub(crate) fn refuse(store: &Store, top: &Digest, why: &str) {
    let mark = refused_path(&image_path(store, top));
    tracing::warn!(image = %top, why, "composefs refused the image: auto keeps to its layers");
    let text = format!("{}\n{why}\n", release_line());
    if let Err(e) = store.write_durably(&mark, text.as_bytes()) {
        tracing::warn!(mark = %mark.display(), error = %e, "could not record the refusal");
    }
}

/// Removes `auto`'s refusal of image `top`, if any: the operator's composefs built and
/// mounted it.
pub(crate) fn forget_refusal(store: &Store, top: &Digest) -> Result<(), StoreError> {
    crate::lowers::composefs::remove_if_present(&refused_path(&image_path(store, top)))
}

/// What [`build_for`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Built {
    /// The image's metadata image is built (now, or by someone before).
    Built,
    /// A layer is no longer in the store (collected meanwhile): nothing to build.
    NothingToBuild,
    /// Another build is running in this store: this image waits for a later create.
    Busy,
    /// The image cannot be built (or its builds keep dying); recorded, with this reason.
    Refused(String),
    /// Not built this time, for a reason that is not the image's (a full disk, a lock
    /// held too long); not recorded: a later create asks again.
    Failed(String),
}

/// Builds the metadata image of the image made of `chain_ids` (bottom first), as `auto`
/// asks after serving a deep image from its layers. Holds the layers-in-use lock, so
/// `clean` neither takes the layers from under the build nor collects the image
/// half-written, and `delete-store` waits for it.
pub fn build_for(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<Built, RootfsError> {
    // One build at a time per store: each holds a whole image's metadata in memory.
    let Some(_one_build) = store.try_lock("build-metadata-image")? else {
        return Ok(Built::Busy);
    };
    let _layers_in_use = store.use_layers()?;
    let Some(top) = chain_ids.last() else {
        return Ok(Built::NothingToBuild);
    };
    if chain_ids.iter().any(|c| !store.has_layer(c)) {
        return Ok(Built::NothingToBuild);
    }
    let image = image_path(store, top);
    match state(store, chain_ids) {
        MetadataImage::Built => return Ok(Built::Built),
        MetadataImage::Refused => return Ok(Built::Refused("refused before".into())),
        MetadataImage::Absent => {}
    }
    // A build that died (killed, out of memory) leaves its mark. One death in this boot
    // is retried — a daemon stopped by its service manager kills its build too — but
    // not a second: an image that kills its build must not do so on every create. A
    // host restart starts the count again.
    let building = building_path(&image);
    let this_boot = crate::choose::probe::boot_id();
    let deaths = lamina_store::read_regular_to_string(&building)
        .ok()
        .and_then(|mark| {
            let (boot, deaths) = mark.trim().split_once(' ')?;
            (boot == this_boot).then(|| deaths.parse::<u32>().ok())?
        })
        .unwrap_or(0);
    if deaths >= MOST_DEATHS {
        let why =
            format!("{deaths} builds of this image died in this boot (killed, or out of memory)");
        refuse(store, top, &why);
        fs::remove_file(&building).map_err(StoreError::io("removing", &building))?;
        return Ok(Built::Refused(why));
    }
    store.write_durably(&building, format!("{this_boot} {}", deaths + 1).as_bytes())?;
    let limits = crate::lowers::composefs::Limits::AUTO;
    let outcome = match crate::lowers::composefs::ensure_within(store, mounter, chain_ids, limits) {
        Ok(_) => Built::Built,
        // Only what the image itself makes fail is recorded (a bound, an xattr EROFS
        // cannot hold, a path too long): building again would fail again. A full disk,
        // an I/O error or a lock held by another builder is not the image's doing and
        // must not turn composefs off for good: a later create asks again.
        Err(StoreError::Io { source, .. })
            if crate::lowers::composefs::merge::is_refusal(&source) =>
        {
            let why = source.to_string();
            refuse(store, top, &why);
            Built::Refused(why)
        }
        Err(e) => {
            tracing::warn!(image = %top, error = %e, "composefs metadata image not built this time");
            Built::Failed(e.to_string())
        }
    };
    fs::remove_file(&building).map_err(StoreError::io("removing", &building))?;
    Ok(outcome)
}

/// Builds of one image that may die in one boot before it is refused.
const MOST_DEATHS: u32 = 2;

/// Whether `chain_ids` is a chain of this store's imported layers, each the chain ID of
/// its diff ID on the one before (what `lamina build-metadata-image` is handed: it
/// builds nothing else, so no list can make an image of some layers show as another's).
pub fn is_imported_chain(store: &Store, chain_ids: &[Digest]) -> Result<bool, StoreError> {
    let mut parent: Option<&Digest> = None;
    for chain_id in chain_ids {
        if !store.has_layer(chain_id) {
            return Ok(false);
        }
        let Some(diff_id) = store.layer_record(chain_id)?.diff_id else {
            return Ok(false);
        };
        if lamina_image::next_chain_id(parent, &diff_id) != *chain_id {
            return Ok(false);
        }
        parent = Some(chain_id);
    }
    Ok(!chain_ids.is_empty())
}

/// `choice` (auto's composefs) over the image's layers instead, because its metadata
/// image could not serve this create: `why` is logged, and recorded as a refusal when
/// the kernel refused to mount the image (damaged, or a format it does not take) —
/// not for a lock held too long or a lack of memory, which pass.
pub(crate) fn over_the_layers(
    store: &Store,
    chain_ids: &[Digest],
    choice: Choice,
    why: &RootfsError,
) -> Result<Choice, RootfsError> {
    let built = state(store, chain_ids) == MetadataImage::Built;
    // The step that reads the image, not the attach (whose EINVAL can be the mount
    // point's): what the kernel says of the image itself.
    let kernel_refused = matches!(
        why,
        RootfsError::Mount(e) if e.op == lamina_sys::MOUNT_EROFS_OP
            && matches!(e.errno, lamina_sys::Errno::INVAL | lamina_sys::Errno::UCLEAN)
    );
    if built
        && kernel_refused
        && let Some(top) = chain_ids.last()
    {
        refuse(store, top, &why.to_string());
    }
    let mut strategies = choice.model.strategies();
    strategies.composefs = false;
    strategies.metacopy = true;
    let model = Model::named(strategies, choice.model.read_only()).map_err(RootfsError::Refused)?;
    Ok(Choice {
        model,
        reason: format!(
            "{}; its composefs metadata image could not serve ({why}): the layers",
            choice.reason
        ),
        named: false,
        build_metadata_image: !built,
    })
}

/// Removes the refusals (and dead builds' marks) `clean` should forget: those whose
/// image's top layer is gone, or that another lamina release or kernel wrote. Returns
/// how many went.
pub(crate) fn forget_stale_refusals(store: &Store) -> Result<usize, StoreError> {
    let mut forgotten = 0;
    for path in crate::fsutil::entries(&store.layout().composefs())? {
        let name = crate::fsutil::file_name(&path);
        let (top, is_refusal) = match (
            name.strip_suffix(".erofs.refused"),
            name.strip_suffix(".erofs.building"),
        ) {
            (Some(top), _) => (top.to_string(), true),
            (_, Some(top)) => (top.to_string(), false),
            _ => continue,
        };
        let layer_gone = !store.layout().layers().join(&top).is_dir();
        let other_release = is_refusal
            && lamina_store::read_regular_to_string(&path)
                .map(|text| text.lines().next() != Some(release_line().as_str()))
                .unwrap_or(true);
        if layer_gone || other_release {
            fs::remove_file(&path).map_err(StoreError::io("removing", &path))?;
            forgotten += 1;
        }
    }
    Ok(forgotten)
}
