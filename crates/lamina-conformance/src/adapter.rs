//! The one place the conformance suite touches lamina's strategy and lifecycle API.
//! Everything else speaks [`crate::table`]'s model (provider × flavour × teardown); when
//! lamina's API changes, only this module is re-pointed.
//!
//! A row's spec is asked for as a `--strategy` list (`Strategies::parse`, the operator's
//! words) and read back from the created container's typed `lamina_mount::Model`; the
//! lifecycle functions are `lamina_mount::*`.

use std::path::{Path, PathBuf};

use lamina_image::{Digest, Image};
use lamina_mount::pool::PoolKind;
use lamina_mount::{
    CreateOptions, Created, Deleted, DiskLimit, Flavour as ModelFlavour, Model, RootfsError,
    Strategies, UpperBackend, UpperPlan,
};
use lamina_store::Store;
use lamina_sys::{DiskFs, Mounter};

use crate::table::{Ask, Flavour, Provider, Refusal, Request, Spec, Teardown, Upper};

pub type Error = RootfsError;

/// What a create made, as the suite reads it back.
#[derive(Debug, Clone)]
pub struct Made {
    pub id: String,
    pub rootfs: PathBuf,
    /// Parsed back from the container's record.
    pub spec: Spec,
    pub read_only: bool,
    pub from_pool: bool,
}

/// How a delete went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    Removed,
    Deferred,
    NotFound,
}

/// One problem `check` reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: String,
    pub path: PathBuf,
    pub repaired: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub ok: bool,
    pub problems: Vec<Found>,
}

/// One model lamina's parser names, in the table's terms.
#[derive(Debug, Clone, Copy)]
pub struct Named {
    pub spec: Spec,
    /// Its rootfs is read-only.
    pub read_only: bool,
    /// Its strategy list gives it only with `--read-only` (a read-only bind provider is
    /// read-only by itself).
    pub asks_read_only: bool,
}

/// Every model lamina's parser names ([`Model::all`]): what the table's named rows are
/// generated from.
pub fn every_named() -> Vec<Named> {
    Model::all()
        .into_iter()
        .map(|model| Named {
            spec: spec_of(model),
            read_only: model.read_only(),
            asks_read_only: Model::named(model.strategies(), false).as_ref() != Ok(&model),
        })
        .collect()
}

/// The strategy list today's API takes for `spec`.
pub fn list(spec: &Spec) -> String {
    let mut names: Vec<&str> = Vec::new();
    if spec.provider != Provider::FRESH {
        names.push(spec.provider.0);
    }
    names.extend(flavour_names(&spec.flavour));
    if spec.teardown == Teardown::Deferred {
        names.push("deferred");
    }
    if names.is_empty() {
        "classic".into()
    } else {
        names.join(",")
    }
}

fn flavour_names(flavour: &Flavour) -> Vec<&'static str> {
    let mut names = Vec::new();
    match flavour.upper {
        Upper::Store => {}
        Upper::Disk => names.push("isolated"),
        Upper::Memory => names.push("isolated-memory"),
        Upper::Quota => names.push("isolated-quota"),
    }
    if flavour.composefs {
        names.push("composefs");
    }
    if flavour.metacopy {
        names.push("metacopy");
    }
    if flavour.volatile {
        names.push("volatile");
    }
    names
}

fn strategies(spec: &Spec) -> Strategies {
    Strategies::parse(&list(spec))
        .unwrap_or_else(|e| panic!("the table's {spec:?} is not a valid strategy list: {e}"))
}

fn flavour_model(flavour: &Flavour) -> ModelFlavour {
    ModelFlavour::of(strategies(&Spec::fresh(*flavour, Teardown::Inline)))
}

/// Reads lamina's model of a created container into the table's.
fn spec_of(model: Model) -> Spec {
    let provider = Provider(model.provider.name());
    let flavour = model.flavour().unwrap_or(ModelFlavour::PLAIN);
    Spec {
        provider,
        flavour: Flavour {
            metacopy: flavour.metacopy,
            volatile: flavour.volatile,
            upper: match flavour.isolated {
                None => Upper::Store,
                Some(UpperBackend::Disk) => Upper::Disk,
                Some(UpperBackend::Memory) => Upper::Memory,
                Some(UpperBackend::Quota) => Upper::Quota,
            },
            composefs: flavour.composefs,
        },
        teardown: if model.deferred() {
            Teardown::Deferred
        } else {
            Teardown::Inline
        },
    }
}

fn limit(bytes: Option<u64>) -> Option<DiskLimit> {
    bytes.map(|bytes| DiskLimit {
        bytes,
        exclude_image: false,
    })
}

/// Create options for `request`.
pub fn create_options(request: &Request) -> CreateOptions {
    CreateOptions {
        strategies: match request.ask {
            Ask::Auto => Strategies::AUTO,
            Ask::Named(spec) => strategies(&spec),
        },
        read_only: request.read_only,
        ephemeral: request.ephemeral,
        disk_limit: limit(request.disk_limit),
        disk_fs: DiskFs::Ext4,
        ..CreateOptions::default()
    }
}

fn made(id: &str, created: Created) -> Made {
    Made {
        id: id.to_string(),
        spec: spec_of(created.container.model()),
        read_only: created.container.model().read_only(),
        from_pool: created.claimed_from_pool,
        rootfs: created.rootfs,
    }
}

/// Creates container `id` from `image` as `request` asks.
pub fn create(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    id: &str,
    request: &Request,
) -> Result<Made, Error> {
    lamina_mount::create(store, mounter, image, id, &create_options(request)).map(|c| made(id, c))
}

/// [`create`] for a caller that mounts the rootfs itself (Garden's `--without-mount`).
pub fn create_without_mount(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    id: &str,
    request: &Request,
) -> Result<Made, Error> {
    let options = CreateOptions {
        without_mount: true,
        ..create_options(request)
    };
    lamina_mount::create(store, mounter, image, id, &options).map(|c| made(id, c))
}

/// A container that only pins the image's layers in the store (recorded, never mounted),
/// so rows share one import.
pub fn create_unmounted(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    id: &str,
) -> Result<(), Error> {
    let options = CreateOptions {
        without_mount: true,
        ..CreateOptions::default()
    };
    lamina_mount::create(store, mounter, image, id, &options).map(drop)
}

/// The refusal `err` is, if it is one the table names.
pub fn refusal(err: &Error) -> Option<Refusal> {
    match err {
        RootfsError::PoolEmpty { .. } => Some(Refusal::PoolEmpty),
        RootfsError::PoolReadOnly => Some(Refusal::PoolReadOnly),
        RootfsError::DiskLimitNeedsIsolated { .. } => Some(Refusal::DiskLimitNeedsIsolated),
        RootfsError::PoolWithoutMount => Some(Refusal::PoolWithoutMount),
        _ => None,
    }
}

pub fn unmount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), Error> {
    lamina_mount::unmount(store, mounter, id)
}

pub fn mount(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(), Error> {
    lamina_mount::mount(store, mounter, id)
}

/// Whether the record of `id` says its rootfs is mounted.
pub fn recorded_mounted(store: &Store, id: &str) -> bool {
    lamina_mount::record::read(store, id)
        .map(|c| c.rootfs.mounted)
        .unwrap_or(false)
}

pub fn delete(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Gone, Error> {
    Ok(match lamina_mount::delete(store, mounter, id)? {
        Deleted::Removed => Gone::Removed,
        Deleted::Deferred => Gone::Deferred,
        Deleted::NotFound => Gone::NotFound,
    })
}

/// A reaper pass: (removed, left in trash).
pub fn reap(store: &Store, mounter: &dyn Mounter) -> Result<(usize, usize), Error> {
    lamina_mount::reap(store, mounter).map(|r| (r.removed, r.failed))
}

/// A full `clean` (no threshold).
pub fn clean(store: &Store, mounter: &dyn Mounter) -> Result<(), Error> {
    lamina_mount::clean(store, mounter, None).map(drop)
}

pub fn check(store: &Store, mounter: &dyn Mounter, repair: bool) -> Result<Checked, Error> {
    let report = lamina_mount::check(store, mounter, repair)?;
    Ok(Checked {
        ok: report.ok,
        problems: report
            .problems
            .into_iter()
            .map(|p| Found {
                kind: p.kind.to_string(),
                path: p.path,
                repaired: p.repaired,
            })
            .collect(),
    })
}

/// The pool `setup` describes for `image`'s layers (imported first).
fn pool_kind(
    store: &Store,
    image: &Image,
    flavour: &Flavour,
    limit_bytes: Option<u64>,
) -> PoolKind {
    let chain_ids: Vec<Digest> = image.chain_ids();
    let upper = backend(flavour.upper).map(|b| upper_plan(store, &chain_ids, b, limit_bytes));
    PoolKind::overlays(&chain_ids, flavour_model(flavour), upper)
}

fn backend(upper: Upper) -> Option<UpperBackend> {
    match upper {
        Upper::Store => None,
        Upper::Disk => Some(UpperBackend::Disk),
        Upper::Memory => Some(UpperBackend::Memory),
        Upper::Quota => Some(UpperBackend::Quota),
    }
}

fn upper_plan(
    store: &Store,
    chain_ids: &[Digest],
    backend: UpperBackend,
    limit_bytes: Option<u64>,
) -> UpperPlan {
    lamina_mount::isolated::plan_for(store, chain_ids, backend, limit(limit_bytes), DiskFs::Ext4)
        .unwrap_or_else(|e| panic!("planning an upper for the pool: {e}"))
}

/// Fills (`Some(size)`) or refills (`None`: back to its standing order) the pool of
/// `image` overlays in `flavour`: (added, ready).
pub fn fill_overlays(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    flavour: &Flavour,
    limit_bytes: Option<u64>,
    size: Option<usize>,
) -> Result<(usize, usize), Error> {
    store.import(image)?;
    let kind = pool_kind(store, image, flavour, limit_bytes);
    lamina_mount::pool::fill(store, mounter, &kind, size).map(|f| (f.added, f.ready))
}

/// Fills (or refills) the pool of bare upper filesystems of `upper` (default size).
pub fn fill_uppers(
    store: &Store,
    mounter: &dyn Mounter,
    upper: Upper,
    size: Option<usize>,
) -> Result<(usize, usize), Error> {
    let backend = backend(upper).expect("a bare upper pool is of isolated uppers");
    let kind = PoolKind::uppers(UpperPlan::new(backend, None, DiskFs::Ext4));
    lamina_mount::pool::fill(store, mounter, &kind, size).map(|f| (f.added, f.ready))
}

/// Releases every unclaimed pool slot: how many.
pub fn drain(store: &Store, mounter: &dyn Mounter) -> Result<usize, Error> {
    lamina_mount::pool::drain(store, mounter)
}

/// Container `id`'s directory (whether or not it exists).
pub fn container_dir(store: &Store, id: &str) -> PathBuf {
    store.layout().container(id)
}

/// Where `rel`, written into the rootfs of a container on the store's upper, lands in the
/// directory `base` (the container's, or its trash entry's).
pub fn in_upper(base: &Path, rel: &str) -> PathBuf {
    base.join("upper").join(rel)
}

/// Whatever the store still holds of images and containers: layers, flattened trees,
/// shared mounts, pools, containers and trash. (`shared/empty`, the empty lower every
/// shared mount of a single-layer image uses, is a fixture and stays.)
pub fn store_leftovers(store: &Store) -> Vec<PathBuf> {
    let layout = store.layout();
    let fixture = layout.shared().join("empty");
    [
        layout.layers(),
        layout.flat(),
        layout.shared(),
        layout.pool(),
        layout.images(),
        layout.trash(),
    ]
    .iter()
    .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
    .map(|e| e.path())
    .filter(|p| *p != fixture)
    .collect()
}

pub fn trash_entries(store: &Store) -> Vec<PathBuf> {
    store.trash_entries().unwrap_or_default()
}

pub fn container_exists(store: &Store, id: &str) -> bool {
    store.container_exists(id)
}

/// A probe result claiming everything a real 6.x kernel supports, written as the store's
/// cached probe: how the fake rig (which mounts nothing, so no copy-up is observed) gets
/// `auto` and `metacopy` to behave as they do on a real kernel.
pub fn assume_full_probe(store: &Store, mounter: &dyn Mounter) -> std::io::Result<()> {
    let mut probe = lamina_mount::probe::probe(store, mounter, false)?;
    probe.metacopy = true;
    probe.volatile = true;
    probe.redirect_dir = true;
    probe.new_mount_api = true;
    probe.erofs_file_backed = Some(true);
    probe.fs_verity = Some(false);
    let path = lamina_mount::probe::cache_path(store);
    std::fs::write(
        &path,
        serde_json::to_vec(&probe).map_err(std::io::Error::other)?,
    )
}

/// What `attach` answers for container `id`: a bind (its source, read-only) or an
/// overlay (its options).
pub fn attach(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Attached, Error> {
    Ok(match lamina_mount::attach(store, mounter, id)? {
        lamina_mount::Attach::Bind { source, read_only } => Attached::Bind(source, read_only),
        lamina_mount::Attach::Overlay { options } => Attached::Overlay(options),
    })
}

/// [`attach`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    Bind(PathBuf, bool),
    Overlay(Vec<String>),
}

/// `stats` of container `id`: (total, exclusive) bytes.
pub fn usage(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<(u64, u64), Error> {
    let stats = lamina_mount::stats(store, mounter, id)?;
    Ok((
        stats.disk_usage.total_bytes_used,
        stats.disk_usage.exclusive_bytes_used,
    ))
}

/// The upper a commit of container `id` would publish, or why it would not.
pub fn upper_to_commit(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<PathBuf, Error> {
    lamina_mount::upper_to_commit(store, mounter, id).map(|upper| upper.upper)
}

/// Whether `err` refuses a commit because the upper is on a filesystem of its own.
pub fn upper_not_committable(err: &Error) -> bool {
    matches!(err, RootfsError::UpperNotCommittable { .. })
}
