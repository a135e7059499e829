//! fresh: an overlay mounted for this one container (GrootFS's way; `classic` when its
//! flavour is plain), read-write, or read-only with `--read-only`. Its lowers come from
//! [`crate::lowers::plan`], its upper from [`crate::uppers`].

use lamina_store::{ContainerClaim, Store};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::fsutil::volatile_marker;
use crate::lowers::plan;
use crate::model::record::{Container, RootfsRecord};
use crate::model::{Flavour, Provider};
use crate::providers::pooled::pool::{self, PoolKind};
use crate::providers::{Attach, Made, Provide, ToMount, Undo, one_page, record_mounted};
use crate::uppers::isolated::{self, UpperPlan};

/// Mounts a new overlay of `flavour` (read-only if `read_only`) on the container's rootfs,
/// over an upper of its own filesystem when one is planned.
pub(crate) fn provide<'a>(
    cx: &Provide<'a, '_>,
    flavour: Flavour,
    read_only: bool,
) -> Result<Made<'a>, RootfsError> {
    let (store, mounter, options) = (cx.store, cx.mounter, cx.options);
    let mut model = cx.choice.model;
    model.provider = Provider::Fresh { flavour, read_only };
    let (claim, undo, claimed_from_pool) = match &cx.upper {
        Some(plan) => isolated_dirs(store, mounter, cx.id, plan)?,
        None => {
            let claim = store.create_container_dirs(cx.id)?;
            let undo = Undo::new(store, mounter, &claim.dirs, None);
            (claim, undo, false)
        }
    };
    let mut spec = plan::read_write(store, cx.chain_ids, &claim.dirs, flavour);
    spec.options
        .extend(options.extra_overlay_options.iter().cloned());
    spec.read_only = read_only;
    plan::own_idmap(&mut spec, options.idmap.as_ref());
    let mounts = !options.without_mount
        || (model.mounted_by_lamina_only() && options.mount_volatile_without_mount)
        || options.idmap.is_some();
    if mounts {
        mounter.mount_overlay(&spec, &claim.dirs.rootfs)?;
    }
    let mut rootfs = RootfsRecord::new(model, mounts, spec.option_strings());
    rootfs.upper_fs = cx.upper.map(|u| u.record());
    rootfs.idmap = options.idmap.clone();
    Ok(Made {
        claim,
        undo,
        to_mount: ToMount::Overlay(spec),
        rootfs,
        lease_in_flight: None,
        claimed_from_pool,
    })
}

/// An isolated container's directories with its own upper filesystem mounted: a ready
/// one claimed from the pool of bare uppers (then `true`), or a new one (mkfs, loop
/// attach, mount).
fn isolated_dirs<'a>(
    store: &'a Store,
    mounter: &'a dyn Mounter,
    id: &str,
    plan: &UpperPlan,
) -> Result<(ContainerClaim, Undo<'a>, bool), RootfsError> {
    if let Some((claim, _)) = pool::claim(store, mounter, &PoolKind::uppers(*plan), id)? {
        let undo = Undo::new(store, mounter, &claim.dirs, None);
        return Ok((claim, undo, true));
    }
    let mut claim = store.create_container_dirs(id)?;
    let undo = Undo::new(store, mounter, &claim.dirs, None);
    claim.dirs = isolated::make(mounter, &claim.dirs.base, plan)?;
    Ok((claim, undo, false))
}

/// Mounts an overlay container's rootfs again: refused if a volatile upper was not
/// cleanly unmounted; read-only if create mounted it read-only.
pub(crate) fn mount_again(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
    flavour: Flavour,
    read_only: bool,
) -> Result<(), RootfsError> {
    let dirs = container.dirs(store);
    if flavour.volatile && volatile_marker(&dirs.work).exists() {
        return Err(RootfsError::VolatileUnclean {
            id: container.id().into(),
        });
    }
    // The image's metadata image mounted again after a host restart, and built again
    // from the layers if it is gone (removed by hand, or by `check --verify --repair` as
    // damaged): under the layers lock, as a create builds it, so no clean takes its
    // objects before the image names them.
    let _layers_in_use = if flavour.composefs {
        let lock = store.use_layers()?;
        crate::lowers::composefs::mounted(store, mounter, &container.record.layers)?;
        Some(lock)
    } else {
        None
    };
    let mut spec = plan::read_write(store, &container.record.layers, &dirs, flavour);
    spec.read_only = read_only;
    plan::own_idmap(&mut spec, container.rootfs.idmap.as_ref());
    mounter.mount_overlay(&spec, &dirs.rootfs)?;
    container.rootfs.mount_options = spec.option_strings();
    record_mounted(store, container)
}

/// The overlay a caller mounts itself: rebuilt from the model, as `mount` does (the
/// options name host paths, and the ones a record holds are not trusted to be the
/// store's), its upper filesystem mounted again first if a host restart took it away.
pub(crate) fn attach(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<Attach, RootfsError> {
    let dirs = container.dirs(store);
    crate::uppers::mount_again(mounter, container, &dirs)?;
    let flavour = container.model().flavour().unwrap_or_default();
    let mut spec = plan::read_write(store, &container.record.layers, &dirs, flavour);
    spec.read_only = container.model().read_only();
    Ok(Attach::Overlay {
        options: one_page::options_for_one_page(store, spec)?,
    })
}
