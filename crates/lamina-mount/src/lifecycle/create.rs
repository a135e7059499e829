//! Creating a container rootfs: import the image, choose the strategies, provide the
//! rootfs (claim a pooled overlay, mount a fresh one, or bind a shared or flattened
//! read-only tree), record it — and undo every step if a later one fails, so a failed
//! create leaves no directory, record, lease or mount behind.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use lamina_image::{Digest, Image};
use lamina_store::{
    ContainerClaim, ContainerDirs, ContainerRecord, DiskLimitRecord, IdMap, Store, StoreError,
};
use lamina_sys::{DiskFs, Mounter, OverlaySpec};

use crate::choose::{Choice, Pools, Request, choose};
use crate::lifecycle::one_step::holding_id;
use crate::model::record::{self, Container, RootfsRecord};
use crate::model::{Flavor, Model, Provider};
use crate::providers::pooled::pool::PoolKind;
use crate::{
    DiskLimit, RootfsError, Strategies, UpperPlan, choose::probe, lowers::plan, providers::direct,
    providers::pooled::pool, providers::shared_ro, uppers::isolated,
};

/// Options for one create.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Leave mounting to the caller (Garden's `--without-mount`): record what to mount,
    /// mount nothing for the container.
    pub without_mount: bool,
    /// With `without_mount`, a pooled strategy still claims a ready pre-mounted overlay
    /// (the caller binds it: containerd's snapshotter), and the record says it is mounted.
    pub claim_pooled_without_mount: bool,
    /// With `without_mount`, a volatile or composefs overlay is still mounted by lamina
    /// (the caller binds it: containerd's snapshotter, which then need not know that a
    /// composefs overlay's lower must be mounted first). The kernel marks a volatile
    /// upper's work dir when it mounts it and refuses every later mount until the
    /// marker goes, which only lamina's own `unmount` does after a clean sync; an
    /// overlay the caller mounted and unmounted itself could never be mounted again (a
    /// task restart).
    pub mount_volatile_without_mount: bool,
    pub strategies: Strategies,
    pub read_only: bool,
    pub ephemeral: bool,
    /// Garden's `--disk-limit-size-bytes`: the most the container may use.
    pub disk_limit: Option<DiskLimit>,
    /// What isolated uppers on disk are formatted with.
    pub disk_fs: DiskFs,
    /// Overlay options appended to a freshly mounted read-write overlay: how benchmarks
    /// reproduce other kernels' behaviour here (`fsync=strict` is 6.12–6.14's).
    pub extra_overlay_options: Vec<(String, Option<String>)>,
    /// This container's own uid/gid mapping (containerd's `uidmapping`/`gidmapping`
    /// labels): its layers show through an idmapped mount of each, so files owned by 0
    /// in the image are the mapped root's. lamina mounts such an overlay itself, even
    /// with `without_mount`: an option string cannot carry an idmap.
    pub idmap: Option<IdMap>,
}

/// What `create` made.
#[derive(Debug, Clone)]
pub struct Created {
    pub container: Container,
    pub rootfs: PathBuf,
    /// What the caller mounts itself with `--without-mount`.
    pub to_mount: ToMount,
    /// Why these strategies (for `auto`, the reasoning; otherwise "requested").
    pub reason: String,
    /// Something was claimed from a pool (an overlay, or an isolated upper), which a
    /// refill should replace.
    pub claimed_from_pool: bool,
    /// `auto` served a deep image from its layers because its composefs metadata image
    /// is not built: the front-end builds it off this caller's path
    /// ([`crate::lowers::composefs::auto::build_for`] the container's layers), for later creates.
    pub build_metadata_image: bool,
}

/// The mount a `--without-mount` caller makes on the rootfs path.
#[derive(Debug, Clone)]
pub enum ToMount {
    Overlay(OverlaySpec),
    /// A read-only bind of this directory.
    Bind(PathBuf),
}

/// What a container's rootfs is built from.
#[derive(Debug, Clone, Copy)]
pub enum Layers<'a> {
    /// An image: the layers the store lacks are imported first.
    Image(&'a Image),
    /// Layers already in the store, such as a containerd snapshot's parents.
    Stored(&'a StoredLayers),
}

/// Layers already in the store, and what the container record says they came from.
#[derive(Debug, Clone)]
pub struct StoredLayers {
    /// Recorded as the container's image.
    pub source: String,
    /// Chain IDs (layer names), bottom-most first; at least one.
    pub chain_ids: Vec<Digest>,
}

impl Layers<'_> {
    fn chain_ids(&self) -> Vec<Digest> {
        match self {
            Layers::Image(image) => image.chain_ids(),
            Layers::Stored(stored) => stored.chain_ids.clone(),
        }
    }

    /// Makes sure every layer is in the store; the caller holds the layers-in-use lock.
    fn ensure(&self, store: &Store) -> Result<Vec<Digest>, StoreError> {
        match self {
            Layers::Image(image) => store.import(image),
            Layers::Stored(stored) => {
                if let Some(missing) = stored.chain_ids.iter().find(|c| !store.has_layer(c)) {
                    return Err(StoreError::LayerMissing(missing.to_string()));
                }
                Ok(stored.chain_ids.clone())
            }
        }
    }
}

/// Creates container `id` from `image`.
pub fn create(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    id: &str,
    options: &CreateOptions,
) -> Result<Created, RootfsError> {
    create_from(store, mounter, Layers::Image(image), id, options)
}

/// Creates container `id` from `layers`.
pub fn create_from(
    store: &Store,
    mounter: &dyn Mounter,
    layers: Layers<'_>,
    id: &str,
    options: &CreateOptions,
) -> Result<Created, RootfsError> {
    // Held for the whole create, import included: a delete of this ID that arrives
    // meanwhile (Garden's, after a create timed out) waits and then deletes what this made.
    holding_id(store, id, || {
        // Fail a duplicate before spending time on import; publishing the directory
        // below is the real claim.
        if store.container_exists(id) {
            return Err(StoreError::AlreadyExists(id.into()).into());
        }
        create_locked(store, mounter, layers, id, options)
    })
}

/// [`create_from`] once the ID is held and free.
fn create_locked(
    store: &Store,
    mounter: &dyn Mounter,
    layers: Layers<'_>,
    id: &str,
    options: &CreateOptions,
) -> Result<Created, RootfsError> {
    let request = Request::on_store(
        store,
        mounter,
        options.strategies,
        options.read_only,
        options.ephemeral,
        options.disk_limit.is_some(),
    );
    if options.without_mount && request.idmapped_layers {
        return Err(RootfsError::WithoutMountIdmapped);
    }
    // The upper a create would make: sized by its disk limit when the layers it needs to
    // measure the image are in the store (they are whenever a pool of them is), so pool
    // readiness is judged for the size this create would claim.
    let planned_upper = |backend, chain_ids: &[Digest]| {
        isolated::plan_for(
            store,
            chain_ids,
            backend,
            options.disk_limit,
            options.disk_fs,
        )
        .unwrap_or_else(|_| UpperPlan::new(backend, None, options.disk_fs))
    };
    let choice =
        if request.strategies == Strategies::CLASSIC && !request.ephemeral && !request.disk_limit {
            // Classic needs nothing probed: GrootFS's path stays free of the probe's cost.
            Choice {
                model: Model::named(Strategies::CLASSIC, request.read_only)
                    .map_err(RootfsError::Refused)?,
                reason: "requested".into(),
                named: true,
                build_metadata_image: false,
            }
        } else {
            let probe = probe::probe(store, mounter, false).map_err(RootfsError::Probe)?;
            let chain_ids = layers.chain_ids();
            let pools = Pools {
                overlay_ready: &|flavor: Flavor| {
                    let upper = flavor.isolated.map(|b| planned_upper(b, &chain_ids));
                    pool::ready(store, &PoolKind::overlays(&chain_ids, flavor, upper))
                },
                upper_ready: &|backend| {
                    pool::ready(store, &PoolKind::uppers(planned_upper(backend, &chain_ids)))
                },
            };
            let request = Request {
                metadata_image: if request.strategies.auto {
                    crate::lowers::composefs::auto::state(store, &chain_ids)
                } else {
                    request.metadata_image
                },
                caller_mounts: options.without_mount && !options.mount_volatile_without_mount,
                ..request
            };
            choose(&request, &probe, chain_ids.len(), &pools)?
        };
    let choice = match options.idmap {
        Some(_) => crate::choose::for_own_idmap(choice)?,
        None => choice,
    };
    // Before any layer is fetched: a refusal should not cost the caller a pull.
    let composefs = choice.model.flavor().is_some_and(|f| f.composefs);
    if composefs {
        refuse_composefs_where_it_cannot_serve(&request, options)?;
    }
    // Pool slots are mounted read-write overlays (`choose` refuses a read-only pooled):
    // a named `pooled` is served from the pool of its flavor (see `overlay`) or
    // refused, never replaced.
    if choice.named
        && matches!(choice.model.provider, Provider::Pooled { .. })
        && options.without_mount
        && !options.claim_pooled_without_mount
    {
        return Err(RootfsError::PoolWithoutMount);
    }
    // Held until this function returns, after the record names the layers: layer
    // collection never takes a layer from under a create.
    let _layers_in_use = store.use_layers()?;
    let chain_ids = layers.ensure(store)?;
    store.pause_point("create-imported");
    let choice = if composefs && !choice.named {
        // auto's: the image was built when auto looked; it is never built here, and if
        // it is gone (collected since) or fails to mount, this create uses the layers
        // (review finding: a damaged image failed every default create).
        let top = chain_ids.last().expect("an image has layers");
        match crate::lowers::composefs::mounted_if_built(store, mounter, top) {
            Ok(Some(_)) => choice,
            Ok(None) => crate::lowers::composefs::auto::over_the_layers(
                store,
                &chain_ids,
                choice,
                &RootfsError::Refused("collected since".into()),
            )?,
            Err(e) => {
                crate::lowers::composefs::auto::over_the_layers(store, &chain_ids, choice, &e)?
            }
        }
    } else {
        if composefs {
            crate::lowers::composefs::mounted(store, mounter, &chain_ids)?;
        }
        choice
    };
    let upper = choice
        .model
        .flavor()
        .and_then(|f| f.isolated)
        .map(|backend| {
            isolated::plan_for(
                store,
                &chain_ids,
                backend,
                options.disk_limit,
                options.disk_fs,
            )
        })
        .transpose()?;

    let made = match choice.model.provider {
        Provider::SharedRo => bind_shared(
            store,
            mounter,
            &chain_ids,
            id,
            &choice,
            options.without_mount,
        )?,
        Provider::Direct => {
            let source = direct::source(store, &chain_ids)?;
            let claim = store.create_container_dirs(id)?;
            bind_dir(
                store,
                mounter,
                claim,
                source,
                None,
                &choice,
                options.without_mount,
            )?
        }
        Provider::Fresh { .. } | Provider::Pooled { .. } => {
            overlay(store, mounter, &chain_ids, id, &choice, upper, options)?
        }
    };
    store.pause_point("create-provided");
    let Made {
        claim,
        mut undo,
        to_mount,
        rootfs,
        claimed_from_pool,
        _lease_in_flight,
    } = made;

    let record = ContainerRecord {
        id: id.to_string(),
        image: match layers {
            Layers::Image(image) => image.source.clone(),
            Layers::Stored(stored) => stored.source.clone(),
        },
        // A snapshot's layers have no image config: its top layer stands in.
        image_id: match layers {
            Layers::Image(image) => image.config_digest.clone(),
            Layers::Stored(_) => chain_ids.last().cloned().unwrap_or_else(|| Digest::of(&[])),
        },
        layers: chain_ids,
        env: match layers {
            Layers::Image(image) => image.env(),
            Layers::Stored(_) => Vec::new(),
        },
        created_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        disk_limit: options.disk_limit.map(|limit| DiskLimitRecord {
            bytes: limit.bytes,
            exclude_image: limit.exclude_image,
        }),
        rootfs: Default::default(),
    };
    let container = Container { record, rootfs };
    record::write_new(store, &container)?;
    undo.armed = false;
    tracing::info!(
        id,
        strategy = %container.model(),
        why = %choice.reason,
        read_only = container.model().read_only(),
        layers = container.record.layers.len(),
        mounted = container.rootfs.mounted,
        "created rootfs"
    );
    Ok(Created {
        container,
        rootfs: claim.dirs.rootfs.clone(),
        to_mount,
        reason: choice.reason,
        claimed_from_pool,
        build_metadata_image: choice.build_metadata_image,
    })
}

/// composefs's metadata image is one EROFS mount per image, shared by every container
/// of it: it is not idmapped.
fn refuse_composefs_where_it_cannot_serve(
    request: &Request,
    options: &CreateOptions,
) -> Result<(), RootfsError> {
    if request.idmapped_layers || options.idmap.is_some() {
        return Err(RootfsError::Refused(
            "strategy `composefs` does not idmap its metadata image: use it in a store that does not idmap layers, without an idmap of the container's own".into(),
        ));
    }
    Ok(())
}

/// A provided rootfs, before its record is written.
struct Made<'a> {
    claim: ContainerClaim,
    undo: Undo<'a>,
    to_mount: ToMount,
    /// What the record says of the rootfs.
    rootfs: RootfsRecord,
    /// shared-ro: the lease stays flocked until the record naming it is written.
    _lease_in_flight: Option<shared_ro::Acquired>,
    claimed_from_pool: bool,
}

fn overlay<'a>(
    store: &'a Store,
    mounter: &'a dyn Mounter,
    chain_ids: &[Digest],
    id: &str,
    choice: &Choice,
    upper: Option<UpperPlan>,
    options: &CreateOptions,
) -> Result<Made<'a>, RootfsError> {
    let without_mount = options.without_mount;
    let mut model = choice.model;
    let (flavor, read_only) = match model.provider {
        Provider::Fresh { flavor, read_only } => (flavor, read_only),
        Provider::Pooled { flavor } => (flavor, false),
        Provider::SharedRo | Provider::Direct => unreachable!("binds are not overlays"),
    };
    let upper_fs = upper.map(|u| u.record());
    if matches!(model.provider, Provider::Pooled { .. })
        && (!without_mount || options.claim_pooled_without_mount)
    {
        let kind = PoolKind::overlays(chain_ids, flavor, upper);
        if let Some((claim, mount_options)) = pool::claim(store, mounter, &kind, id)? {
            let spec = plan::read_write(store, chain_ids, &claim.dirs, flavor);
            let undo = Undo::new(store, mounter, &claim.dirs, None);
            // A claimed pool overlay is mounted whatever the caller mounts.
            let mut rootfs = RootfsRecord::new(model, true, mount_options);
            rootfs.upper_fs = upper_fs;
            return Ok(Made {
                claim,
                undo,
                to_mount: ToMount::Overlay(spec),
                rootfs,
                _lease_in_flight: None,
                claimed_from_pool: true,
            });
        }
        if choice.named {
            // The operator asked for a pooled overlay; another create took the last slot
            // between the check and the claim. Said, never silently replaced.
            return Err(RootfsError::PoolEmpty {
                flavor: flavor.to_string(),
            });
        }
        tracing::info!(id, "pool is empty: mounting a fresh overlay");
    }
    model.provider = Provider::Fresh { flavor, read_only };
    let (claim, undo, claimed_from_pool) = match &upper {
        Some(plan) => isolated_dirs(store, mounter, id, plan)?,
        None => {
            let claim = store.create_container_dirs(id)?;
            let undo = Undo::new(store, mounter, &claim.dirs, None);
            (claim, undo, false)
        }
    };
    let mut spec = plan::read_write(store, chain_ids, &claim.dirs, flavor);
    spec.options
        .extend(options.extra_overlay_options.iter().cloned());
    // `--read-only` with an overlay strategy: the same overlay, mounted read-only.
    spec.read_only = read_only;
    plan::own_idmap(&mut spec, options.idmap.as_ref());
    let mounts = !without_mount
        || ((flavor.volatile || flavor.composefs) && options.mount_volatile_without_mount)
        || options.idmap.is_some();
    if mounts {
        mounter.mount_overlay(&spec, &claim.dirs.rootfs)?;
    }
    let mut rootfs = RootfsRecord::new(model, mounts, spec.option_strings());
    rootfs.upper_fs = upper_fs;
    rootfs.idmap = options.idmap.clone();
    Ok(Made {
        claim,
        undo,
        to_mount: ToMount::Overlay(spec),
        rootfs,
        _lease_in_flight: None,
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

fn bind_shared<'a>(
    store: &'a Store,
    mounter: &'a dyn Mounter,
    chain_ids: &[Digest],
    id: &str,
    choice: &Choice,
    without_mount: bool,
) -> Result<Made<'a>, RootfsError> {
    let acquired = shared_ro::acquire(store, mounter, chain_ids)?;
    let claim = match store.create_container_dirs(id) {
        Ok(claim) => claim,
        Err(e) => {
            shared_ro::release(store, mounter, &acquired.lease)?;
            return Err(e.into());
        }
    };
    let mut made = bind_dir(
        store,
        mounter,
        claim,
        acquired.rootfs.clone(),
        Some(acquired.lease.clone()),
        choice,
        without_mount,
    )?;
    made._lease_in_flight = Some(acquired);
    Ok(made)
}

/// A read-only bind of `source` as the rootfs (shared-ro, direct); a failed create
/// releases `lease`.
fn bind_dir<'a>(
    store: &'a Store,
    mounter: &'a dyn Mounter,
    claim: ContainerClaim,
    source: PathBuf,
    lease: Option<PathBuf>,
    choice: &Choice,
    without_mount: bool,
) -> Result<Made<'a>, RootfsError> {
    let undo = Undo::new(store, mounter, &claim.dirs, lease.clone());
    if !without_mount {
        mounter.bind_read_only(&source, &claim.dirs.rootfs)?;
    }
    let mut rootfs = RootfsRecord::new(
        choice.model,
        !without_mount,
        vec!["bind".into(), "ro".into()],
    );
    rootfs.bind_source = Some(source.clone());
    rootfs.lease = lease;
    Ok(Made {
        claim,
        undo,
        to_mount: ToMount::Bind(source),
        rootfs,
        _lease_in_flight: None,
        claimed_from_pool: false,
    })
}

/// Rolls a failed create back: unmount whatever was mounted in the container's
/// directory (its overlay, its own upper filesystem), remove the directory, drop the
/// lease taken.
struct Undo<'a> {
    store: &'a Store,
    mounter: &'a dyn Mounter,
    base: PathBuf,
    lease: Option<PathBuf>,
    armed: bool,
}

impl<'a> Undo<'a> {
    fn new(
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
