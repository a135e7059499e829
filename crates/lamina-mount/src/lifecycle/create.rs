//! Creating a container rootfs: import the image, choose the strategies, provide the
//! rootfs (claim a pooled overlay, mount a fresh one, or bind a shared or flattened
//! read-only tree), record it — and undo every step if a later one fails, so a failed
//! create leaves no directory, record, lease or mount behind.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use lamina_image::{Digest, Image};
use lamina_store::{ContainerRecord, DiskLimitRecord, Store, StoreError};
use lamina_sys::Mounter;

use crate::choose::probe;
use crate::choose::{Choice, Pools, Request, choose};
use crate::lifecycle::one_step::holding_id;
use crate::model::Model;
use crate::model::record::{self, Container};
use crate::providers::{self, CreateOptions, Made, Provide, ToMount, pooled};
use crate::{RootfsError, Strategies};

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
    /// refill should replace ([`FollowUp::RefillPools`] says so to the front-ends).
    pub claimed_from_pool: bool,
    /// What is left to do off the caller's path, in the order to start it: a refill, and
    /// when `auto` served a deep image from its layers because its composefs metadata
    /// image is not built, that build
    /// ([`crate::lowers::composefs::auto::build_for`] the container's layers).
    pub follow_ups: Vec<FollowUp>,
}

/// Work a create leaves for later, off its caller's path. Each front-end carries out
/// every kind, in its own way of running background work (the CLI a child process, the
/// daemon a task or thread), and decides nothing about strategies from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowUp {
    /// A claim left a pool one short: refill the store's pools to their standing size.
    RefillPools,
    /// Build the composefs metadata image of `chain_ids` (bottom first) for the creates
    /// after this one. `imported`: each layer is the chain ID of its diff ID on the one
    /// below (layers an image import made), so a separate `lamina build-metadata-image`
    /// process, which builds nothing else, may be handed the list; layers containerd
    /// committed are built in the process that holds them.
    BuildMetadataImage {
        chain_ids: Vec<Digest>,
        imported: bool,
    },
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

    /// Makes sure every layer is in the store, or kept pending by `model`'s provider
    /// (`providers::import`); the caller holds the layers-in-use lock.
    fn ensure(&self, store: &Store, model: &Model) -> Result<Vec<Digest>, StoreError> {
        match self {
            Layers::Image(image) => providers::import(store, image, model),
            Layers::Stored(stored) => {
                // Pending layers came with the choice of their provider (`choice`).
                for c in &stored.chain_ids {
                    if store.has_layer(c) {
                        continue;
                    }
                    if !providers::is_pending_layer(store, c) {
                        return Err(StoreError::LayerMissing(c.to_string()));
                    }
                    providers::refuse_bad_pending(store, c)?;
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
    lamina_store::validate_new_id(id)?;
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
    let choice = choice(store, mounter, &layers, request, options)?;
    providers::admit(&choice, request.idmapped_layers, options)?;
    // Held until this function returns, after the record names the layers: layer
    // collection never takes a layer from under a create.
    let _layers_in_use = store.use_layers()?;
    let chain_ids = layers.ensure(store, &choice.model)?;
    store.pause_point("create-imported");
    let choice = crate::lowers::prepare(store, mounter, &chain_ids, choice)?;
    let upper = crate::uppers::plan(
        store,
        &chain_ids,
        choice.model.upper_backend(),
        options.disk_limit,
        options.disk_fs,
    )?;
    let made = providers::provide(&Provide {
        store,
        mounter,
        chain_ids: &chain_ids,
        id,
        choice: &choice,
        upper,
        options,
    })?;
    store.pause_point("create-provided");
    let Made {
        claim,
        mut undo,
        to_mount,
        rootfs,
        claimed_from_pool,
        lease_in_flight: _lease_in_flight,
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
    let mut follow_ups = Vec::new();
    if claimed_from_pool {
        follow_ups.push(FollowUp::RefillPools);
    }
    if choice.build_metadata_image {
        let chain_ids = container.record.layers.clone();
        let imported =
            crate::lowers::composefs::auto::is_imported_chain(store, &chain_ids).unwrap_or(false);
        follow_ups.push(FollowUp::BuildMetadataImage {
            chain_ids,
            imported,
        });
    }
    Ok(Created {
        container,
        rootfs: claim.dirs.rootfs.clone(),
        to_mount,
        reason: choice.reason,
        claimed_from_pool,
        follow_ups,
    })
}

/// What this create will provide: `classic` as named (no probe: GrootFS's path stays
/// free of its cost), anything else chosen against the probe and the pools, then
/// narrowed for a container with an idmap of its own.
fn choice(
    store: &Store,
    mounter: &dyn Mounter,
    layers: &Layers<'_>,
    request: Request,
    options: &CreateOptions,
) -> Result<Choice, RootfsError> {
    let choice = if let Some(pending) = pending_stored_layer(store, layers) {
        providers::for_pending_chain(&request, &pending)?
    } else if request.strategies == Strategies::CLASSIC && !request.ephemeral && !request.disk_limit
    {
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
        let ready = pooled::Ready {
            store,
            chain_ids: &chain_ids,
            disk_limit: options.disk_limit,
            disk_fs: options.disk_fs,
        };
        let pools = Pools {
            overlay_ready: &|flavour| ready.overlays(flavour),
            upper_ready: &|backend| ready.uppers(backend),
        };
        let request = Request {
            metadata_image: if request.strategies.auto {
                crate::lowers::composefs::auto::state(store, &chain_ids)
            } else {
                request.metadata_image
            },
            caller_mounts: options.without_mount && !options.mount_volatile_without_mount,
            served_on_demand: request.strategies.auto
                && options.idmap.is_none()
                && matches!(layers, Layers::Image(image) if providers::served_on_demand(store, image)),
            ..request
        };
        choose(&request, &probe, chain_ids.len(), &pools)?
    };
    let mut choice = match options.idmap {
        Some(_) => crate::choose::for_own_idmap(choice)?,
        None => choice,
    };
    if options.remake {
        choice.model = choice.model.remade();
    }
    Ok(choice)
}

/// A stored layer a provider keeps pending (a containerd remote snapshot's, not yet
/// whole), if any: only that provider serves the chain.
fn pending_stored_layer(store: &Store, layers: &Layers<'_>) -> Option<Digest> {
    let Layers::Stored(stored) = layers else {
        return None;
    };
    providers::pending_layers(store, &stored.chain_ids)
        .into_iter()
        .next()
}
