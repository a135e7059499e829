//! What a provider hands back to `create`: the claimed directories, what the record says
//! of the rootfs, and the undo that removes all of it if a later step fails.

use std::path::PathBuf;

use lamina_store::{ContainerClaim, ContainerDirs, Store};
use lamina_sys::{Mounter, OverlaySpec};

use crate::RootfsError;
use crate::model::Model;
use crate::model::record::RootfsRecord;
use crate::providers::shared_ro;

/// The mount a `--without-mount` caller makes on the rootfs path.
#[derive(Debug, Clone)]
pub enum ToMount {
    Overlay(OverlaySpec),
    /// A read-only bind of this directory.
    Bind(PathBuf),
}

/// A provided rootfs, before its record is written.
pub(crate) struct Made<'a> {
    pub(crate) claim: ContainerClaim,
    pub(crate) undo: Undo<'a>,
    pub(crate) to_mount: ToMount,
    /// What the record says of the rootfs.
    pub(crate) rootfs: RootfsRecord,
    /// shared-ro: the lease stays flocked until the record naming it is written.
    pub(crate) lease_in_flight: Option<shared_ro::Acquired>,
    pub(crate) claimed_from_pool: bool,
}

/// A read-only bind of `source` as the rootfs (shared-ro, direct); a failed create
/// releases `lease`.
pub(crate) fn bind_dir<'a>(
    store: &'a Store,
    mounter: &'a dyn Mounter,
    claim: ContainerClaim,
    source: PathBuf,
    lease: Option<PathBuf>,
    model: Model,
    without_mount: bool,
) -> Result<Made<'a>, RootfsError> {
    let undo = Undo::new(store, mounter, &claim.dirs, lease.clone());
    if !without_mount {
        mounter.bind_read_only(&source, &claim.dirs.rootfs)?;
    }
    let mut rootfs = RootfsRecord::new(model, !without_mount, vec!["bind".into(), "ro".into()]);
    rootfs.bind_source = Some(source.clone());
    rootfs.lease = lease;
    Ok(Made {
        claim,
        undo,
        to_mount: ToMount::Bind(source),
        rootfs,
        lease_in_flight: None,
        claimed_from_pool: false,
    })
}

/// Rolls a failed create back: unmount whatever was mounted in the container's
/// directory (its overlay, its own upper filesystem), remove the directory, drop the
/// lease taken. Disarmed once the record is written.
pub(crate) struct Undo<'a> {
    store: &'a Store,
    mounter: &'a dyn Mounter,
    base: PathBuf,
    lease: Option<PathBuf>,
    pub(crate) armed: bool,
}

impl<'a> Undo<'a> {
    pub(crate) fn new(
        store: &'a Store,
        mounter: &'a dyn Mounter,
        dirs: &ContainerDirs,
        lease: Option<PathBuf>,
    ) -> Self {
        Undo {
            store,
            mounter,
            base: dirs.base.clone(),
            lease,
            armed: true,
        }
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Unmounts before removing, and removes nothing if an unmount fails.
        if let Err(e) = crate::uppers::remove_unmounted(self.mounter, &self.base) {
            let base = self.base.display();
            tracing::error!(%base, error = %e, "rolling back a failed create failed");
            return;
        }
        if let Some(lease) = &self.lease
            && let Err(e) = shared_ro::release(self.store, self.mounter, lease)
        {
            tracing::error!(lease = %lease.display(), error = %e, "rolling back a failed create: releasing the shared mount failed");
        }
    }
}
