//! `pool fill` as an operator asks for it: a strategy list and a request (ephemeral, a
//! disk limit), resolved to the pool of exactly the flavour and upper size a create of
//! the same request would claim from — so a filled pool is one the next create finds.

use lamina_image::Image;
use lamina_store::Store;
use lamina_sys::{DiskFs, Mounter};

use crate::choose::{Pools, Request, choose};
use crate::providers::pooled::pool::{self, Filled, PoolKind};
use crate::{DiskLimit, RootfsError, Strategies, UpperBackend, choose::probe, uppers::isolated};

/// What to fill a pool with.
#[derive(Debug, Clone)]
pub struct FillRequest<'a> {
    /// Overlays of this image; `None`: bare isolated upper filesystems for any image.
    pub image: Option<&'a Image>,
    /// As `create --strategy` takes them (`auto`: what create would pick).
    pub strategies: Strategies,
    pub ephemeral: bool,
    pub disk_limit: Option<DiskLimit>,
    pub disk_fs: DiskFs,
    /// The pool's wanted size (`None`: the pool module's default).
    pub size: Option<usize>,
}

/// Fills the pool `request` describes.
pub fn fill_for(
    store: &Store,
    mounter: &dyn Mounter,
    request: &FillRequest<'_>,
) -> Result<Filled, RootfsError> {
    if let Some(kind) = request.strategies.read_only_kind() {
        return Err(RootfsError::Refused(format!(
            "pools hold read-write overlays; strategy `{kind}` is read-only"
        )));
    }
    // From import until the slots are mounted, `clean` must not take the layers.
    let _layers_in_use = store.use_layers()?;
    let kind = match request.image {
        Some(image) => {
            let probe = probe::probe(store, mounter, false).map_err(RootfsError::Probe)?;
            // The flavour create would mount for this request, so its claims find these.
            let asked = Request::on_store(
                store,
                mounter,
                request.strategies,
                false,
                request.ephemeral,
                request.disk_limit.is_some(),
            );
            let choice = choose(&asked, &probe, image.layers.len(), &Pools::EMPTY)?;
            let flavour = choice.model.flavour().unwrap_or_default();
            if flavour.isolated == Some(UpperBackend::Quota) {
                return Err(RootfsError::Refused(QUOTA_NOT_POOLED.into()));
            }
            let chain_ids = store.import(image)?;
            let upper = crate::uppers::plan(
                store,
                &chain_ids,
                flavour.isolated,
                request.disk_limit,
                request.disk_fs,
            )?;
            PoolKind::overlays(&chain_ids, flavour, upper)
        }
        None => {
            let backend = request.strategies.isolated.ok_or_else(|| {
                RootfsError::Refused(
                    "pool fill without an IMAGE makes bare upper filesystems: pass --strategy isolated or isolated-memory".into(),
                )
            })?;
            if backend == UpperBackend::Quota {
                return Err(RootfsError::Refused(QUOTA_NOT_POOLED.into()));
            }
            // No image, no layers to count: the upper is the limit as given.
            PoolKind::uppers(isolated::plan_for(
                store,
                &[],
                backend,
                request.disk_limit,
                request.disk_fs,
            )?)
        }
    };
    pool::fill(store, mounter, &kind, request.size)
}

/// Why no pool holds quota uppers (and create never looks for one).
const QUOTA_NOT_POOLED: &str = "a quota upper (`isolated-quota`, or a disk limit on a btrfs store with quotas) is a subvolume made in about a millisecond: there is nothing to pool";
