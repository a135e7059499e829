//! shared-ro (stall S4): one read-only overlay per image, mounted once under
//! `shared/<top-chain-id>/rootfs`; each read-only container gets a read-only bind of it,
//! so a thousand containers make one superblock and share its page and inode caches.
//!
//! Who uses a shared mount is on disk, never in memory: each container holds a lease
//! file in `shared/<key>/users/`, named in its record. The last release finds `users/`
//! empty (rmdir succeeds) and unmounts. After a crash, [`recount`] rebuilds the leases
//! from the records in `images/` and `trash/`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::lowers::plan;
use crate::model::record::Container;
use crate::providers::{Attach, Made, Provide, bind_dir, record_mounted};

/// Name of the empty directory overlay gets as a second lower for single-layer images.
const EMPTY: &str = "empty";

/// An acquired shared mount. The lease file stays flocked until this is dropped, which
/// the caller does once its record (naming the lease) is written: a recount meanwhile
/// sees a lease without a record, finds it locked, and keeps it.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub rootfs: PathBuf,
    pub lease: PathBuf,
    _in_flight: lamina_store::Flocked,
}

fn lock_name(dir: &Path) -> String {
    format!(
        "shared-{}",
        dir.file_name().unwrap_or_default().to_string_lossy()
    )
}

/// A read-only bind of the image's shared overlay (mounted first if it is not), under a
/// lease the record names.
pub(crate) fn provide<'a>(cx: &Provide<'a, '_>) -> Result<Made<'a>, RootfsError> {
    let (store, mounter) = (cx.store, cx.mounter);
    let acquired = acquire(store, mounter, cx.chain_ids)?;
    let claim = match store.create_bind_container_dirs(cx.id) {
        Ok(claim) => claim,
        Err(e) => {
            release(store, mounter, &acquired.lease)?;
            return Err(e.into());
        }
    };
    let mut made = bind_dir(
        store,
        mounter,
        claim,
        acquired.rootfs.clone(),
        Some(acquired.lease.clone()),
        cx.choice.model,
        cx.options.without_mount,
    )?;
    made.lease_in_flight = Some(acquired);
    Ok(made)
}

/// Binds the container's rootfs again. The shared mount may be gone (host restart): a
/// fresh lease is taken, recorded, and only then the old one dropped.
pub(crate) fn mount_again(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
) -> Result<(), RootfsError> {
    let dirs = container.dirs(store);
    let acquired = acquire(store, mounter, &container.record.layers)?;
    if let Err(e) = mounter.bind_read_only(&acquired.rootfs, &dirs.rootfs) {
        release(store, mounter, &acquired.lease)?;
        return Err(e.into());
    }
    let old = container.rootfs.lease.replace(acquired.lease.clone());
    container.rootfs.bind_source = Some(acquired.rootfs.clone());
    record_mounted(store, container)?;
    if let Some(old) = old.filter(|o| *o != acquired.lease) {
        release(store, mounter, &old)?;
    }
    Ok(())
}

/// The shared overlay, mounted again first if a host restart took it away.
pub(crate) fn attach(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<Attach, RootfsError> {
    let (Some(source), Some(lease)) = (&container.rootfs.bind_source, &container.rootfs.lease)
    else {
        return Err(RootfsError::Refused(format!(
            "container `{}`: its shared-ro record names no shared mount",
            container.id()
        )));
    };
    remount_shared(store, mounter, lease, &container.record.layers)?;
    Ok(Attach::Bind {
        source: source.clone(),
        read_only: true,
    })
}

/// Drops the lease a deleted container held.
pub(crate) fn release_lease(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<(), RootfsError> {
    match &container.rootfs.lease {
        Some(lease) => release(store, mounter, lease),
        None => Ok(()),
    }
}

/// Mounts the image's shared read-only overlay if it is not mounted, and takes a lease.
pub(crate) fn acquire(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<Acquired, RootfsError> {
    let top = chain_ids.last().ok_or(RootfsError::Unsupported {
        strategy: "shared-ro",
        why: "the image has no layers",
    })?;
    let dir = store.layout().shared().join(top.hex());
    let lock = store.lock(&lock_name(&dir))?;
    let rootfs = dir.join("rootfs");
    let users = dir.join("users");
    if mount_if_unmounted(store, mounter, &rootfs, chain_ids)? {
        tracing::info!(image = %top, "mounted shared read-only image");
    }
    fs::create_dir_all(&users).map_err(StoreError::io("creating", &users))?;
    let lease = users.join(lamina_store::unique_suffix());
    let file = File::create_new(&lease).map_err(StoreError::io("creating lease", &lease))?;
    rustix::fs::flock(file.as_fd(), FlockOperation::LockExclusive)
        .map_err(StoreError::errno("locking lease", &lease))?;
    drop(lock);
    Ok(Acquired {
        rootfs,
        lease,
        _in_flight: lamina_store::Flocked::new(file),
    })
}

/// Mounts again the shared overlay a container's `lease` is on, if it is not mounted (a
/// host restart unmounted it): a bind of it would otherwise hand the caller the empty
/// directory beneath (a shared-ro snapshot's Mounts after a host restart).
/// `chain_ids` are the container's layers; the shared directory must be theirs.
pub(crate) fn remount_shared(
    store: &Store,
    mounter: &dyn Mounter,
    lease: &Path,
    chain_ids: &[Digest],
) -> Result<(), RootfsError> {
    let dir = store
        .layout()
        .shared()
        .join(chain_ids.last().map(Digest::hex).unwrap_or_default());
    if lease.parent().and_then(Path::parent) != Some(dir.as_path()) {
        return Err(RootfsError::Refused(format!(
            "lease {} is not on the shared mount of the container's image",
            lease.display()
        )));
    }
    let _lock = store.lock(&lock_name(&dir))?;
    if mount_if_unmounted(store, mounter, &dir.join("rootfs"), chain_ids)? {
        tracing::info!(image = %dir.display(), "mounted shared read-only image again");
    }
    Ok(())
}

/// With the image's lock held: mounts the shared read-only overlay of `chain_ids` on
/// `rootfs` unless it is mounted there. True if this mounted it.
fn mount_if_unmounted(
    store: &Store,
    mounter: &dyn Mounter,
    rootfs: &Path,
    chain_ids: &[Digest],
) -> Result<bool, RootfsError> {
    if rootfs.is_dir() && mounter.is_mountpoint(rootfs)? {
        return Ok(false);
    }
    let empty = store.layout().shared().join(EMPTY);
    for d in [rootfs, empty.as_path()] {
        fs::create_dir_all(d).map_err(StoreError::io("creating", d))?;
    }
    mounter.mount_overlay(&plan::read_only(store, chain_ids, &empty), rootfs)?;
    Ok(true)
}

/// Drops a container's lease; unmounts the shared mount if it was the last.
pub(crate) fn release(
    store: &Store,
    mounter: &dyn Mounter,
    lease: &Path,
) -> Result<(), RootfsError> {
    let Some(dir) = lease.parent().and_then(Path::parent) else {
        return Ok(());
    };
    if !dir.starts_with(store.layout().shared()) {
        return Ok(()); // not ours to touch: a record can be edited by hand
    }
    let _lock = store.lock(&lock_name(dir))?;
    match fs::remove_file(lease) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io("removing lease", lease)(e).into()),
    }
    release_if_unused(mounter, dir)?;
    Ok(())
}

/// With the image's lock held: unmounts and removes `dir` when no lease remains.
fn release_if_unused(mounter: &dyn Mounter, dir: &Path) -> Result<bool, RootfsError> {
    let users = dir.join("users");
    match fs::remove_dir(&users) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => return Ok(false),
        Err(e) => return Err(StoreError::io("removing", &users)(e).into()),
    }
    let rootfs = dir.join("rootfs");
    if rootfs.is_dir() {
        mounter.unmount(&rootfs)?;
    }
    lamina_store::remove_tree(dir).map_err(StoreError::io("removing", dir))?;
    tracing::info!(dir = %dir.display(), "released unused shared read-only image");
    Ok(true)
}

/// Rebuilds every shared mount's leases from the container records (a crash can leave a
/// lease whose container is gone) and releases mounts nobody uses. Returns how many
/// were released.
pub(crate) fn recount(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    let shared = store.layout().shared();
    let mut released = 0;
    for entry in fs::read_dir(&shared).map_err(StoreError::io("listing", &shared))? {
        let dir = entry.map_err(StoreError::io("listing", &shared))?.path();
        if dir.file_name().is_some_and(|n| n == EMPTY) {
            continue;
        }
        let _lock = store.lock(&lock_name(&dir))?;
        // Read under the lock: a create holds it until its record (with the lease) exists.
        let live = live_leases(store)?;
        let users = dir.join("users");
        // With an unreadable record around, any lease may be its container's: keep all.
        if let (Some(live), Ok(leases)) = (live, fs::read_dir(&users)) {
            for lease in leases.flatten().map(|e| e.path()) {
                if !live.contains(&lease) && !in_flight(&lease) {
                    tracing::info!(lease = %lease.display(), "dropping a lease whose container is gone");
                    fs::remove_file(&lease).map_err(StoreError::io("removing lease", &lease))?;
                }
            }
        }
        if release_if_unused(mounter, &dir)? {
            released += 1;
        }
    }
    Ok(released)
}

/// Whether a create still holds this lease's flock (its record is not written yet).
fn in_flight(lease: &Path) -> bool {
    lamina_store::open_regular_file(lease).is_ok_and(|f| {
        rustix::fs::flock(f.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err()
    })
}

/// The leases records name; `None` if some record is unreadable (its lease is unknown).
fn live_leases(store: &Store) -> Result<Option<HashSet<PathBuf>>, RootfsError> {
    let mut live = HashSet::new();
    for dir in store.all_container_dirs()? {
        match crate::model::record::read_in(store, &dir) {
            Ok(container) => live.extend(container.and_then(|c| c.rootfs.lease)),
            Err(StoreError::BadRecord { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(live))
}
