//! pooled (stall S2): read-write overlays mounted ahead of time, one pool per image and
//! mount flavor, at `pool/<top-chain-id>-<flavor>/<slot>/`. A slot is shaped like a
//! container directory (rootfs with the overlay mounted on it, upper, work, lock), so
//! `create` claims one by renaming the slot to `images/<ID>`: the mount moves with its
//! directory and the claim makes no mount syscall, however hard the host is reclaiming.

use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{ContainerClaim, Store, StoreError};
use lamina_sys::Mounter;
use serde::{Deserialize, Serialize};

use crate::{RootfsError, Strategies, plan};

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
    flavor: String,
}

/// What `fill` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Filled {
    pub added: usize,
    pub ready: usize,
}

fn pool_name(chain_ids: &[Digest], flavor: Strategies) -> Option<String> {
    let top = chain_ids.last()?;
    Some(format!(
        "{}-{}",
        top.hex(),
        flavor.mount_flavor().to_string().replace(',', "+")
    ))
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

/// Whether the image's pool of this flavor has a slot to claim (one readdir, stopping
/// at the first slot).
pub fn ready(store: &Store, chain_ids: &[Digest], flavor: Strategies) -> bool {
    pool_name(chain_ids, flavor)
        .is_some_and(|name| unsorted_slots(&pool_dir(store, &name)).next().is_some())
}

/// Mounts slots until the pool holds `size` of them. Layers must be imported. `size` is
/// remembered as the pool's target; `None` (a refill after a claim) restores it.
pub fn fill(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
    flavor: Strategies,
    size: Option<usize>,
) -> Result<Filled, RootfsError> {
    let Some(name) = pool_name(chain_ids, flavor) else {
        return Ok(Filled { added: 0, ready: 0 });
    };
    let dir = pool_dir(store, &name);
    fs::create_dir_all(&dir).map_err(StoreError::io("creating", &dir))?;
    let _lock = store.lock(&format!("pool-{name}"))?;
    let target = dir.with_extension("target");
    let size = match size {
        Some(size) => {
            let json = serde_json::to_vec(&Target {
                size,
                layers: chain_ids.to_vec(),
                flavor: flavor.mount_flavor().to_string(),
            })
            .map_err(|e| StoreError::io("encoding", &target)(e.into()))?;
            fs::write(&target, json).map_err(StoreError::io("writing", &target))?;
            size
        }
        None => read_target(&target).map_or(0, |t| t.size),
    };
    let mut ready = slots(&dir).len();
    let mut added = 0;
    while ready < size {
        let (staged, lock) = store.stage_container_dirs("pool")?;
        let spec = plan::read_write(store, chain_ids, &staged, flavor.mount_flavor());
        let made = mounter
            .mount_overlay(&spec, &staged.rootfs)
            .map_err(RootfsError::from)
            .and_then(|()| {
                let record = SlotRecord {
                    mount_options: spec.option_strings(),
                };
                let path = staged.base.join(SLOT_RECORD);
                let json = serde_json::to_vec(&record)
                    .map_err(|e| StoreError::io("encoding", &path)(e.into()))?;
                fs::write(&path, json).map_err(StoreError::io("writing", &path))?;
                let slot = dir.join(lamina_store::unique_suffix());
                fs::rename(&staged.base, &slot).map_err(StoreError::io("adding to pool", &slot))?;
                Ok(())
            });
        if let Err(e) = made {
            let _ = mounter.unmount(&staged.rootfs);
            let _ = fs::remove_dir_all(&staged.base);
            return Err(e);
        }
        drop(lock);
        ready += 1;
        added += 1;
    }
    tracing::info!(pool = %name, added, ready, "filled pool");
    Ok(Filled { added, ready })
}

fn read_target(path: &Path) -> Option<Target> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
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
        let Ok(flavor) = Strategies::parse(&target.flavor) else {
            continue;
        };
        if target.layers.iter().all(|l| store.has_layer(l)) {
            added += fill(store, mounter, &target.layers, flavor, None)?.added;
        }
    }
    Ok(added)
}

/// Claims a ready slot as container `id`, or `None` if the pool has none. No mount
/// syscall: a lock, a statx to skip slots a reboot unmounted, and a rename.
pub(crate) fn claim(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
    flavor: Strategies,
    id: &str,
) -> Result<Option<(ContainerClaim, Vec<String>)>, RootfsError> {
    let Some(name) = pool_name(chain_ids, flavor) else {
        return Ok(None);
    };
    for slot in unsorted_slots(&pool_dir(store, &name)) {
        let Some(lock) = store.try_lock_dir(&slot)? else {
            continue; // another create is claiming it
        };
        // No record: claimed meanwhile. Not mounted: a reboot unmounted it (clean removes it).
        let Some(record) = fs::read(slot.join(SLOT_RECORD))
            .ok()
            .and_then(|b| serde_json::from_slice::<SlotRecord>(&b).ok())
        else {
            continue;
        };
        if !mounter.is_mountpoint(&slot.join("rootfs")).unwrap_or(false) {
            continue;
        }
        match store.publish_container(&slot, lock, id) {
            Ok(claim) => {
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
    let mut released = 0;
    for dir in slots(&store.layout().pool()) {
        for slot in slots(&dir) {
            let Some(_lock) = store.try_lock_dir(&slot)? else {
                continue;
            };
            if !slot.exists() {
                continue;
            }
            crate::clean::remove_unmounted(mounter, &slot)?;
            released += 1;
        }
        if fs::remove_dir(&dir).is_ok() {
            // Emptied: forget its target, so a refill racing this drain adds nothing.
            let _ = fs::remove_file(dir.with_extension("target"));
        }
    }
    Ok(released)
}
