//! The snapshotter itself, synchronous and independent of gRPC: containerd's snapshot
//! model mapped onto lamina's store.
//!
//! - A **committed** snapshot is a store layer. Committed from an image unpack it is named
//!   by its chain ID (the `containerd.io/snapshot.ref` label), exactly as `lamina create`
//!   names the layer, so the two share layers; otherwise by a digest lamina makes up.
//! - An **active** snapshot or a **view** is a container under `images/snap-<n>`, made by
//!   the same `create` as Garden's containers, so every strategy applies. lamina mounts
//!   nothing it need not: containerd gets the overlay to mount (with metacopy, volatile,
//!   an isolated upper as chosen), a bind of a pooled overlay lamina claimed ready-mounted,
//!   or a read-only bind of the shared image mount, the flattened tree or the layer.
//!
//! Every call that changes anything takes the store's snapshot lock, so changes are
//! serial across threads and processes; each change to the metadata is one transaction
//! of the store's snapshot index, touching only the rows it names.

use lamina_snapshot_index::{SnapshotIndex, SnapshotKind, SnapshotRecord, StoreSnapshots};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use lamina_image::Digest;
use lamina_mount::{Attach, CreateOptions, FollowUp, Layers, StoredLayers, Strategies};
use lamina_store::{IdMap, Store};
use lamina_sys::Mounter;

use crate::SnapshotError;

/// Picks the strategy of one snapshot (`auto`, `shared-ro`, `pooled,volatile`, …).
pub const STRATEGY_LABEL: &str = "containerd.io/snapshot/lamina.strategy";
/// `true` marks a container whose writes need not survive a crash: volatile upper.
pub const EPHEMERAL_LABEL: &str = "containerd.io/snapshot/lamina.ephemeral";
/// The chain ID an unpack is about to extract (the store indexes it).
pub use lamina_snapshot_index::REF_LABEL;
/// containerd's hard limit, in bytes, on what an active snapshot may write.
pub const MAX_SIZE_LABEL: &str = "containerd.io/snapshot/max-size";
/// A user-namespaced container's uid mapping, `CTR:HOST:LEN[,…]` (containerd 2.x's
/// `remap-ids` capability): the snapshot shows its layers with ids shifted by it.
pub const UIDMAPPING_LABEL: &str = "containerd.io/snapshot/uidmapping";
/// Its gid mapping, in the same form; given together with [`UIDMAPPING_LABEL`].
pub const GIDMAPPING_LABEL: &str = "containerd.io/snapshot/gidmapping";

/// Prefix of the container IDs of snapshots.
pub(crate) const CONTAINER_PREFIX: &str = "snap-";
/// How a snapshot's container record names its source (`containerd snapshot <key>`).
const SOURCE_PREFIX: &str = "containerd snapshot ";

/// The number in a snapshot container's ID (`snap-<n>`).
pub(crate) fn container_number(id: &str) -> Option<u64> {
    id.strip_prefix(CONTAINER_PREFIX)?.parse().ok()
}

/// Whether `container` is a snapshot's, not a Garden container that happens to be
/// called `snap-…`: its ID and the source its record names both say so.
pub(crate) fn is_snapshot_container(container: &lamina_mount::record::Container) -> bool {
    container.id().starts_with(CONTAINER_PREFIX)
        && container.record.image.starts_with(SOURCE_PREFIX)
}

/// One mount, as containerd's `types.Mount` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// containerd's snapshots service over one lamina store.
#[derive(Debug, Clone)]
pub struct Snapshotter {
    pub(crate) store: Store,
    pub(crate) mounter: Arc<dyn Mounter>,
    /// For snapshots without a strategy label (not unpacks: those are always classic).
    pub(crate) default_strategies: Strategies,
    /// The strategies a `lamina.strategy` label may name (`None`: every one), which the
    /// operator sets: through CRI a pod author sets the label.
    label_strategies: Option<std::collections::BTreeSet<String>>,
    /// One connection, shared by the server's threads; each use holds it for one query
    /// or one transaction, so reads are not held up behind a slow Prepare.
    index: Arc<Mutex<SnapshotIndex>>,
    /// What it did since it was opened, for the daemon's metrics.
    pub(crate) activity: crate::metrics::Activity,
    /// Usage answers that cost a walk, reused for a while.
    pub(crate) usage_cache: Arc<crate::usage_cache::UsageCache>,
    /// Mounts answers, given again while the container's record is unchanged.
    pub(crate) attach_cache: Arc<lamina_mount::AttachCache>,
    /// Remote snapshots (`None`: the daemon serves none; see `remote.rs`).
    pub(crate) remote: Option<Arc<crate::remote::Remote>>,
}

impl Snapshotter {
    /// Opens the snapshotter on `store`, finishing or undoing whatever a crash left.
    pub fn open(
        store: Store,
        mounter: Arc<dyn Mounter>,
        default_strategies: Strategies,
    ) -> Result<Self, SnapshotError> {
        if store.properties().mapped() {
            return Err(SnapshotError::FailedPrecondition(format!(
                "store {} maps uids and gids; containerd writes and mounts snapshots unmapped, so the snapshotter needs a store without --uid-mapping/--gid-mapping",
                store.root().display()
            )));
        }
        let mut opened = store.snapshots()?;
        if opened.fresh() {
            let legacy = store.layout().snapshot_metadata();
            if let Err(refused) = refuse_unrecorded_containers(&store) {
                // An earlier release must not take this store for one without snapshots.
                opened.write_tombstone(&legacy)?;
                return Err(refused);
            }
            opened.settle(&legacy)?;
        }
        let index = Arc::new(Mutex::new(opened));
        let snapshotter = Snapshotter {
            store,
            mounter,
            default_strategies,
            label_strategies: None,
            index,
            activity: Default::default(),
            usage_cache: Default::default(),
            attach_cache: Default::default(),
            remote: None,
        };
        snapshotter.recover()?;
        Ok(snapshotter)
    }

    /// Only `names` (strategy names, as `--strategy` takes them) may a snapshot's
    /// `lamina.strategy` label name; the daemon's own default is not bound by them.
    pub fn with_label_strategies(
        mut self,
        names: std::collections::BTreeSet<String>,
    ) -> Result<Self, SnapshotError> {
        if let Some(unknown) = names
            .iter()
            .find(|n| !lamina_mount::model::strategy::NAMES.contains(&n.as_str()))
        {
            return Err(SnapshotError::InvalidArgument(format!(
                "unknown strategy `{unknown}` (available: {})",
                lamina_mount::model::strategy::NAMES.join(", ")
            )));
        }
        self.label_strategies = Some(names);
        Ok(self)
    }

    /// An active snapshot's upper takes the owner of its parent's root, as containerd's
    /// overlayfs gives it: an overlay's root shows its upper's owner, and a container in a
    /// user namespace (`ctr run --uidmap` on an image chowned for it) could not write its
    /// own root if that were always root's. Only for an upper containerd mounts (an
    /// `upperdir=` option); an idmapped snapshot lamina mounts has its owner already.
    fn upper_owned_as_parent(
        &self,
        kind: SnapshotKind,
        chain: &[Digest],
        mounts: Vec<MountSpec>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        let Some(top) = chain.last().filter(|_| kind == SnapshotKind::Active) else {
            return Ok(mounts);
        };
        let owner = self.root_owner(top)?;
        if owner == (0, 0) {
            return Ok(mounts);
        }
        let upper = mounts
            .iter()
            .flat_map(|m| m.options.iter())
            .find_map(|o| o.strip_prefix("upperdir="));
        if let Some(upper) = upper {
            let upper = std::path::Path::new(upper);
            self.store
                .host()
                .chown(lamina_sys::At::Path(upper), owner.0, owner.1)
                .map_err(|e| lamina_store::StoreError::errno("owning", upper)(e))?;
        }
        Ok(mounts)
    }

    /// The owner (uid, gid) of layer `top`'s root directory.
    fn root_owner(&self, top: &Digest) -> Result<(u32, u32), SnapshotError> {
        let root = lamina_mount::layer_tree(&self.store, top);
        let meta = std::fs::symlink_metadata(&root)
            .map_err(lamina_store::StoreError::io("reading the owner of", &root))?;
        use std::os::unix::fs::MetadataExt;
        Ok((meta.uid(), meta.gid()))
    }

    /// Whether the image under `chain` was already chowned for `map`: containerd does
    /// that to a copy of the image (its slow-chown path) when the proxy's config lists no
    /// `remap-ids`, committed as a layer over the image's, and still passes the mapping
    /// labels, which lamina must then not apply a second time. Its sign is a top layer
    /// whose root is owned by the mapping of the owner of the root below it; an image
    /// whose own layers differ so cannot be told apart, and shows its files unmapped.
    fn chowned_for(&self, map: &IdMap, chain: &[Digest]) -> Result<bool, SnapshotError> {
        let [.., below, top] = chain else {
            return Ok(false);
        };
        let (uid, gid) = self.root_owner(below)?;
        let host = |ranges: &[lamina_store::IdMapping], id: u32| {
            ranges.iter().find_map(|range| range.to_host(id))
        };
        let (Some(host_uid), Some(host_gid)) = (host(&map.uids, uid), host(&map.gids, gid)) else {
            return Ok(false);
        };
        Ok((host_uid, host_gid) != (uid, gid) && self.root_owner(top)? == (host_uid, host_gid))
    }

    /// Refuses a `lamina.strategy` label naming a strategy the operator did not allow.
    fn check_strategy_label(&self, labels: &BTreeMap<String, String>) -> Result<(), SnapshotError> {
        let (Some(allowed), Some(list)) = (&self.label_strategies, labels.get(STRATEGY_LABEL))
        else {
            return Ok(());
        };
        if let Some(name) = list
            .split(',')
            .map(str::trim)
            .find(|n| !allowed.contains(*n))
        {
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            return Err(SnapshotError::InvalidArgument(format!(
                "{STRATEGY_LABEL}: strategy `{}` is not one a label may choose on this node (the daemon's label strategies: {})",
                lamina_image::shown(name),
                allowed.join(", ")
            )));
        }
        Ok(())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The snapshot index, for one query or transaction.
    pub(crate) fn index(&self) -> MutexGuard<'_, SnapshotIndex> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn prepare(
        &self,
        key: &str,
        parent: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        self.create_snapshot(SnapshotKind::Active, key, parent, labels)
    }

    pub fn view(
        &self,
        key: &str,
        parent: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        self.create_snapshot(SnapshotKind::View, key, parent, labels)
    }

    fn create_snapshot(
        &self,
        kind: SnapshotKind,
        key: &str,
        parent: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<MountSpec>, SnapshotError> {
        if key.is_empty() {
            return Err(SnapshotError::InvalidArgument(
                "a snapshot key must not be empty".into(),
            ));
        }
        crate::label_bounds::check(key, &labels)?;
        self.check_strategy_label(&labels)?;
        let parent = (!parent.is_empty()).then(|| parent.to_string());
        let extraction = kind == SnapshotKind::Active && extraction_target(key, &labels).is_some();
        let for_rebase = crate::rebase::unpacks_for_rebase(kind, key, parent.as_deref(), &labels);
        // Made before the lock: it talks to the registry.
        let remote = match extraction && !for_rebase {
            true => self.remote_layer(key, parent.as_deref(), &labels),
            false => None,
        };
        let _lock = self.store.lock_snapshots()?;
        // Held until the metadata names the layers: collection never takes them meanwhile.
        let _layers_in_use = self.store.use_layers()?;
        if self.name_taken(key, None)? {
            return Err(SnapshotError::AlreadyExists(key.into()));
        }
        let chain = match &parent {
            Some(p) => layer_chain(&self.index(), p)?,
            None => Vec::new(),
        };
        // A layer already stored is reused only on its own chain, which an unpack for
        // rebase does not name until its commit.
        if let Some(chain_id) = remote {
            let target = chain_id.to_string();
            if !self.index().has_committed(parent.as_deref(), &target)? {
                self.commit_remote(key, parent.as_deref(), chain_id, labels)?;
            }
            return Err(SnapshotError::AlreadyExists(target));
        }
        if extraction
            && !for_rebase
            && labels.contains_key(REF_LABEL)
            && self.reuse_layer(key, parent.as_deref(), &chain, &labels)?
        {
            return Err(SnapshotError::AlreadyExists(labels[REF_LABEL].clone()));
        }

        let now = now_ns();
        let shape = crate::rebuild::Shape {
            labels: labels.clone(),
            default_strategies: self.default_strategies.to_string(),
            created_ns: now,
        };
        let (number, id) = self.make_numbered(key, kind, &chain, &shape, false)?;
        // What containerd will mount is worked out before the snapshot is recorded: a
        // chain too deep for one page of mount options is refused and leaves nothing.
        let mounts = match self
            .mounts_of(&id)
            .and_then(|mounts| self.upper_owned_as_parent(kind, &chain, mounts))
            .map(|mounts| match for_rebase {
                true => crate::rebase::as_upper_only_overlay(mounts),
                false => mounts,
            }) {
            Ok(mounts) => mounts,
            Err(e) => {
                let _ = self.delete_container(&id);
                return Err(e);
            }
        };
        let record = SnapshotRecord {
            kind,
            parent,
            labels,
            created_ns: now,
            updated_ns: now,
            layer: None,
            container: Some(id.clone()),
            committing: None,
        };
        // The row alone is synced: the database's sync flushes its own log, which
        // commits none of the directories the container is made of, so a power cut can
        // keep the row and lose the container. Recovery makes such a container again from
        // the row (`rebuild.rs`), as it was when this returned: an empty upper on the
        // snapshot's parent. Syncing the container first cost a journal commit per
        // Prepare, most of the call.
        let inserted = self
            .index()
            .insert_numbered(key, &record, number, &shape.encode());
        if let Err(e) = inserted {
            let _ = self.delete_container(&id);
            return Err(e.into());
        }
        tracing::info!(key, container = %id, kind = kind.as_str(), "prepared snapshot");
        Ok(mounts)
    }

    /// [`Snapshotter::make_container`] under the next container number nobody holds;
    /// returns the number and the container's name. A directory already there, or a
    /// `lamina create` of that name in flight (the making fails as taken), is someone
    /// else's — Garden's `snap-N` — and the next number is tried, so a Garden container at
    /// the next number fails no Prepare. A number past the database's next is reserved
    /// before the container is made, so a crash before its row names it leaves a container
    /// numbered below the counter, which the next start removes as unnamed rather than
    /// taking the database for older than the store.
    pub(crate) fn make_numbered(
        &self,
        key: &str,
        kind: SnapshotKind,
        chain: &[Digest],
        shape: &crate::rebuild::Shape,
        again: bool,
    ) -> Result<(u64, String), SnapshotError> {
        let mut number = 0;
        for _ in 0..64 {
            number = self.free_number(number)?;
            let id = format!("{CONTAINER_PREFIX}{number}");
            match self.make_container(&id, key, kind, chain, shape, again) {
                Ok(()) => return Ok((number, id)),
                Err(SnapshotError::Rootfs(lamina_mount::RootfsError::Store(
                    lamina_store::StoreError::AlreadyExists(_),
                ))) => number += 1,
                Err(e) => return Err(e),
            }
        }
        Err(SnapshotError::FailedPrecondition(format!(
            "no free container number: 64 taken up to {CONTAINER_PREFIX}{number}"
        )))
    }

    /// The first container number from `from` with no directory, reserved (the counter
    /// moved past it) if it is past the database's next number.
    pub(crate) fn free_number(&self, from: u64) -> Result<u64, SnapshotError> {
        let next = self.index().next_container_number()?;
        let mut number = from.max(next);
        while self
            .store
            .layout()
            .container(&format!("{CONTAINER_PREFIX}{number}"))
            .exists()
        {
            number += 1;
        }
        if number != next {
            self.index().reserve_numbers_to(number)?;
        }
        Ok(number)
    }

    /// Whether container `id`, which snapshot `key`'s row names, is that snapshot's by
    /// its record. A Garden container made under the name of one a crash lost (`lamina
    /// create snap-7` before the daemon restarted) is not, and is never answered,
    /// committed or removed for the snapshot. A missing or unreadable record holds
    /// nothing of anyone else's that this could protect.
    pub(crate) fn owns(&self, key: &str, id: &str) -> bool {
        match lamina_mount::record::read(&self.store, id) {
            Ok(container) => container.record.image == format!("{SOURCE_PREFIX}{key}"),
            Err(_) => true,
        }
    }

    /// Makes container `id` for snapshot `key` of `kind` on the layers `chain` (none: an
    /// empty directory), as `shape` asks: its labels, and the daemon's default strategies
    /// for a snapshot without a strategy label. Prepare and View call it; so does recovery
    /// (`again`), for a row whose container a power cut lost, from the shape its Prepare
    /// recorded — never from a pool: after a restart no slot is mounted yet, and a fresh
    /// overlay of the same flavour is what a claimed slot was, so a `pooled` snapshot can
    /// be made again.
    pub(crate) fn make_container(
        &self,
        id: &str,
        key: &str,
        kind: SnapshotKind,
        chain: &[Digest],
        shape: &crate::rebuild::Shape,
        again: bool,
    ) -> Result<(), SnapshotError> {
        let labels = &shape.labels;
        let extraction = kind == SnapshotKind::Active && extraction_target(key, labels).is_some();
        // Checked whatever the snapshot, even one it does not limit.
        let disk_limit = max_size(kind, extraction, labels, &self.store)?;
        let idmap = match crate::idmap_labels::idmap(extraction, labels)? {
            Some(map) if self.chowned_for(&map, chain)? => None,
            idmap => idmap,
        };
        let read_only = kind == SnapshotKind::View;
        if chain.is_empty() {
            return self.create_empty(id, key, read_only);
        }
        let default = Strategies::parse(&shape.default_strategies).map_err(|why| {
            SnapshotError::FailedPrecondition(format!("default strategies: {why}"))
        })?;
        let strategies = strategies_for(extraction, labels, default)?;
        let options = CreateOptions {
            // containerd mounts what `mounts_of` answers; only a pooled overlay (and
            // the shared mount a shared-ro bind needs) is mounted by lamina.
            without_mount: true,
            claim_pooled_without_mount: true,
            mount_volatile_without_mount: true,
            strategies,
            remake: again,
            lazy_server: Some(this_process_serves()),
            read_only,
            ephemeral: labels.get(EPHEMERAL_LABEL).is_some_and(|v| v == "true"),
            disk_limit,
            idmap,
            ..CreateOptions::default()
        };
        let stored = StoredLayers {
            source: format!("{SOURCE_PREFIX}{key}"),
            chain_ids: chain.to_vec(),
        };
        let created = lamina_mount::create_from(
            &self.store,
            self.mounter.as_ref(),
            Layers::Stored(&stored),
            id,
            &options,
        )?;
        for follow_up in created.follow_ups {
            match follow_up {
                // The daemon's pool task refills every pool on its interval.
                FollowUp::RefillPools => {}
                FollowUp::BuildMetadataImage { chain_ids, .. } => {
                    self.build_metadata_image_later(chain_ids)
                }
            }
        }
        Ok(())
    }

    /// `auto` served a deep chain from its layers because its composefs metadata image
    /// is not built: built on a thread of its own, off containerd's call (and its
    /// snapshot lock), so the next container snapshot of the chain mounts it.
    fn build_metadata_image_later(&self, chain_ids: Vec<Digest>) {
        let (store, mounter) = (self.store.clone(), self.mounter.clone());
        let spawned = std::thread::Builder::new()
            .name("build-metadata-image".into())
            .spawn(move || {
                let top = chain_ids.last().map(ToString::to_string).unwrap_or_default();
                match lamina_mount::composefs_auto::build_for(&store, mounter.as_ref(), &chain_ids) {
                    Ok(built) => tracing::info!(image = %top, ?built, "composefs metadata image"),
                    Err(e) => tracing::warn!(image = %top, error = %e, "building the composefs metadata image failed"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start building a composefs metadata image");
        }
    }

    /// An unpack about to extract a layer the store already has (imported by `lamina
    /// create`, or committed under another containerd namespace): record a committed
    /// snapshot for it, so containerd skips the download. True if there is one now.
    fn reuse_layer(
        &self,
        key: &str,
        parent: Option<&str>,
        chain: &[Digest],
        labels: &BTreeMap<String, String>,
    ) -> Result<bool, SnapshotError> {
        let target = &labels[REF_LABEL];
        let Ok(layer) = Digest::parse(target) else {
            return Ok(false);
        };
        // A lazy layer is only the image's claim until its completion checks it: reused
        // only by a remote snapshot from its own source (`remote.rs`), never by name.
        if lamina_mount::is_lazy_layer(&self.store, &layer) {
            return Ok(false);
        }
        if self.index().has_committed(parent, target)? {
            return Ok(true);
        }
        if !self.store.has_layer(&layer) || !continues_chain(&self.store, chain, &layer)? {
            return Ok(false);
        }
        let now = now_ns();
        let record = SnapshotRecord {
            kind: SnapshotKind::Committed,
            parent: parent.map(str::to_string),
            labels: labels.clone(),
            created_ns: now,
            updated_ns: now,
            layer: Some(layer),
            container: None,
            committing: None,
        };
        // The layer's publishing rename is durable before a row names it (see Prepare).
        lamina_store::sync_dir(&self.store.layout().layers())?;
        self.index().insert(key, &record)?;
        tracing::info!(key, layer = %target, "layer already in the store: snapshot committed without a download");
        Ok(true)
    }

    /// A snapshot with no parent: an empty directory, bound (read-write for an active).
    fn create_empty(&self, id: &str, key: &str, read_only: bool) -> Result<(), SnapshotError> {
        let source = format!("{SOURCE_PREFIX}{key}");
        lamina_mount::create_empty(&self.store, id, &source, read_only)?;
        Ok(())
    }

    pub fn mounts(&self, key: &str) -> Result<Vec<MountSpec>, SnapshotError> {
        let snapshot = self
            .index()
            .get(key)?
            .ok_or_else(|| SnapshotError::NotFound(key.into()))?;
        match &snapshot.container {
            Some(id) => {
                // Whose the container is, and what it mounts, from one read of its record.
                let source = format!("{SOURCE_PREFIX}{key}");
                let Some(mounts) = self.mounts_if(id, |record| record.image == source)? else {
                    return Err(SnapshotError::NotFound(format!(
                        "{key}: its container `{id}` was lost in a crash and the name is another's now"
                    )));
                };
                Ok(match self.prepared_for_rebase(key, &snapshot) {
                    true => crate::rebase::as_upper_only_overlay(mounts),
                    false => mounts,
                })
            }
            None => Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` is committed: only active snapshots and views have mounts"
            ))),
        }
    }

    /// Deletes container `id`, and what Mounts kept of it (after: a Mounts in between
    /// would keep it again).
    pub(crate) fn delete_container(
        &self,
        id: &str,
    ) -> Result<lamina_mount::Deleted, lamina_mount::RootfsError> {
        let deleted = lamina_mount::delete(&self.store, self.mounter.as_ref(), id);
        self.attach_cache.forget(id);
        deleted
    }

    /// What containerd mounts for the snapshot whose container is `id`.
    pub(crate) fn mounts_of(&self, id: &str) -> Result<Vec<MountSpec>, SnapshotError> {
        let attach = (self.attach_cache).attach(&self.store, self.mounter.as_ref(), id)?;
        Ok(vec![mount_spec(attach)])
    }

    /// [`Snapshotter::mounts_of`] if `belongs` accepts the container's record.
    fn mounts_if(
        &self,
        id: &str,
        belongs: impl FnOnce(&lamina_store::ContainerRecord) -> bool,
    ) -> Result<Option<Vec<MountSpec>>, SnapshotError> {
        let attach =
            (self.attach_cache).attach_if(&self.store, self.mounter.as_ref(), id, belongs)?;
        Ok(attach.map(|a| vec![mount_spec(a)]))
    }
}

/// containerd's form of what to mount.
fn mount_spec(attach: Attach) -> MountSpec {
    match attach {
        Attach::Bind { source, read_only } => MountSpec {
            kind: "bind".into(),
            source: source.display().to_string(),
            options: vec!["rbind".into(), if read_only { "ro" } else { "rw" }.into()],
        },
        Attach::Overlay { options } => MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            options,
        },
    }
}

/// The daemon serving containerd serves the store's lazy layers on a thread of its own
/// (`lamina daemon`): a snapshot on a lazy layer just published waits for it to be
/// served, rather than being refused before that thread has seen the layer.
fn this_process_serves() -> lamina_mount::LazyServer {
    lamina_mount::LazyServer(Arc::new(|_| Ok(())))
}

/// The chain ID an image unpack extracts into snapshot `key`: its
/// `containerd.io/snapshot.ref` label (containerd's pull), or the chain ID at the end of
/// containerd's unpack key, `extract-<unique> <chain ID>` (`ctr images import`).
pub(crate) fn extraction_target(key: &str, labels: &BTreeMap<String, String>) -> Option<Digest> {
    if let Some(target) = labels.get(REF_LABEL) {
        return Digest::parse(target).ok();
    }
    let last = key.rsplit('/').next().unwrap_or(key);
    let (unique, chain_id) = last.split_once(' ')?;
    unique
        .starts_with("extract-")
        .then(|| Digest::parse(chain_id).ok())
        .flatten()
}

/// The limit `containerd.io/snapshot/max-size` asks for: what an active snapshot may
/// write, the image not counted. It makes the snapshot's upper a filesystem of that size,
/// or a qgroup-limited subvolume on a btrfs store with quotas (`auto`; a strategy label
/// that cannot isolate is refused). A view writes nothing and an unpack's upper becomes a
/// layer: neither is limited; nor is a snapshot without a parent, an empty directory.
///
/// Labels under `containerd.io/snapshot/` reach lamina from images and, for a pod's
/// sandbox, from pod annotations, so the value is bounded: from the smallest upper
/// filesystem lamina can make (8 MiB) to the size of the store's own filesystem. Above
/// that a sparse image would still cost minutes of mkfs and gigabytes of metadata under
/// the snapshot lock, and a memory-backed upper is bounded by memory besides (`MemoryUpperTooLarge`: half the host's).
fn max_size(
    kind: SnapshotKind,
    extraction: bool,
    labels: &BTreeMap<String, String>,
    store: &Store,
) -> Result<Option<lamina_mount::DiskLimit>, SnapshotError> {
    let Some(value) = labels.get(MAX_SIZE_LABEL) else {
        return Ok(None);
    };
    let refused = |why: String| {
        SnapshotError::InvalidArgument(format!(
            "{MAX_SIZE_LABEL}: `{}` {why}",
            lamina_image::shown(value)
        ))
    };
    let bytes = value
        .trim()
        .parse::<u64>()
        .map_err(|_| refused("is not a number of bytes".into()))?;
    let floor = lamina_sys::DiskFs::Ext4.min_bytes();
    if bytes < floor {
        return Err(refused(format!(
            "is below the smallest limit, {floor} bytes"
        )));
    }
    let ceiling = store.filesystem_size()?;
    if bytes > ceiling {
        return Err(refused(format!(
            "is more than the store's filesystem holds ({ceiling} bytes)"
        )));
    }
    if kind != SnapshotKind::Active || extraction {
        return Ok(None);
    }
    Ok(Some(lamina_mount::DiskLimit {
        bytes,
        exclude_image: true,
    }))
}

/// A snapshot database made by this open, with nothing to migrate, on a store that has
/// snapshot containers: the database was lost or replaced (a backup of `metadata.db`
/// without its -wal, an emptied file). Starting would find every container unnamed and
/// remove it, with what containers wrote; refused instead, naming what to do.
fn refuse_unrecorded_containers(store: &Store) -> Result<(), SnapshotError> {
    let scan = lamina_mount::record::scan(store)?;
    // An unreadable record under a snapshot's name counts: it may well be one.
    let containers = scan
        .containers
        .iter()
        .filter(|c| is_snapshot_container(c))
        .count()
        + scan
            .bad
            .iter()
            .filter(|b| b.id.starts_with(CONTAINER_PREFIX))
            .count();
    if containers == 0 {
        return Ok(());
    }
    Err(SnapshotError::FailedPrecondition(format!(
        "{} has no snapshots recorded, but {containers} snapshot containers (images/{CONTAINER_PREFIX}*) exist: the snapshot database was lost or replaced; restore it (with its -wal file), or remove those containers with `lamina delete` before starting",
        store.layout().snapshot_db().display()
    )))
}

/// Layers of committed snapshot `key` and its ancestors, bottom-most first: one indexed
/// lookup per ancestor.
pub(crate) fn layer_chain(index: &SnapshotIndex, key: &str) -> Result<Vec<Digest>, SnapshotError> {
    let mut chain = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut next = Some(key.to_string());
    while let Some(key) = next {
        if !seen.insert(key.clone()) {
            return Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}`: its parents form a loop"
            )));
        }
        let snapshot = index
            .get(&key)?
            .ok_or_else(|| SnapshotError::NotFound(format!("{key} (parent)")))?;
        let Some(layer) = snapshot.layer else {
            return Err(SnapshotError::InvalidArgument(format!(
                "parent `{key}` is not a committed snapshot"
            )));
        };
        chain.push(layer);
        next = snapshot.parent;
    }
    chain.reverse();
    Ok(chain)
}

/// Whether `layer` (an imported layer, whose record knows its diff ID) sits on top of
/// `chain`: its chain ID must be the one `chain` plus its diff ID make. Layers a commit
/// made have no diff ID; their chain ID came from containerd, which computed it the same
/// way, so they are taken as they are.
fn continues_chain(store: &Store, chain: &[Digest], layer: &Digest) -> Result<bool, SnapshotError> {
    let Some(diff_id) = store.layer_record(layer)?.diff_id else {
        return Ok(true);
    };
    Ok(lamina_image::next_chain_id(chain.last(), &diff_id) == *layer)
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The strategies a snapshot is made with: classic for an unpack, its strategy label's,
/// else `default` (the daemon's).
fn strategies_for(
    extraction: bool,
    labels: &BTreeMap<String, String>,
    default: Strategies,
) -> Result<Strategies, SnapshotError> {
    if extraction {
        return Ok(Strategies::CLASSIC);
    }
    match labels.get(STRATEGY_LABEL) {
        Some(list) => Strategies::parse(list)
            .map_err(|why| SnapshotError::InvalidArgument(format!("{STRATEGY_LABEL}: {why}"))),
        None => Ok(default),
    }
}
