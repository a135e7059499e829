//! pooled (stall S2): a pre-mounted read-write overlay claimed from the image's pool —
//! a rename, no mount syscall. `pool` keeps the slots; `fill` resolves an operator's
//! `pool fill` to the pool a create of the same request claims from.

pub mod fill;
pub mod pool;

use lamina_image::Digest;
use lamina_store::Store;
use lamina_sys::DiskFs;

use crate::RootfsError;
use crate::lowers::plan;
use crate::model::Flavour;
use crate::model::record::RootfsRecord;
use crate::model::strategy::UpperBackend;
use crate::providers::{Made, Provide, ToMount, Undo, fresh};
use crate::uppers::isolated::{self, DiskLimit, UpperPlan};
use pool::PoolKind;

/// Claims a slot of `flavour` from the image's pool. A pool `auto` found ready but that
/// another create emptied meanwhile gets a fresh overlay instead; a `pooled` the operator
/// named is refused, never silently replaced.
pub(crate) fn provide<'a>(cx: &Provide<'a, '_>, flavour: Flavour) -> Result<Made<'a>, RootfsError> {
    let (store, mounter, options) = (cx.store, cx.mounter, cx.options);
    if !options.without_mount || options.claim_pooled_without_mount {
        let kind = PoolKind::overlays(cx.chain_ids, flavour, cx.upper);
        if let Some((claim, mount_options)) = pool::claim(store, mounter, &kind, cx.id)? {
            let spec = plan::read_write(store, cx.chain_ids, &claim.dirs, flavour);
            let undo = Undo::new(store, mounter, &claim.dirs, None);
            // A claimed pool overlay is mounted whatever the caller mounts.
            let mut rootfs = RootfsRecord::new(cx.choice.model, true, mount_options);
            rootfs.upper_fs = cx.upper.map(|u| u.record());
            return Ok(Made {
                claim,
                undo,
                to_mount: ToMount::Overlay(spec),
                rootfs,
                lease_in_flight: None,
                claimed_from_pool: true,
            });
        }
        if cx.choice.named {
            // Another create took the last slot between the check and the claim.
            return Err(RootfsError::PoolEmpty {
                flavour: flavour.to_string(),
            });
        }
        tracing::info!(id = cx.id, "pool is empty: mounting a fresh overlay");
    }
    fresh::provide(cx, flavour, false)
}

/// Which pools of an image hold a ready slot, for a create with this disk limit: an
/// isolated upper's pool is judged for the size this create would claim (sized by its
/// limit when the layers it measures are in the store, as they are whenever a pool of
/// them is).
pub(crate) struct Ready<'a> {
    pub(crate) store: &'a Store,
    pub(crate) chain_ids: &'a [Digest],
    pub(crate) disk_limit: Option<DiskLimit>,
    pub(crate) disk_fs: DiskFs,
}

impl Ready<'_> {
    /// The upper a create would plan; `None` where it would refuse one (an image larger
    /// than the limit, a memory upper past the host's bound): no pool is ready for it.
    fn planned_upper(&self, backend: UpperBackend) -> Option<UpperPlan> {
        isolated::plan_for(
            self.store,
            self.chain_ids,
            backend,
            self.disk_limit,
            self.disk_fs,
        )
        .ok()
    }

    /// A pre-mounted overlay of `flavour` is ready.
    pub(crate) fn overlays(&self, flavour: Flavour) -> bool {
        let upper = match flavour.isolated {
            Some(backend) => match self.planned_upper(backend) {
                Some(plan) => Some(plan),
                None => return false,
            },
            None => None,
        };
        pool::ready(
            self.store,
            &PoolKind::overlays(self.chain_ids, flavour, upper),
        )
    }

    /// A bare upper filesystem of `backend` is ready.
    pub(crate) fn uppers(&self, backend: UpperBackend) -> bool {
        self.planned_upper(backend)
            .is_some_and(|plan| pool::ready(self.store, &PoolKind::uppers(plan)))
    }
}
