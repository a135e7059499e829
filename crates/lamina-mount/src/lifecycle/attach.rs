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
use crate::{RootfsError, Strategies};

/// What a caller mounts to see a container's rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// A recursive bind of this directory.
    Bind { source: PathBuf, read_only: bool },
    /// An overlay with these options (lowerdir, upperdir, workdir, flavour, ro).
    Overlay { options: Vec<String> },
}

/// What to mount for container `id`: its rootfs if lamina mounts it (a pooled or
/// volatile overlay, a shared-ro or direct bind lamina mounted), the upper of an empty
/// container, the directory a read-only bind binds, or else the overlay its model
/// describes. Holding the ID, a rootfs lamina mounts is mounted again first if it is not
/// (a host restart, an `unmount`): a bind of an empty directory would hand the caller
/// the store's filesystem, and a volatile overlay the caller mounted itself could never
/// be mounted a second time.
pub fn attach(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Attach, RootfsError> {
    holding_id(store, id, || attach_held(store, mounter, id))
}

fn attach_held(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Attach, RootfsError> {
    let container = record::read(store, id)?;
    let model = container.model();
    let read_only = model.read_only();
    let dirs = container.dirs(store);
    let bind = |source: PathBuf| Attach::Bind { source, read_only };
    let volatile = model.flavor().is_some_and(|f| f.volatile);
    let composefs = model.flavor().is_some_and(|f| f.composefs);
    // An idmapped overlay, like a volatile or a composefs one (its image's EROFS mount
    // must be there first, which only lamina makes), only lamina mounts: the caller binds.
    let lamina_mounts = volatile || composefs || container.rootfs.idmap.is_some();
    Ok(if container.rootfs.mounted || lamina_mounts {
        if !mounter.is_mountpoint(&dirs.rootfs)? {
            crate::lifecycle::remount::mount_held(store, mounter, id)?;
        }
        bind(dirs.rootfs)
    } else if container.record.layers.is_empty() {
        bind(dirs.upper)
    } else {
        match &container.rootfs.bind_source {
            Some(source) => {
                if let Some(lease) = &container.rootfs.lease {
                    crate::providers::shared_ro::mount_again(
                        store,
                        mounter,
                        lease,
                        &container.record.layers,
                    )?;
                }
                bind(source.clone())
            }
            None => {
                // An upper filesystem of its own is lamina's to mount: after a host
                // restart it is mounted again here (a memory upper is gone, and that is
                // an error), or the overlay's upperdir would not exist.
                crate::lifecycle::remount::mount_upper_fs(mounter, &container, &dirs)?;
                // Rebuilt from the model, as `mount` does: the options name host paths,
                // and the ones a record holds are not trusted to be the store's.
                let flavor = container.model().flavor().unwrap_or_default();
                let mut spec =
                    crate::lowers::plan::read_write(store, &container.record.layers, &dirs, flavor);
                spec.read_only = read_only;
                Attach::Overlay {
                    options: options_for_one_page(store, spec)?,
                }
            }
        }
    })
}

/// One page: what mount(2) takes as its options, and so what a caller mounting the
/// overlay from an option string can pass.
const PAGE: usize = 4096;

/// `spec`'s options for a caller that mounts the overlay itself, each layer named by its
/// short link (`l/<name>`, see `lamina-store/src/layer_links.rs`). containerd mounts
/// lowerdirs that share a directory from inside it, by their bare names, and the options
/// must then fit one page. It mounts the same answer read-only too (a diff, an image's
/// user lookup): the upper joins the front of `lowerdir` and `workdir` goes, so the
/// lowers share only the store's root and each costs two bytes more. A chain too deep
/// for either form is refused here, naming its depth, rather than handed to a mount that
/// fails with "mount options is too long".
fn options_for_one_page(
    store: &Store,
    mut spec: lamina_sys::OverlaySpec,
) -> Result<Vec<String>, RootfsError> {
    spec.lowers = spec
        .lowers
        .iter()
        .map(|lower| store.short_lower(lower))
        .collect::<Result<_, _>>()?;
    let options = spec.option_strings();
    let longest =
        compacted_read_write(&spec, &options).max(compacted_read_only(store, &spec, &options));
    if longest > PAGE {
        return Err(RootfsError::Refused(format!(
            "an overlay of {} layers cannot be mounted from one page of mount options ({longest} bytes even with short layer names); images this deep need a flattened lower",
            spec.lowers.len()
        )));
    }
    Ok(options)
}

/// The options' size as containerd passes them to mount(2), each counted with its comma:
/// `lowerdir` as bare names inside `l/`.
fn compacted_read_write(spec: &lamina_sys::OverlaySpec, options: &[String]) -> usize {
    let names: usize = spec.lowers.iter().map(|l| name_len(l) + 1).sum();
    options
        .iter()
        .map(|o| match o.starts_with("lowerdir=") {
            true => "lowerdir=".len() + names,
            false => o.len() + 1,
        })
        .sum()
}

/// The same for containerd's read-only form: `lowerdir=<upper>:<lowers>` relative to the
/// store's root (`l/<name>`), no `upperdir` or `workdir`, plus `ro`.
fn compacted_read_only(store: &Store, spec: &lamina_sys::OverlaySpec, options: &[String]) -> usize {
    let relative = |p: &std::path::Path| {
        p.strip_prefix(store.root())
            .map_or(p.as_os_str().len(), |r| r.as_os_str().len())
    };
    let upper = spec.upper.as_deref().map_or(0, |u| relative(u) + 1);
    let lowers: usize = spec.lowers.iter().map(|l| relative(l) + 1).sum();
    let rest: usize = options
        .iter()
        .filter(|o| {
            !["lowerdir=", "upperdir=", "workdir="]
                .iter()
                .any(|k| o.starts_with(k))
        })
        .map(|o| o.len() + 1)
        .sum();
    "lowerdir=".len() + upper + lowers + rest + "ro,".len()
}

fn name_len(path: &std::path::Path) -> usize {
    path.file_name().map_or(0, |n| n.len())
}

/// Makes container `id` with no layers: an empty directory (its upper) the caller binds,
/// read-write unless `read_only`. `source` is what the record says it came from.
pub fn create_empty(
    store: &Store,
    id: &str,
    source: &str,
    read_only: bool,
) -> Result<(), RootfsError> {
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
    /// lowers (top-most first) to fill them from before the upper can stand alone.
    pub metacopy_lowers: Option<Vec<PathBuf>>,
}

/// [`RootfsError::UpperInUse`] if an overlay lamina did not mount (containerd mounts a
/// snapshot itself) still has container `id`'s upper as its upper: its container could
/// still write the layer once it is published, or swap what the publish walks (review
/// finding). lamina's own mount, at the rootfs, is unmounted by the commit. Asked before
/// a commit is recorded, never while one is finished: a start that finds a commit to
/// finish must not fail on a mount (it would fail every start).
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
    let flavor = container.model().flavor();
    if flavor.is_some_and(|f| f.isolated.is_some()) {
        return Err(RootfsError::UpperNotCommittable {
            strategy: container.model().to_string(),
        });
    }
    let dirs = container.dirs(store);
    // Mounted, the kernel's marker is always there; unmounted, only a crash leaves it.
    if flavor.is_some_and(|f| f.volatile)
        && crate::fsutil::volatile_marker(&dirs.work).exists()
        && !mounter.is_mountpoint(&dirs.rootfs)?
    {
        return Err(RootfsError::VolatileUnclean { id: id.into() });
    }
    // composefs mounts with metacopy on: its copy-ups are metadata-only too, and the
    // layers hold the same tree its metadata image was built from.
    let metacopy = flavor.is_some_and(|f| f.metacopy || f.composefs);
    Ok(UpperToCommit {
        upper: container.dirs(store).upper,
        metacopy_lowers: metacopy
            .then(|| crate::lowers::plan::lowers(store, &container.record.layers)),
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
