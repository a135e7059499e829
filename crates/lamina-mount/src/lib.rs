//! Creating and deleting container root filesystems: import the image's layers into the
//! store, plan the mount, mount it, record it — and undo every step if a later one fails,
//! so a failed create leaves no directory, record or mount behind.

pub mod plan;
pub mod probe;
mod strategy;

pub use strategy::Strategies;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use lamina_image::Image;
use lamina_store::{ContainerRecord, Store, StoreError};
use lamina_sys::{MountError, Mounter, OverlaySpec};

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("strategy {strategy} is not available here: {why} (see `lamina probe`)")]
    Unsupported {
        strategy: &'static str,
        why: &'static str,
    },
    #[error("probing overlay support: {0}")]
    Probe(std::io::Error),
    #[error("rootfs of container `{id}` is busy (a process may still use it): {source}")]
    Busy { id: String, source: MountError },
}

/// What `create` made.
#[derive(Debug, Clone)]
pub struct Created {
    pub record: ContainerRecord,
    pub rootfs: PathBuf,
    pub spec: OverlaySpec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    NotFound,
}

/// Options for one create.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Leave mounting to the caller (Garden's `--without-mount`): record the overlay
    /// options, mount nothing.
    pub without_mount: bool,
    pub strategies: Strategies,
}

/// Creates container `id` from `image`.
pub fn create(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    id: &str,
    options: &CreateOptions,
) -> Result<Created, RootfsError> {
    lamina_store::validate_id(id)?;
    // Fail a duplicate before spending time on import; the mkdir below is the real claim.
    if store.container_exists(id) {
        return Err(StoreError::AlreadyExists(id.into()).into());
    }
    check_supported(store, mounter, options.strategies)?;
    let chain_ids = store.import(image)?;
    let dirs = store.create_container_dirs(id)?;
    let mut undo = Undo {
        store,
        mounter,
        id,
        rootfs: None,
        armed: true,
    };

    let spec = plan::read_write(store, &chain_ids, &dirs, options.strategies);
    if !options.without_mount {
        mounter.mount_overlay(&spec, &dirs.rootfs)?;
        undo.rootfs = Some(dirs.rootfs.clone());
    }
    let record = ContainerRecord {
        id: id.to_string(),
        image: image.source.clone(),
        image_id: image.config_digest.clone(),
        layers: chain_ids,
        env: image.env(),
        strategy: options.strategies.to_string(),
        mounted: !options.without_mount,
        mount_options: spec.option_strings(),
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    store.write_record(&record)?;
    undo.armed = false;
    tracing::info!(
        id,
        strategy = "classic",
        layers = record.layers.len(),
        mounted = record.mounted,
        "created rootfs"
    );
    Ok(Created {
        record,
        rootfs: dirs.rootfs,
        spec,
    })
}

/// Refuses strategies the kernel (as probed on this store) cannot give.
fn check_supported(
    store: &Store,
    mounter: &dyn Mounter,
    strategies: Strategies,
) -> Result<(), RootfsError> {
    if strategies == Strategies::default() {
        return Ok(());
    }
    let probe = probe::probe(store, mounter, false).map_err(RootfsError::Probe)?;
    if strategies.metacopy && !probe.metacopy {
        return Err(RootfsError::Unsupported {
            strategy: "metacopy",
            why: "metadata-only copy-up did not happen in the probe",
        });
    }
    if strategies.volatile && !probe.volatile {
        return Err(RootfsError::Unsupported {
            strategy: "volatile",
            why: "overlay refused the volatile option",
        });
    }
    Ok(())
}

/// Unmounts and removes container `id`. A missing container is not an error: Garden
/// calls delete on every image plugin and each must succeed.
pub fn delete(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Deleted, RootfsError> {
    lamina_store::validate_id(id)?;
    if !store.container_exists(id) {
        return Ok(Deleted::NotFound);
    }
    let rootfs = store.rootfs_path(id);
    match mounter.unmount(&rootfs) {
        Ok(_) => {}
        Err(e) if e.errno == lamina_sys::Errno::BUSY => {
            return Err(RootfsError::Busy {
                id: id.into(),
                source: e,
            });
        }
        Err(e) => return Err(e.into()),
    }
    // Racing deletes of one ID: the loser finds nothing left to remove.
    Ok(if store.remove_container_dirs(id)? {
        Deleted::Removed
    } else {
        Deleted::NotFound
    })
}

/// Rolls a failed create back: unmount what was mounted, remove what was made.
struct Undo<'a> {
    store: &'a Store,
    mounter: &'a dyn Mounter,
    id: &'a str,
    rootfs: Option<PathBuf>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(rootfs) = &self.rootfs
            && let Err(e) = self.mounter.unmount(rootfs)
        {
            tracing::error!(id = self.id, error = %e, "rolling back a failed create: unmount failed");
            return; // never remove directories under a live mount
        }
        if let Err(e) = self.store.remove_container_dirs(self.id) {
            tracing::error!(id = self.id, error = %e, "rolling back a failed create: removal failed");
        }
    }
}
