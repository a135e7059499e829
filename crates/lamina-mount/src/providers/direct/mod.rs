//! direct (stall S5): a read-only rootfs with no overlay in the path. A multi-layer image
//! is flattened once into `flat/<top-chain-id>/`: real directories (with the layers'
//! metadata) holding hardlinks to the layers' files, whiteouts and opaque directories
//! applied. Files are not copied: the tree costs one directory inode per directory.
//!
//! A hardlink is the same inode as the layer's file, so a write through it would change
//! the layer for every container. That is why this tree is only ever bound read-only,
//! and why a direct rootfs can never be read-write.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::{At, HostFs, Mounter};
use rustix::fs::{AtFlags, CWD, FileType, Timespec, Timestamps};

use crate::RootfsError;
use crate::model::record::Container;
use crate::providers::{Attach, Made, Provide, bind_dir, record_mounted};

mod copies;
use copies::Copies;

// Owners, whiteouts and xattrs are read and set through the store's host (the kernel
// seam): a layer's owners and overlay markers are what an import through it recorded.

/// A read-only bind of the image's one layer, or of its flattened tree (made first if it
/// is not there).
pub(crate) fn provide<'a>(cx: &Provide<'a, '_>) -> Result<Made<'a>, RootfsError> {
    let source = source(cx.store, cx.chain_ids)?;
    let claim = cx.store.create_bind_container_dirs(cx.id)?;
    bind_dir(
        cx.store,
        cx.mounter,
        claim,
        source,
        None,
        cx.choice.model,
        cx.options.without_mount,
    )
}

/// Binds the recorded tree again.
pub(crate) fn mount_again(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
) -> Result<(), RootfsError> {
    let source = bound(container)?;
    mounter.bind_read_only(&source, &container.dirs(store).rootfs)?;
    record_mounted(store, container)
}

/// The recorded tree, bound read-only by the caller.
pub(crate) fn attach(container: &Container) -> Result<Attach, RootfsError> {
    Ok(Attach::Bind {
        source: bound(container)?,
        read_only: true,
    })
}

/// The tree a direct container's record names (checked to be the store's when read).
fn bound(container: &Container) -> Result<PathBuf, RootfsError> {
    container.rootfs.bind_source.clone().ok_or_else(|| {
        RootfsError::Refused(format!(
            "container `{}`: its direct record names no tree to bind",
            container.id()
        ))
    })
}

/// The directory a direct container binds: the layer itself when the image has one
/// layer with nothing for overlay to interpret, otherwise the image's flattened tree.
pub(crate) fn source(store: &Store, chain_ids: &[Digest]) -> Result<PathBuf, StoreError> {
    if let [only] = chain_ids
        && let record = store.layer_record(only)?
        && record.overlay_markers == Some(0)
        && !record.objects
    {
        return Ok(store.layout().layer_diff(only));
    }
    ensure(store, chain_ids)
}

/// Builds `flat/<top>` once (under a lock, in `tmp/`, renamed into place when whole).
pub(crate) fn ensure(store: &Store, chain_ids: &[Digest]) -> Result<PathBuf, StoreError> {
    let Some(top) = chain_ids.last() else {
        return Err(StoreError::io("flattening", store.root())(
            io::Error::other("the image has no layers"),
        ));
    };
    let flat = store.layout().flat().join(top.hex());
    if flat.is_dir() {
        return Ok(flat);
    }
    let _lock = store.lock(&format!("flat-{}", top.hex()))?;
    if flat.is_dir() {
        return Ok(flat);
    }
    let staging = store.layout().tmp().join(format!(
        "flat-{}-{}",
        top.hex(),
        lamina_store::unique_suffix()
    ));
    let started = std::time::Instant::now();
    let host = &**store.host();
    // Opened before the tree is written: the sync reports every write the device refused
    // since (HostFs::syncfs).
    let built = fs::create_dir(&staging)
        .and_then(|()| fs::File::open(&staging))
        .and_then(|dir| {
            build(host, store, chain_ids, &staging)?;
            host.syncfs(&dir, &staging)?;
            fs::rename(&staging, &flat)
        });
    if let Err(e) = built {
        let _ = lamina_store::remove_tree(&staging);
        return Err(StoreError::io("flattening image into", &flat)(e));
    }
    tracing::info!(image = %top, layers = chain_ids.len(), ms = started.elapsed().as_millis() as u64, "flattened image for direct binds");
    Ok(flat)
}

/// Fills the empty directory `dest` with the merged tree of `chain_ids`.
fn build(host: &dyn HostFs, store: &Store, chain_ids: &[Digest], dest: &Path) -> io::Result<()> {
    let mut copies = store
        .properties()
        .layer_data_in_objects
        .then(|| Copies::new(store.layout().objects()));
    for chain_id in chain_ids {
        let layer = store.layout().layer_diff(chain_id);
        if let Some(copies) = copies.as_mut() {
            // Only an import's stubs are followed: a committed snapshot's upper may hold
            // overlay's own marks, which name no object.
            copies.stubs = store
                .layer_record(chain_id)
                .map_err(io::Error::other)?
                .objects;
        }
        apply_dir(host, &layer, dest, copies.as_mut())?;
        copy_dir_metadata(host, &layer, dest)?;
    }
    Ok(())
}

/// Lays the entries of layer directory `src` over the tree at `dst`: hardlinks to the
/// layers' entries, or copies of them where `copies` is given.
fn apply_dir(
    host: &dyn HostFs,
    src: &Path,
    dst: &Path,
    mut copies: Option<&mut Copies>,
) -> io::Result<()> {
    for entry in fs::read_dir(src)? {
        let name = entry?.file_name();
        let (from, to) = (src.join(&name), dst.join(&name));
        let meta = fs::symlink_metadata(&from)?;
        let existing = fs::symlink_metadata(&to).ok();
        let st = host.stat(At::Path(&from))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice && st.st_rdev == 0 {
            // A whiteout: the name is gone from here down.
            if let Some(existing) = existing {
                remove(&to, &existing)?;
            }
            continue;
        }
        if meta.is_dir() {
            match existing {
                Some(e) if e.is_dir() => {
                    if is_opaque(host, &from) {
                        lamina_store::remove_tree(&to)?;
                        fs::create_dir(&to)?;
                    }
                }
                Some(e) => {
                    remove(&to, &e)?;
                    fs::create_dir(&to)?;
                }
                None => fs::create_dir(&to)?,
            }
            apply_dir(host, &from, &to, copies.as_deref_mut())?;
            copy_dir_metadata(host, &from, &to)?;
        } else {
            if let Some(existing) = existing {
                remove(&to, &existing)?;
            }
            match copies.as_deref_mut() {
                Some(copies) => copies.copy(host, &from, &st, &to)?,
                // linkat without AT_SYMLINK_FOLLOW: a symlink is linked, not its target.
                None => fs::hard_link(&from, &to)?,
            }
        }
    }
    Ok(())
}

fn remove(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    if meta.is_dir() {
        lamina_store::remove_tree(path)
    } else {
        fs::remove_file(path)
    }
}

/// Whether layer directory `dir` carries overlay's opaque marker (it hides what the
/// layers below have there). composefs's merge asks too.
pub(crate) fn is_opaque(host: &dyn HostFs, dir: &Path) -> bool {
    let opaque = host.get_xattr(At::Path(dir), OsStr::new("trusted.overlay.opaque"));
    matches!(opaque, Ok(Some(v)) if v == b"y")
}

/// Owner, mode (set-id and sticky bits included), xattrs other than overlay's, times.
fn copy_dir_metadata(host: &dyn HostFs, from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    let st = host.stat(At::Path(from))?;
    host.chown(At::Path(to), st.st_uid, st.st_gid)?;
    host.set_mode(At::Path(to), meta.mode())?;
    copy_xattrs(host, from, to)?;
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec() as _,
        },
        last_modification: Timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec() as _,
        },
    };
    rustix::fs::utimensat(CWD, to, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

fn copy_xattrs(host: &dyn HostFs, from: &Path, to: &Path) -> io::Result<()> {
    for name in host.list_xattrs(At::Path(from))? {
        if name.as_encoded_bytes().starts_with(b"trusted.overlay.") {
            continue; // overlay's own markers mean nothing outside an overlay
        }
        if let Some(value) = host.get_xattr(At::Path(from), &name)? {
            host.set_xattr(At::Path(to), &name, &value)?;
        }
    }
    Ok(())
}
