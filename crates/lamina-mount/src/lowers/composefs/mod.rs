//! composefs (issue 24): an image as one lower, whatever its layer count. Built once per
//! image (its top chain ID) from the store's layers:
//!
//! - the layers are merged in memory as overlay would show them (whiteouts remove,
//!   opaque directories hide what is below, a directory's metadata is its top-most
//!   layer's), hardlinks kept as one inode;
//! - every regular file of the merged tree larger than composefs's inline limit is stored
//!   once in `objects/<ab>/<rest>`, named by its fs-verity digest (SHA-256, computed in
//!   userspace: this kernel has no fs-verity). Imports make most objects, and link later
//!   files of the same content and metadata to them (`lamina_store::file_objects`); the
//!   build makes the rest: an object is a hardlink to the layer's inode, so building
//!   costs no data copy, and a layer file whose content is already an object but whose
//!   inode is another is made to share that object's extents where the filesystem can
//!   (xfs, btrfs: `FIDEDUPERANGE`);
//! - the merged tree becomes `composefs/<top>.erofs`, an EROFS image written by the
//!   `composefs` crate whose regular files are overlay metacopy inodes redirecting into
//!   `objects/`.
//!
//! The image is mounted once (file-backed EROFS, no loop device) on `composefs/<top>.mnt`
//! ([`mounted`]), and every container's overlay has its `rootfs/` as the only lower and
//! `objects/` as a data-only lower (`plan::read_write`). The objects' own owners and modes
//! are never seen: overlay takes a file's metadata from the image and only its data from
//! the object.
//!
//! Where the rest lives: the merge in `composefs_merge.rs`, the objects in
//! `composefs_objects.rs`, how `auto` gets an image built off the caller's path in
//! `composefs_auto.rs`. `clean` removes images (and their mounts) no container, pool or
//! committed snapshot is made of, then objects no remaining image references
//! (`composefs_collect.rs`); `check --verify` re-hashes both (`composefs_verify.rs`).

pub mod auto;
pub(crate) mod merge;
pub(crate) mod objects;
pub(crate) mod snapshot_copies;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use composefs::erofs::writer::{ValidatedFileSystem, mkfs_erofs};
use composefs::fsverity::{FsVerityHashValue, Sha256HashValue, compute_verity};
use composefs::generic_tree::{self, Inode, Stat};

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::{HostFs, Mounter};

use crate::RootfsError;
use crate::lowers::composefs::objects::Objects;
use crate::model::record::Container;

pub use crate::lowers::composefs::merge::{
    Limits, MAX_ENTRIES, MAX_METADATA_BYTES, MAX_XATTR_BYTES_PER_INODE, MAX_XATTRS_PER_INODE,
};

/// An object's name: its fs-verity digest.
pub(crate) type ObjectId = Sha256HashValue;

/// The image's metadata image, built if it does not exist yet (under a per-image lock,
/// written in `tmp/` and renamed into place when whole, its objects synced first).
pub fn ensure(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<PathBuf, StoreError> {
    ensure_within(store, mounter, chain_ids, Limits::NAMED)
}

/// [`ensure`], reading no more of the image than `limits`.
pub fn ensure_within(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
    limits: Limits,
) -> Result<PathBuf, StoreError> {
    let Some(top) = chain_ids.last() else {
        return Err(
            StoreError::io("building composefs image for", store.root())(io::Error::other(
                "the image has no layers",
            )),
        );
    };
    let image = image_path(store, top);
    if image.is_file() {
        return Ok(image);
    }
    let _lock = store.lock(&format!("composefs-{}", top.hex()))?;
    if image.is_file() {
        return Ok(image);
    }
    // Sealed or not is decided once per image, when it is built: an image built before
    // the store could seal stays unsealed, as sealing it in place would make
    // `verity=require` refuse its containers' earlier metacopy copy-ups, which carry no
    // digest, on their next mount. A mark left by a crash between removing an image and
    // its companions goes first.
    let verity = verity_here(store, mounter);
    remove_if_present(&verity_path(&image))?;
    // A mount left from an image that is gone (removed by hand, or as damaged by `check
    // --verify --repair`) shows that image, not the one built now: it goes first, so a
    // repaired image is not served from its old mount.
    let target = mount_path(store, top);
    if target.is_dir() {
        crate::uppers::remove_unmounted(mounter, &target).map_err(|e| {
            StoreError::io("unmounting the old mount", &target)(io::Error::other(e.to_string()))
        })?;
    }
    let started = std::time::Instant::now();
    let staging = store.layout().tmp().join(format!(
        "composefs-{}-{}",
        top.hex(),
        lamina_store::unique_suffix()
    ));
    let built = build(store, chain_ids, verity, limits).and_then(|bytes| {
        let mut file = File::create(&staging)?;
        file.write_all(&bytes)?;
        store
            .host()
            .fsync(&file, &staging)
            .map_err(io::Error::from)?;
        drop(file);
        if verity {
            seal(&**store.host(), &staging)?;
        }
        // What `check --verify` holds the image to, recorded before the image appears.
        let digest = compute_verity::<ObjectId>(&bytes).to_hex();
        lamina_store::write_durably(&digest_path(&image), digest.as_bytes())
            .map_err(io::Error::other)?;
        fs::rename(&staging, &image)?;
        if verity {
            lamina_store::write_durably(&verity_path(&image), VERITY_MARK)
                .map_err(io::Error::other)?;
        }
        lamina_store::sync_dir(&store.layout().composefs()).map_err(io::Error::other)
    });
    if let Err(e) = built {
        let _ = fs::remove_file(&staging);
        return Err(StoreError::io("building composefs image", &image)(e));
    }
    tracing::info!(image = %top, layers = chain_ids.len(), ms = started.elapsed().as_millis() as u64, "built composefs image");
    Ok(image)
}

/// composefs's metadata image is one EROFS mount per image, shared by every container
/// of it: it is not idmapped, so a store that idmaps its layers, or a container with an
/// idmap of its own, is refused.
pub(crate) fn admit(idmapped: bool) -> Result<(), RootfsError> {
    if idmapped {
        return Err(RootfsError::Refused(
            "strategy `composefs` does not idmap its metadata image: use it in a store that does not idmap layers, without an idmap of the container's own".into(),
        ));
    }
    Ok(())
}

/// The image's metadata image, built if need be, mounted (read-only, file-backed EROFS)
/// on `composefs/<top>.mnt` if it is not: the one lower every composefs overlay of the
/// image names, so a thousand containers share one EROFS superblock and its inode
/// cache, and mount options can name it (`--without-mount`). It stays mounted until
/// `clean` removes the image; a host restart unmounts it, and the next create, `mount`
/// or pool refill mounts it again. The caller holds the layers-in-use lock.
pub fn mounted(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<PathBuf, RootfsError> {
    let image = ensure(store, mounter, chain_ids)?;
    let top = chain_ids
        .last()
        .expect("ensure refuses an image without layers");
    let target = mount_image(store, mounter, top, &image)?;
    // An operator's composefs (a named create, `pool fill`, a remount) built and
    // mounted it: whatever `auto` recorded against it no longer holds, and a refusal
    // left in place would hide the operator's composefs pool from `auto`.
    if let Err(e) = crate::lowers::composefs::auto::forget_refusal(store, top) {
        tracing::warn!(image = %top, error = %e, "could not forget auto's refusal");
    }
    Ok(target)
}

/// The metadata image of the image whose top layer is `top`, mounted as [`mounted`]
/// does, if it is built; `None` if it is not (`auto` never builds on a caller's path).
pub fn mounted_if_built(
    store: &Store,
    mounter: &dyn Mounter,
    top: &Digest,
) -> Result<Option<PathBuf>, RootfsError> {
    let image = image_path(store, top);
    if !image.is_file() {
        return Ok(None);
    }
    mount_image(store, mounter, top, &image).map(Some)
}

/// Mounts metadata image `image` (of top layer `top`) on its mount point, unless it is.
fn mount_image(
    store: &Store,
    mounter: &dyn Mounter,
    top: &Digest,
    image: &Path,
) -> Result<PathBuf, RootfsError> {
    let target = mount_path(store, top);
    // Mounted already (every create but an image's first since boot): no lock needed,
    // since only `clean` unmounts it, under the layers lock the caller holds shared.
    let mounted = |target: &Path| -> Result<bool, RootfsError> {
        Ok(target.is_dir() && mounter.is_mountpoint(target)?)
    };
    if mounted(&target)? {
        return Ok(target);
    }
    let _lock = store.lock(&format!("composefs-{}", top.hex()))?;
    if mounted(&target)? {
        return Ok(target);
    }
    fs::create_dir_all(&target).map_err(StoreError::io("creating", &target))?;
    mounter.mount_erofs(image, &target)?;
    tracing::info!(image = %top, "mounted composefs metadata image");
    Ok(target)
}

/// Whether this store's kernel and filesystem seal files with fs-verity (the cached
/// probe; a probe that cannot run says no).
fn verity_here(store: &Store, mounter: &dyn Mounter) -> bool {
    crate::choose::probe::probe(store, mounter, false).is_ok_and(|p| p.fs_verity == Some(true))
}

/// Seals `path` with fs-verity: opened read-only, as the kernel requires.
pub(crate) fn seal(host: &dyn HostFs, path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    host.enable_verity(&file, path).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("sealing {} with fs-verity: {e}", path.display()),
        )
    })
}

/// What the verity mark holds: the algorithm objects are sealed with.
const VERITY_MARK: &[u8] = b"sha256\n";

/// Where the mark lives that says metadata image `image` and every object it references
/// are sealed with fs-verity: its containers mount with `verity=require`, so the kernel
/// refuses a file whose object's content is not the one the image names.
pub fn verity_path(image: &Path) -> PathBuf {
    beside(image, ".verity")
}

/// `image`'s path with `suffix` appended: where each file that goes with a metadata
/// image lives.
pub(crate) fn beside(image: &Path, suffix: &str) -> PathBuf {
    let mut name = image.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Removes metadata image `image` and everything beside it ([`companions`]).
pub(crate) fn remove_image(image: &Path) -> Result<(), StoreError> {
    fs::remove_file(image).map_err(StoreError::io("removing", image))?;
    for companion in companions(image) {
        remove_if_present(&companion)?;
    }
    Ok(())
}

/// Removes `path`; one already gone is no error.
pub(crate) fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(StoreError::io("removing", path)(e)),
        _ => Ok(()),
    }
}

/// What lives beside metadata image `image` and goes with it: its digest, its verity
/// mark, and `auto`'s refusal (when it failed to mount) and build-in-progress marks.
pub fn companions(image: &Path) -> [PathBuf; 4] {
    [
        digest_path(image),
        verity_path(image),
        crate::lowers::composefs::auto::refused_path(image),
        crate::lowers::composefs::auto::building_path(image),
    ]
}

/// The directory inside a metadata image that holds the image's tree.
pub const ROOTFS: &str = "rootfs";

/// The image (top chain ID hex) whose metadata image `container` mounts, if it is a
/// composefs container: what `clean` and `check --repair` must leave in place.
pub(crate) fn image_of(container: &Container) -> Option<String> {
    let composefs = container.model().composefs();
    composefs
        .then(|| {
            container
                .record
                .layers
                .last()
                .map(|top| top.hex().to_string())
        })
        .flatten()
}

/// Where the metadata image of `top` is mounted.
pub fn mount_path(store: &Store, top: &Digest) -> PathBuf {
    store
        .layout()
        .composefs()
        .join(format!("{}.mnt", top.hex()))
}

/// Where the metadata image of the image whose top layer is `top` lives.
pub fn image_path(store: &Store, top: &Digest) -> PathBuf {
    store
        .layout()
        .composefs()
        .join(format!("{}.erofs", top.hex()))
}

/// Where the fs-verity digest (hex) of metadata image `image` is recorded.
pub fn digest_path(image: &Path) -> PathBuf {
    beside(image, ".digest")
}

/// The EROFS image of `chain_ids` merged, its objects stored and synced.
fn build(
    store: &Store,
    chain_ids: &[Digest],
    verity: bool,
    limits: Limits,
) -> io::Result<Box<[u8]>> {
    let host = &**store.host();
    let mut tree = crate::lowers::composefs::merge::merge(store, chain_ids, limits)?;
    // The merged tree under `rootfs/`, which overlays name as their lower: unmounted, the
    // mount point is empty and `rootfs/` does not exist, so a caller mounting the options
    // itself (`--without-mount`) after a host restart gets an error, not an empty root.
    let merged = std::mem::replace(
        &mut tree.root,
        generic_tree::Directory::new(Stat::uninitialized()),
    );
    tree.root.stat = merged.stat.clone();
    tree.root
        .insert(OsStr::new(ROOTFS), Inode::Directory(Box::new(merged)));
    let objects = store.layout().objects();
    let staging = store.layout().tmp().join(format!(
        "composefs-{}-objects-{}",
        chain_ids[chain_ids.len() - 1].hex(),
        lamina_store::unique_suffix()
    ));
    crate::lowers::composefs::snapshot_copies::copy_snapshot_objects(store, host, verity)?;
    let mut objects = Objects::new(host, objects, staging, verity);
    objects.link_layer_files = !store.properties().layer_data_in_objects;
    // Between the merge's look at each layer and the reads of its files: where a test
    // changes a committed snapshot's files as its container could.
    store.pause_point("composefs-merged");
    let tree = tree.try_map_regular(|path| objects.store(path))?;
    objects.sync_names()?;
    if objects.shared_bytes > 0 {
        tracing::info!(
            bytes = objects.shared_bytes,
            "layer files now share their objects' extents"
        );
    }
    let tree = ValidatedFileSystem::new(tree)
        .map_err(|e| crate::lowers::composefs::merge::refusal(format!("{e:#}")))?;
    Ok(mkfs_erofs(&tree))
}
