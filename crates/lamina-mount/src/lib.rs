//! Container root filesystems from stored layers: choosing a mount strategy, providing
//! the rootfs (fresh overlay, pooled overlay, shared or direct read-only bind), and
//! tearing it down — inline or through the reaper — with nothing left behind.
//!
//! What a container's rootfs is lives in one typed value, [`Model`] (`model.rs`): every
//! lifecycle step reads it from the record (`record.rs`) and branches on it there, and
//! front-ends (CLI, snapshotter) call one function of this crate per operation.
//!
//! Every kernel call goes through [`lamina_sys::Mounter`] and the store's
//! [`lamina_sys::HostFs`], so all of this runs against the fake kernel in tests, as an
//! unprivileged user.

mod attach;
mod check;
mod choose;
mod clean;
mod collect;
pub mod composefs;
pub mod composefs_auto;
mod composefs_collect;
mod composefs_merge;
mod composefs_objects;
mod composefs_snapshot_copies;
mod composefs_verify;
mod create;
mod delete;
mod delete_store;
mod flatten;
mod init_store;
pub mod isolated;
pub mod model;
mod one_step;
pub mod plan;
pub mod pool;
mod pool_fill;
pub mod probe;
pub mod record;
mod remount;
mod shared;
mod stats;
mod strategy;

pub use attach::{
    Attach, UpperToCommit, attach, commit_upper, create_empty, refuse_upper_in_use, upper_to_commit,
};
pub use check::{CheckReport, Problem, check, check_verified};
pub use choose::{COMPOSEFS_FROM_LAYERS, Choice, MetadataImage, Pools, Request, choose};
pub use clean::{CleanReport, clean, remove_crashed_create};
pub use create::{CreateOptions, Created, Layers, StoredLayers, ToMount, create, create_from};
pub use delete::{Deleted, Reaped, delete, reap};
pub use delete_store::delete_store;
pub use init_store::init_store;
pub use isolated::{DiskLimit, UpperPlan};
pub use model::{Flavor, Model, Provider, Teardown};
pub use record::{Container, RootfsRecord, UpperFsRecord};
pub use remount::{mount, unmount};
pub use stats::{DiskUsage, Stats, Written, stats, written};
pub use strategy::{Strategies, UpperBackend};

use lamina_store::StoreError;
use lamina_sys::MountError;

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
    #[error(
        "its upper is on a filesystem of its own (strategy {strategy}), which a commit cannot move into the store"
    )]
    UpperNotCommittable { strategy: String },
    /// Its upper is still the upper of a mounted overlay (containerd mounts a snapshot
    /// itself): what a container wrote through it after the commit would change a
    /// published layer that other snapshots and containers share.
    #[error(
        "its upper is still mounted at {}: unmount it before committing (what is written through that mount would change the committed layer)",
        at.display()
    )]
    UpperInUse { at: std::path::PathBuf },
    /// Its rootfs idmaps its layers (containerd's `uidmapping` labels): what it wrote
    /// carries host ids, which a layer must not.
    #[error(
        "its upper was written through an idmapped rootfs, so its files carry host ids, which a layer must not"
    )]
    IdmappedNotCommittable,
    /// A strategy list that names no rootfs (see `Model::named`).
    #[error("{0}")]
    Refused(String),
    #[error("probing overlay support: {0}")]
    Probe(std::io::Error),
    #[error(
        "container `{id}`: its upper filesystem was a tmpfs and is gone (host restart), and its writes with it; delete and re-create it"
    )]
    MemoryUpperLost { id: String },
    #[error(
        "layers exceed disk quota: disk limit of {limit} bytes leaves no room to write: the image alone takes {image} bytes (raise the limit, or pass --exclude-image-from-quota)"
    )]
    DiskLimitTooSmall { limit: u64, image: u64 },
    #[error(
        "a disk limit needs strategy `isolated`, `isolated-memory` or (on a btrfs store with quotas enabled) `isolated-quota`; `{strategies}` cannot enforce one"
    )]
    DiskLimitNeedsIsolated { strategies: String },
    #[error(
        "--without-mount cannot be served by this uid-mapped store: it idmaps layers when it mounts them, which mount options cannot express (initialise the store with --chown-layers)"
    )]
    WithoutMountIdmapped,
    #[error(
        "strategy `pooled`: the image's pool of `{flavor}` overlays has no slot ready (fill it with `lamina pool fill --strategy pooled,{flavor} IMAGE`, or leave `pooled` out)"
    )]
    PoolEmpty { flavor: String },
    #[error(
        "strategy `pooled` serves read-write overlays; it does not combine with --read-only (use shared-ro or direct)"
    )]
    PoolReadOnly,
    #[error(
        "strategy `pooled` claims an overlay that is already mounted; it does not combine with --without-mount"
    )]
    PoolWithoutMount,
    #[error("rootfs of container `{id}` is busy (a process may still use it): {source}")]
    Busy { id: String, source: MountError },
    #[error(
        "container `{id}` was mounted volatile and not cleanly unmounted (crash or host restart): its writes may be lost, so lamina will not remount it; delete and re-create it"
    )]
    VolatileUnclean { id: String },
    #[error(
        "container `{id}`: the upper filesystem reported a writeback error while mounted volatile ({source}): its writes may be lost; it is unmounted and will not be remounted"
    )]
    VolatileWriteback { id: String, source: MountError },
}

impl RootfsError {
    /// An unmount failure of container `id`: EBUSY means a process still uses the rootfs,
    /// which callers report differently from other mount errors.
    pub(crate) fn unmounting(id: &str, e: MountError) -> Self {
        if e.errno == lamina_sys::Errno::BUSY {
            RootfsError::Busy {
                id: id.into(),
                source: e,
            }
        } else {
            RootfsError::Mount(e)
        }
    }
}

/// Where overlay marks a volatile mount's work dir; its presence refuses a remount.
pub(crate) fn volatile_marker(work: &std::path::Path) -> std::path::PathBuf {
    work.join("work").join("incompat").join("volatile")
}
