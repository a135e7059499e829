//! For callers that mount a container's rootfs themselves (containerd through the
//! snapshotter): what to mount, what an empty container is, and which upper a commit
//! publishes. Each answer comes from the container's model here, so the front-end that
//! asks holds no strategy logic.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use lamina_image::Digest;
use lamina_store::{ContainerRecord, Store};
use lamina_sys::Mounter;

use crate::lifecycle::one_step::holding_id;
use crate::model::Model;
use crate::model::record::{self, Container, RootfsRecord};
use crate::providers::Attach;
use crate::{RootfsError, Strategies};

/// What to mount for container `id`: its rootfs if lamina mounts it (a pooled or
/// volatile overlay, a shared-ro or direct bind lamina mounted), the upper of an empty
/// container, the directory a read-only bind binds, or else the overlay its model
/// describes. Holding the ID, a rootfs lamina mounts is mounted again first if it is not
/// (a host restart, an `unmount`): a bind of an empty directory would hand the caller
/// the store's filesystem, and a volatile overlay the caller mounted itself could never
/// be mounted a second time.
pub fn attach(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Attach, RootfsError> {
    match attach_if(store, mounter, id, |_| true)? {
        Some(attach) => Ok(attach),
        None => Err(lamina_store::StoreError::NotFound(id.into()).into()),
    }
}

/// [`attach`] if `belongs` accepts container `id`'s record, `None` otherwise: the record
/// read once for both (a containerd snapshot's Mounts asks whether the container is
/// still its own on every container start).
pub fn attach_if(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
    belongs: impl FnOnce(&ContainerRecord) -> bool,
) -> Result<Option<Attach>, RootfsError> {
    attach_keeping(store, mounter, id, belongs, |_, _| {})
}

/// What an answer that follows from the record alone was worked out from.
pub(crate) struct FromRecord {
    /// The record as stored.
    pub stored: Vec<u8>,
    /// The same record, parsed.
    pub record: ContainerRecord,
}

/// [`attach_if`], handing `keep` an answer that follows from the record alone, with what
/// it came from, while the ID is still held ([`crate::AttachCache`] keeps those).
pub(crate) fn attach_keeping(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
    belongs: impl FnOnce(&ContainerRecord) -> bool,
    keep: impl FnOnce(&Attach, FromRecord),
) -> Result<Option<Attach>, RootfsError> {
    holding_id(store, id, || {
        let (container, stored) = record::read_with_bytes(store, id)?;
        if !belongs(&container.record) {
            return Ok(None);
        }
        let record = container.record.clone();
        let (attach, from_record_alone) = attach_held(store, mounter, id, container)?;
        if from_record_alone {
            keep(&attach, FromRecord { stored, record });
        }
        Ok(Some(attach))
    })
}

/// What to mount for the container, holding its ID, and whether that follows from its
/// record alone.
fn attach_held(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
    container: Container,
) -> Result<(Attach, bool), RootfsError> {
    let dirs = container.dirs(store);
    let read_only = container.model().read_only();
    // An idmapped overlay, like a volatile or a composefs one, only lamina mounts.
    if container.rootfs.mounted || container.mounted_by_lamina_only() {
        if !mounter.is_mountpoint(&dirs.rootfs)? {
            crate::lifecycle::remount::mount_held(store, mounter, id)?;
        } else {
            crate::providers::still_served(store, mounter, &container)?;
        }
        let bind = Attach::Bind {
            source: dirs.rootfs,
            read_only,
        };
        return Ok((bind, false));
    }
    if container.record.layers.is_empty() {
        let bind = Attach::Bind {
            source: dirs.upper,
            read_only,
        };
        return Ok((bind, true));
    }
    let alone = crate::providers::attach_from_record_alone(&container);
    Ok((crate::providers::attach(store, mounter, &container)?, alone))
}

/// Makes container `id` with no layers: an empty directory (its upper) the caller binds,
/// read-write unless `read_only`. `source` is what the record says it came from.
pub fn create_empty(
    store: &Store,
    id: &str,
    source: &str,
    read_only: bool,
) -> Result<(), RootfsError> {
    lamina_store::validate_new_id(id)?;
    holding_id(store, id, || {
        let claim = store.create_container_dirs(id)?;
        let access = if read_only { "ro" } else { "rw" };
        let model = Model::named(Strategies::CLASSIC, read_only).map_err(RootfsError::Refused)?;
        let container = Container {
            record: ContainerRecord {
                id: id.to_string(),
                image: source.to_string(),
                image_id: Digest::of(&[]),
                layers: Vec::new(),
                env: Vec::new(),
                created_unix: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                disk_limit: None,
                rootfs: Default::default(),
            },
            rootfs: RootfsRecord::new(model, false, vec!["rbind".into(), access.into()]),
        };
        // A new container's first record, as create writes it (no flushes where the
        // store's journal orders it: docs/store.md, "Durability of records").
        if let Err(e) = record::write_new(store, &container) {
            let _ = store.remove_container_dirs(id);
            return Err(e.into());
        }
        drop(claim);
        Ok(())
    })
}

/// The upper directory a commit of container `id` publishes as a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpperToCommit {
    pub upper: PathBuf,
    /// With metacopy, files copied up for metadata only have no data in the upper: the
    /// lowers (top-most first) to fill them from before the upper can stand alone; over
    /// pending (lazy) layers, their trees and then where those redirect.
    pub metacopy_lowers: Option<Vec<PathBuf>>,
    /// Where a lower's stub keeps its data (a store whose layers keep their data in
    /// objects): reached only through a stub's own redirect, never as a layer.
    pub objects: Option<PathBuf>,
}

/// [`RootfsError::UpperInUse`] if an overlay lamina did not mount (containerd mounts a
/// snapshot itself) still has container `id`'s upper as its upper: its container could
/// still write the layer once it is published, or swap what the publish walks. lamina's
/// own mount, at the rootfs, is unmounted by the commit. Asked before a commit is
/// recorded, never while one is finished: a start that finds a commit to finish must not
/// fail on a mount (it would fail every start).
pub fn refuse_upper_in_use(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<(), RootfsError> {
    let dirs = store.container_dirs(id);
    // The path as lamina answered it, and as the kernel resolves it when it differs (a
    // store configured through a symlink).
    let canonical = std::fs::canonicalize(&dirs.upper)
        .ok()
        .filter(|c| *c != dirs.upper);
    for path in std::iter::once(&dirs.upper).chain(canonical.as_ref()) {
        if let Some(at) = mounter.writable_mount_of(path, &dirs.rootfs)? {
            return Err(RootfsError::UpperInUse { at });
        }
    }
    Ok(())
}

/// Which upper a commit of container `id` publishes: [`RootfsError::UpperNotCommittable`]
/// if its upper cannot become a layer (its own filesystem), and
/// [`RootfsError::VolatileUnclean`] if it is a volatile upper whose overlay went away
/// without a clean unmount (a crash: its writes may be lost).
pub fn upper_to_commit(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
) -> Result<UpperToCommit, RootfsError> {
    let container = record::read(store, id)?;
    // Decided by the record, which only lamina writes: a caller's labels can change.
    if container.rootfs.idmap.is_some() {
        return Err(RootfsError::IdmappedNotCommittable);
    }
    let model = container.model();
    if model.upper_backend().is_some() {
        return Err(RootfsError::UpperNotCommittable {
            strategy: model.to_string(),
        });
    }
    let dirs = container.dirs(store);
    // Mounted, the kernel's marker is always there; unmounted, only a crash leaves it.
    if model.volatile()
        && crate::fsutil::volatile_marker(&dirs.work).exists()
        && !mounter.is_mountpoint(&dirs.rootfs)?
    {
        return Err(RootfsError::VolatileUnclean { id: id.into() });
    }
    // A read-only bind writes nothing and has no upper: what it commits is empty.
    if model.binds() && !dirs.upper.exists() {
        std::fs::create_dir(&dirs.upper)
            .map_err(lamina_store::StoreError::io("creating", &dirs.upper))?;
    }
    // A composefs upper's layers hold the same tree its metadata image was built from.
    // A store whose layers keep their data in objects mounts every overlay with
    // metacopy, whatever the flavour.
    let objects = store.properties().layer_data_in_objects;
    Ok(UpperToCommit {
        upper: dirs.upper,
        metacopy_lowers: (model.metadata_copy_up() || objects)
            .then(|| crate::providers::commit_lowers(store, &container.record.layers)),
        objects: objects.then(|| store.layout().objects()),
    })
}

/// Publishes container `id`'s upper with `publish`, holding the ID: the rootfs lamina
/// mounted (a pooled, volatile or classic container) is unmounted first, as `unmount`
/// does it, since an upper must be still when it becomes a layer, and no `mount` of the
/// ID can slip in between. A volatile upper is published only after a clean unmount (no
/// writeback error, synced); one a crash left marked is refused, never published.
pub fn commit_upper<T>(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
    publish: impl FnOnce(&UpperToCommit) -> T,
) -> Result<T, RootfsError> {
    holding_id(store, id, || {
        // A marker a crash left is refused here; a mounted volatile upper is synced and
        // its marker removed by the unmount, or the unmount fails.
        let upper = upper_to_commit(store, mounter, id)?;
        crate::lifecycle::remount::unmount_held(store, mounter, id)?;
        Ok(publish(&upper))
    })
}
