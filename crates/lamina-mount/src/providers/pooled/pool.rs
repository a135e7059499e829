//! pooled (stall S2): read-write overlays mounted ahead of time, one pool per image and
//! mount flavour, at `pool/<top-chain-id>-<flavour>/<slot>/`. A slot is shaped like a
//! container directory (rootfs with the overlay mounted on it, upper, work, lock), so
//! `create` claims one by renaming the slot to `images/<ID>`: the mount moves with its
//! directory and the claim makes no mount syscall, however hard the host is reclaiming.
//!
//! isolated containers take their own upper filesystem from here too: an isolated
//! flavour's slots carry theirs under the overlay, and `pool/upper-<fs>-<size>/` holds
//! bare upper filesystems (formatted, attached, mounted; no overlay) that a create of
//! any image claims, so mkfs and the loop attach stay off the create path.

use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{ContainerClaim, ContainerDirs, Store, StoreError};
use lamina_sys::Mounter;
use serde::{Deserialize, Serialize};

pub use crate::providers::pooled::fill::{FillRequest, fill_for};

use crate::model::Flavour;
use crate::model::record::UpperFsRecord;
use crate::{RootfsError, Strategies, UpperPlan, lowers::plan, uppers::isolated};

const SLOT_RECORD: &str = "slot.json";

/// Written into each slot: the options its overlay was mounted with.
#[derive(Debug, Serialize, Deserialize)]
struct SlotRecord {
    mount_options: Vec<String>,
}

/// A pool's wanted size and what it is a pool of, next to it as `<pool>.target`: enough
/// for a refill (background after a claim, or by `lamina daemon`) without the image.
#[derive(Debug, Serialize, Deserialize)]
struct Target {
    size: usize,
    layers: Vec<Digest>,
    flavour: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upper_fs: Option<UpperFsRecord>,
}

/// What a pool holds: read-write overlays of an image's layers in one mount flavour, or
/// (no layers) bare isolated upper filesystems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKind {
    pub layers: Vec<Digest>,
    pub flavour: Flavour,
    /// The upper filesystem each slot has of its own: set exactly for isolated flavours.
    pub upper: Option<UpperPlan>,
}

impl PoolKind {
    /// Overlays of `layers` mounted as `flavour` says; `upper` is used when the flavour is
    /// isolated.
    pub fn overlays(layers: &[Digest], flavour: Flavour, upper: Option<UpperPlan>) -> Self {
        PoolKind {
            layers: layers.to_vec(),
            flavour,
            upper: flavour.isolated.and(upper),
        }
    }

    /// Bare upper filesystems made as `plan` says, for an isolated create of any image.
    pub fn uppers(plan: UpperPlan) -> Self {
        PoolKind {
            layers: Vec::new(),
            flavour: Flavour {
                isolated: Some(plan.backend),
                ..Flavour::PLAIN
            },
            upper: Some(plan),
        }
    }

    fn name(&self) -> Option<String> {
        let suffix = self.upper.map(|u| u.pool_suffix());
        match (self.layers.last(), suffix) {
            (None, Some(suffix)) => Some(format!("upper-{suffix}")),
            (None, None) => None,
            (Some(top), suffix) => {
                let flavour = self.flavour.to_string().replace(',', "+");
                Some(match suffix {
                    Some(suffix) => format!("{}-{flavour}-{suffix}", top.hex()),
                    None => format!("{}-{flavour}", top.hex()),
                })
            }
        }
    }

    /// Where a slot's mount that `claim` checks lives: the overlay, or a bare upper's
    /// filesystem.
    fn slot_mount(&self, slot: &Path) -> PathBuf {
        if self.layers.is_empty() {
            ContainerDirs::isolated(slot.to_path_buf()).upper_fs_mount()
        } else {
            slot.join("rootfs")
        }
    }
}

/// What `fill` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Filled {
    pub added: usize,
    pub ready: usize,
}

fn pool_dir(store: &Store, name: &str) -> PathBuf {
    store.layout().pool().join(name)
}

/// Sub-directories of `dir` (pools, or a pool's slots), sorted.
fn slots(dir: &Path) -> Vec<PathBuf> {
    let mut slots: Vec<PathBuf> = unsorted_slots(dir).collect();
    slots.sort();
    slots
}

/// Sub-directories of `dir` in directory order, read lazily: the create path stops at
/// the first usable slot instead of listing and sorting a large pool.
fn unsorted_slots(dir: &Path) -> impl Iterator<Item = PathBuf> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
}

/// Whether the pool of this kind has a slot to claim (one readdir, stopping at the
/// first slot).
pub fn ready(store: &Store, kind: &PoolKind) -> bool {
    kind.name()
        .is_some_and(|name| unsorted_slots(&pool_dir(store, &name)).next().is_some())
}

/// One pool as it stands, for the daemon's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Depth {
    /// Its directory under `pool/`: the image's top chain ID and the flavour, or
    /// `upper-…` for bare upper filesystems.
    pub name: String,
    /// The top layer of the image its slots are overlays of, as its target names it;
    /// none for bare upper filesystems (or a pool without a readable target).
    pub image: Option<Digest>,
    /// Its slots: ready, being claimed, or unmounted by a reboot (until `clean` removes
    /// them), as `fill` counts them.
    pub slots: usize,
    /// The size its target asks refills to restore, if it has one.
    pub target: Option<usize>,
}

/// Every pool, sorted by name: a readdir of `pool/` and one of each pool, and each
/// target read. Nothing is locked or mounted, so a pool being filled or claimed from
/// shows as it was a moment ago.
pub fn depths(store: &Store) -> Vec<Depth> {
    slots(&store.layout().pool())
        .into_iter()
        .filter_map(|dir| {
            let name = dir.file_name()?.to_str()?.to_string();
            let target = read_target(&dir.with_extension("target"));
            Some(Depth {
                image: target.as_ref().and_then(|t| t.layers.last().cloned()),
                target: target.map(|t| t.size),
                slots: unsorted_slots(&dir).count(),
                name,
            })
        })
        .collect()
}

/// Mounts slots until the pool holds `size` of them. Layers must be imported. `size` is
/// remembered as the pool's target; `None` (a refill after a claim) restores it.
pub fn fill(
    store: &Store,
    mounter: &dyn Mounter,
    kind: &PoolKind,
    size: Option<usize>,
) -> Result<Filled, RootfsError> {
    let Some(name) = kind.name() else {
        return Ok(Filled { added: 0, ready: 0 });
    };
    let dir = pool_dir(store, &name);
    fs::create_dir_all(&dir).map_err(StoreError::io("creating", &dir))?;
    let _lock = store.lock(&format!("pool-{name}"))?;
    let _layers_in_use = store.use_layers()?;
    if let Some(missing) = kind.layers.iter().find(|l| !store.has_layer(l)) {
        return Err(StoreError::LayerMissing(missing.to_string()).into());
    }
    let target = dir.with_extension("target");
    let size = match size {
        Some(size) => {
            let json = serde_json::to_vec(&Target {
                size,
                layers: kind.layers.clone(),
                flavour: kind.flavour.to_string(),
                upper_fs: kind.upper.map(|u| u.record()),
            })
            .map_err(|e| StoreError::io("encoding", &target)(e.into()))?;
            // Durable: layer collection keeps what a pool's target names.
            store.write_durably(&target, &json)?;
            size
        }
        None => read_target(&target).map_or(0, |t| t.size),
    };
    let mut ready = slots(&dir).len();
    let mut added = 0;
    while ready < size {
        let (staged, lock) = store.stage_container_dirs("pool")?;
        let made = make_slot(store, mounter, kind, &staged.base).and_then(|mount_options| {
            let record = SlotRecord { mount_options };
            let path = staged.base.join(SLOT_RECORD);
            let json = serde_json::to_vec(&record)
                .map_err(|e| StoreError::io("encoding", &path)(e.into()))?;
            store.write_durably(&path, &json)?;
            store.pause_point("pool-slot-made");
            let slot = dir.join(lamina_store::unique_suffix());
            fs::rename(&staged.base, &slot).map_err(StoreError::io("adding to pool", &slot))?;
            Ok(())
        });
        if let Err(e) = made {
            let _ = crate::uppers::remove_unmounted(mounter, &staged.base);
            return Err(e);
        }
        drop(lock);
        ready += 1;
        added += 1;
    }
    tracing::info!(pool = %name, added, ready, "filled pool");
    Ok(Filled { added, ready })
}

/// Mounts what a slot of `kind` holds in the staged directory `base`: its own upper
/// filesystem if isolated, then the overlay if the pool is an image's. Returns the
/// overlay's options (none for a bare upper).
fn make_slot(
    store: &Store,
    mounter: &dyn Mounter,
    kind: &PoolKind,
    base: &Path,
) -> Result<Vec<String>, RootfsError> {
    let dirs = match &kind.upper {
        Some(upper) => isolated::make(mounter, base, upper)?,
        None => ContainerDirs::under(base.to_path_buf()),
    };
    if kind.layers.is_empty() {
        return Ok(Vec::new());
    }
    if kind.flavour.composefs {
        crate::lowers::composefs::mounted(store, mounter, &kind.layers)?;
    }
    let spec = plan::read_write(store, &kind.layers, &dirs, kind.flavour);
    mounter.mount_overlay(&spec, &dirs.rootfs)?;
    Ok(spec.option_strings())
}

fn read_target(path: &Path) -> Option<Target> {
    serde_json::from_slice(&lamina_store::read_regular_file(path).ok()?).ok()
}

/// The layers of every pool's target: a pool is an operator's standing order for an
/// image, so layer collection keeps them.
pub(crate) fn target_layers(store: &Store) -> Vec<Vec<Digest>> {
    targets(store).into_iter().map(|t| t.layers).collect()
}

/// The images (top chain ID hex) of every pool target whose slots are composefs
/// overlays: collection keeps their metadata images (and so their objects), as it keeps
/// the layers.
pub(crate) fn composefs_target_images(store: &Store) -> Vec<String> {
    target_files(store)
        .into_iter()
        // A pool with no slot mounts nothing of its image: counted as mounting it, a target
        // whose image failed to build would make `clean` keep every object, as if a mounted
        // image's references were unknown. `clean` still keeps the image for refills.
        .filter(|p| unsorted_slots(&p.with_extension("")).next().is_some())
        .filter_map(|p| read_target(&p))
        .filter(|t| Strategies::parse(&t.flavour).is_ok_and(|s| s.composefs))
        .filter_map(|t| t.layers.last().map(|top| top.hex().to_string()))
        .collect()
}

fn targets(store: &Store) -> Vec<Target> {
    target_files(store)
        .into_iter()
        .filter_map(|p| read_target(&p))
        .collect()
}

/// Every pool's `<name>.target` file.
fn target_files(store: &Store) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(store.layout().pool()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "target"))
        .collect()
}

/// Refills every pool that has a target back to its size. Returns slots added.
pub fn refill_all(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    let mut added = 0;
    let pools = store.layout().pool();
    let Ok(entries) = fs::read_dir(&pools) else {
        return Ok(0);
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|e| e != "target") {
            continue;
        }
        let Some(target) = read_target(&path) else {
            continue;
        };
        let Ok(flavour) = Strategies::parse(&target.flavour).map(Flavour::of) else {
            continue;
        };
        let upper = match &target.upper_fs {
            Some(record) => match UpperPlan::from_record(record) {
                Ok(plan) => Some(plan),
                Err(_) => continue,
            },
            None => None,
        };
        let kind = PoolKind {
            layers: target.layers,
            flavour,
            upper,
        };
        match fill(store, mounter, &kind, None) {
            Ok(filled) => added += filled.added,
            // Collected since: nothing to refill from until the image is used again.
            Err(RootfsError::Store(StoreError::LayerMissing(_))) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(added)
}

/// Claims a ready slot as container `id`, or `None` if the pool has none. No mount
/// syscall: a lock, a statx to skip slots a reboot unmounted, and a rename. The claim's
/// directories are in the slot's shape (isolated or not).
pub(crate) fn claim(
    store: &Store,
    mounter: &dyn Mounter,
    kind: &PoolKind,
    id: &str,
) -> Result<Option<(ContainerClaim, Vec<String>)>, RootfsError> {
    let Some(name) = kind.name() else {
        return Ok(None);
    };
    for slot in unsorted_slots(&pool_dir(store, &name)) {
        let Some(lock) = store.try_lock_dir(&slot)? else {
            continue; // another create is claiming it
        };
        // No record: claimed meanwhile. Not mounted: a reboot unmounted it (clean removes it).
        let Some(record) = lamina_store::read_regular_file(&slot.join(SLOT_RECORD))
            .ok()
            .and_then(|b| serde_json::from_slice::<SlotRecord>(&b).ok())
        else {
            continue;
        };
        if !mounter
            .is_mountpoint(&kind.slot_mount(&slot))
            .unwrap_or(false)
        {
            continue;
        }
        match store.publish_container(&slot, lock, id) {
            Ok(mut claim) => {
                claim.dirs = ContainerDirs::shaped(claim.dirs.base, kind.upper.is_some());
                let _ = fs::remove_file(claim.dirs.base.join(SLOT_RECORD));
                return Ok(Some((claim, record.mount_options)));
            }
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// Unmounts and removes every slot nobody is claiming. Returns how many went.
pub fn drain(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    release(store, mounter, |_| true, Orders::Cancel)
}

/// Removes the slots a host restart (or a stray unmount) left with nothing mounted:
/// `clean` does this, and leaves ready slots to the operator's `pool drain`.
pub(crate) fn release_stale(store: &Store, mounter: &dyn Mounter) -> Result<usize, RootfsError> {
    release(
        store,
        mounter,
        |slot| {
            !["rootfs", "upperfs"]
                .iter()
                .any(|dir| mounter.is_mountpoint(&slot.join(dir)).unwrap_or(false))
        },
        Orders::Keep,
    )
}

/// What a release does to the pools' standing orders (`.target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Orders {
    /// `drain`: an emptied pool is forgotten, so a refill racing the drain adds nothing.
    Cancel,
    /// `clean`: a pool whose slots were all claimed (or went stale) is still wanted; the
    /// next refill makes its slots again.
    Keep,
}

/// Unmounts and removes the unclaimed slots `doomed` picks.
fn release(
    store: &Store,
    mounter: &dyn Mounter,
    doomed: impl Fn(&Path) -> bool,
    orders: Orders,
) -> Result<usize, RootfsError> {
    let mut released = 0;
    for dir in slots(&store.layout().pool()) {
        // A drain waits out a fill of the pool in flight (it holds this lock from reading
        // the target to its last slot), so no slot the fill adds outlives the drain, and a
        // fill after it finds no target. `clean` does not wait: it keeps the orders.
        let _filling = match orders {
            Orders::Cancel => {
                let name = dir.file_name().unwrap_or_default().to_string_lossy();
                Some(store.lock(&format!("pool-{name}"))?)
            }
            Orders::Keep => None,
        };
        for slot in slots(&dir) {
            let Some(_lock) = store.try_lock_dir(&slot)? else {
                continue;
            };
            if !slot.exists() || !doomed(&slot) {
                continue;
            }
            crate::uppers::remove_unmounted(mounter, &slot)?;
            released += 1;
        }
        if orders == Orders::Cancel && fs::remove_dir(&dir).is_ok() {
            let _ = fs::remove_file(dir.with_extension("target"));
        }
    }
    Ok(released)
}
