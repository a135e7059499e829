//! Container root filesystems from stored layers: choosing a mount strategy, providing
//! the rootfs (fresh overlay, pooled overlay, shared or direct read-only bind), and
//! tearing it down — inline or through the reaper — with nothing left behind.
//!
//! What a container's rootfs is lives in one typed value, [`Model`] (`model/`): every
//! lifecycle step (`lifecycle/`) reads it from the record (`model/record.rs`), and a step
//! that depends on the provider matches on it once, in `providers/mod.rs`. Front-ends
//! (CLI, snapshotter) call one function of this crate per operation and carry out the
//! [`FollowUp`]s a create returns. docs/strategies.md, "Where the code is", has the
//! layout; `scripts/arch-check` holds the code to it.
//!
//! Every kernel call goes through [`lamina_sys::Mounter`] and the store's
//! [`lamina_sys::HostFs`], so all of this runs against the fake kernel in tests, as an
//! unprivileged user.

pub mod choose;
mod fsutil;
pub mod gc;
pub mod lifecycle;
pub mod lowers;
pub mod model;
pub mod providers;
pub mod uppers;

// The paths other crates name: the crate's public face, not how it is laid out inside.
pub use choose::probe;
pub use lowers::composefs::{self, auto as composefs_auto};
pub use lowers::plan;
pub use model::record;
pub use providers::pooled::pool;
pub use uppers::isolated;

pub use choose::{COMPOSEFS_FROM_LAYERS, Choice, MetadataImage, Pools, Request, choose};
pub use gc::check::{CheckReport, Problem, check, check_verified};
pub use gc::clean::{CleanReport, clean, remove_crashed_create};
pub use lifecycle::attach::{
    UpperToCommit, attach, attach_if, commit_upper, create_empty, refuse_upper_in_use,
    upper_to_commit,
};
pub use lifecycle::attach_cache::AttachCache;
pub use lifecycle::create::{Created, FollowUp, Layers, StoredLayers, create, create_from};
pub use lifecycle::delete::{Deleted, delete};
pub use lifecycle::delete_store::delete_store;
pub use lifecycle::init_store::init_store;
pub use lifecycle::reap::{Reaped, Reaper, reap, reap_lingering, reaper_running};
pub use lifecycle::remount::{mount, unmount};
pub use lifecycle::stats::{DiskUsage, Stats, Walked, Written, stats, written};
pub use model::record::{Container, RootfsRecord, UpperFsRecord};
pub use model::strategy::{Strategies, UpperBackend};
pub use model::{Flavour, Model, Provider, Teardown};
pub use providers::lazy::{
    LazyServer, layer_usage as lazy_layer_usage, layers_root as lazy_layers_root,
    prepare_layer as prepare_lazy_layer, pull as pull_lazily, still_lazy as is_lazy_layer,
    tree_of as layer_tree,
};
pub use providers::{Attach, CreateOptions, ToMount};
pub use uppers::isolated::{DiskLimit, UpperPlan};

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
        "a memory-backed upper of {limit} bytes is more than half this host's memory ({ceiling} bytes): lower the limit, or use strategy `isolated` (on disk)"
    )]
    MemoryUpperTooLarge { limit: u64, ceiling: u64 },
    #[error(
        "a disk limit needs strategy `isolated`, `isolated-memory` or (on a btrfs store with quotas enabled) `isolated-quota`; `{strategies}` cannot enforce one"
    )]
    DiskLimitNeedsIsolated { strategies: String },
    #[error(
        "--without-mount cannot be served by this uid-mapped store: it idmaps layers when it mounts them, which mount options cannot express (initialise the store with --chown-layers)"
    )]
    WithoutMountIdmapped,
    #[error(
        "strategy `pooled`: the image's pool of `{flavour}` overlays has no slot ready (fill it with `lamina pool fill --strategy pooled,{flavour} IMAGE`, or leave `pooled` out)"
    )]
    PoolEmpty { flavour: String },
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
