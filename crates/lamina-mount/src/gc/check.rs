//! `lamina check`: verify the store's invariants (docs/store.md) against the disk, the
//! mount table and the loop devices, and with `repair` fix what is safe to fix. Safe means
//! lamina can tell that nobody is working on it: the same lock rules `clean` uses. What a
//! repair cannot restore (a layer a container needs is gone) is reported and left alone.

use lamina_snapshot_index::StoreSnapshots;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{LayerRecord, Store, StoreError};
use lamina_sys::Mounter;
use serde::Serialize;

use crate::{RootfsError, gc::clean};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// `tmp_abandoned`, `crashed_create`, `pending_delete`, `missing_layer`, `bad_layer`,
    /// `bad_lazy_layer` (a pending layer's provider marked it bad),
    /// `bad_record`, `orphan_mount`, `rootfs_not_mounted`, `leaked_loop_device`,
    /// `snapshot_missing_layer`, `snapshot_missing_container`, `snapshot_missing_upper`,
    /// `snapshot_missing_parent`, `unfinished_commit`; with `--verify`,
    /// `bad_composefs_image`, `bad_object`, `missing_object`, `bad_layer_file`,
    /// `bad_file_list`; `missing_composefs_image`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub detail: String,
    /// Fixed by this run (`--repair`).
    pub repaired: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Nothing is left broken.
    pub ok: bool,
    pub problems: Vec<Problem>,
    pub message: String,
    /// With `--verify`: what the layers' re-hash covered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_layers: Option<crate::gc::layer_verify::LayersVerified>,
}

/// Checks the store; with `repair`, fixes what is safe to fix. Holds the clean lock while
/// it judges `tmp/` and crashed creates, so no clean removes them alongside; creates and
/// deletes may run, and what they have in flight (held locks) is never reported.
pub fn check(
    store: &Store,
    mounter: &dyn Mounter,
    repair: bool,
) -> Result<CheckReport, RootfsError> {
    check_verified(store, mounter, repair, false)
}

/// [`check`], and with `verify`, every composefs metadata image and object re-hashed
/// (`composefs_verify.rs`) and every layer's files against the list its import wrote
/// (`layer_verify.rs`): slow, it reads every byte of them.
pub fn check_verified(
    store: &Store,
    mounter: &dyn Mounter,
    repair: bool,
    verify: bool,
) -> Result<CheckReport, RootfsError> {
    let clean_lock = store.lock("clean")?;
    let mut findings = Findings {
        repair,
        problems: Vec::new(),
    };

    let abandoned = clean::abandoned_tmp(store)?;
    for path in &abandoned {
        let problem = found(
            "tmp_abandoned",
            path,
            "unfinished work whose process is gone",
        );
        findings.fix(problem, &|| crate::uppers::remove_unmounted(mounter, path));
    }
    for (dir, _lock) in clean::crashed_creates(store)? {
        let problem = found(
            "crashed_create",
            &dir,
            "a container directory without a record whose create is gone",
        );
        findings.fix(problem, &|| crate::uppers::remove_unmounted(mounter, &dir));
    }
    drop(clean_lock);

    // Trash is the reaper's queue; a running reaper holds its lock.
    let stale_trash = match store.try_lock("reaper")? {
        Some(_reaper) => store.trash_entries()?,
        None => Vec::new(),
    };
    {
        for dir in &stale_trash {
            let problem = found(
                "pending_delete",
                dir,
                "a deleted container not yet torn down, and no reaper running",
            );
            // Repaired only if it is gone afterwards: the reaper logs and leaves what it
            // cannot remove (a busy rootfs, an immutable file), and reports no error.
            findings.fix(problem, &|| {
                crate::lifecycle::reap::reap(store, mounter)?;
                if dir.exists() {
                    return Err(StoreError::io("tearing down", dir)(std::io::Error::other(
                        "the reaper could not remove it (busy, or a file it may not delete); it stays queued",
                    ))
                    .into());
                }
                Ok(())
            });
        }
    }

    let scan = crate::model::record::scan(store)?;
    for bad in &scan.bad {
        if store.try_lock_dir(bad.dir())?.is_none() {
            continue; // its create is still running
        }
        findings.problems.push(bad_record(bad));
    }
    let records: Vec<_> = scan.containers.iter().map(|c| &c.record).collect();
    // A container with an unreadable record still owns its directory's mounts and loop
    // devices: nothing of it is an orphan.
    let live: HashSet<String> = records
        .iter()
        .map(|r| r.id.clone())
        .chain(scan.bad.iter().map(|b| b.id.clone()))
        .collect();
    for (kind, dir, detail) in crate::providers::bad_pending_layers(store) {
        findings.problems.push(found(kind, &dir, &detail));
    }
    let mut referenced: HashSet<Digest> = HashSet::new();
    for container in &scan.containers {
        let record = &container.record;
        for layer in &record.layers {
            referenced.insert(layer.clone());
            if !store.layout().layer_diff(layer).is_dir()
                && !crate::providers::is_pending_layer(store, layer)
            {
                let detail = format!(
                    "container `{}` needs layer {layer}, which is gone; recreate the container",
                    record.id
                );
                findings.problems.push(found(
                    "missing_layer",
                    &store.layout().layer(layer),
                    &detail,
                ));
            }
        }
        if crate::lowers::composefs::image_of(container).is_some()
            && let Some(top) = record.layers.last()
        {
            let image = crate::lowers::composefs::image_path(store, top);
            if !image.is_file() {
                let detail = format!(
                    "container `{}` mounts this composefs metadata image, which is gone; `mount` builds it again from the layers",
                    record.id
                );
                findings.fix(found("missing_composefs_image", &image, &detail), &|| {
                    let _layers = store.use_layers()?;
                    crate::lowers::composefs::ensure(store, mounter, &record.layers)?;
                    Ok(())
                });
                // Its old mount (if any) shows the image that is gone: `mount` mounts
                // the rebuilt one only where nothing is mounted.
            }
        }
        let rootfs = store.rootfs_path(&record.id);
        let mounted_now = match mounter.is_mountpoint(&rootfs) {
            Ok(mounted) => mounted,
            // Deleted since the scan (a delete renames it into trash/): nothing of it to
            // check, so `check` beside a delete does not fail with ENOENT.
            Err(e) if e.errno == lamina_sys::Errno::NOENT => continue,
            Err(e) => return Err(e.into()),
        };
        if container.rootfs.mounted && !mounted_now {
            let problem = found(
                "rootfs_not_mounted",
                &rootfs,
                "recorded as mounted, but nothing is mounted there (a host restart?)",
            );
            findings.fix(problem, &|| {
                crate::lifecycle::remount::mount(store, mounter, &record.id)
            });
        }
    }

    if let Some(snapshots) = store.snapshots_if_any()? {
        // A commit holds this lock from its start to its end: what is committing below is
        // a commit that stopped, not one in flight.
        let _snapshots_still = store.lock_snapshots()?;
        referenced.extend(snapshots.layers()?);
        let mut keys = std::collections::HashSet::new();
        // (snapshot, the parent it names): its own, or the one its commit goes onto.
        let mut parents = Vec::new();
        snapshots.for_each(|key, snapshot| {
            keys.insert(key.to_string());
            let rebase = snapshot.committing.as_ref().and_then(|c| c.parent.clone());
            for parent in snapshot.parent.iter().cloned().chain(rebase) {
                parents.push((key.to_string(), parent));
            }
            if let Some(committing) = &snapshot.committing {
                let published = store.has_layer(&committing.layer);
                let staged = store
                    .layout()
                    .tmp()
                    .join(format!("layer-{}", committing.layer.hex()));
                let (path, holds) = if published {
                    (store.layout().layer(&committing.layer), "its files are in that layer")
                } else if staged.exists() {
                    (staged, "its files are staged there, on their way to that layer")
                } else {
                    (
                        store
                            .layout()
                            .container(snapshot.container.as_deref().unwrap_or_default()),
                        "its files are still its container's",
                    )
                };
                let detail = format!(
                    "containerd snapshot `{key}` has an unfinished commit to `{}` (layer {}; {holds}): committing it again under that name, or the daemon's next start, finishes or undoes it",
                    committing.name, committing.layer
                );
                findings
                    .problems
                    .push(found("unfinished_commit", &path, &detail));
            } else if let Some(id) = &snapshot.container
                && snapshot.kind == lamina_snapshot_index::SnapshotKind::Active
                && scan
                    .containers
                    .iter()
                    .any(|c| c.id() == id && c.model().upper_in_container_dir())
                && !store.container_dirs(id).upper.exists()
            {
                let detail = format!(
                    "containerd snapshot `{key}` is active, but its container `{id}` has no upper directory: what was written to it is not there"
                );
                findings.problems.push(found(
                    "snapshot_missing_upper",
                    &store.container_dirs(id).upper,
                    &detail,
                ));
            }
            // A remote snapshot's layer is pending until its provider completes it.
            if let Some(layer) = &snapshot.layer
                && !store.has_layer(layer)
                && !crate::providers::is_pending_layer(store, layer)
            {
                let detail =
                    format!("containerd snapshot `{key}` is held by layer {layer}, which is gone");
                findings.problems.push(found(
                    "snapshot_missing_layer",
                    &store.layout().layer(layer),
                    &detail,
                ));
            }
            if let Some(id) = &snapshot.container
                && snapshot.committing.is_none()
                && !live.contains(id)
            {
                let detail = format!(
                    "containerd snapshot `{key}` is provided by container `{id}`, which is gone (after a crash: `lamina daemon` makes it again, empty, when it starts)"
                );
                findings.problems.push(found(
                    "snapshot_missing_container",
                    &store.layout().container(id),
                    &detail,
                ));
            }
        })?;
        for (key, parent) in parents.iter().filter(|(_, p)| !keys.contains(p)) {
            let detail = format!(
                "containerd snapshot `{key}` stands on `{parent}`, which is gone: its layers below cannot be found"
            );
            findings.problems.push(found(
                "snapshot_missing_parent",
                &store.layout().snapshot_db(),
                &detail,
            ));
        }
    }

    for (dir, why) in bad_layers(store)? {
        let chain_hex = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // A container whose record is unreadable may use any layer.
        let used = !scan.bad.is_empty() || referenced.iter().any(|d| d.hex() == chain_hex);
        if used {
            findings.problems.push(found(
                "bad_layer",
                &dir,
                &format!("{why}; in use, so left in place"),
            ));
        } else {
            let problem = found("bad_layer", &dir, &why);
            findings.fix(problem, &|| crate::uppers::remove_unmounted(mounter, &dir));
        }
    }

    let mut verified_layers = None;
    if verify {
        // Read under the layers lock taken shared, as a create holds it: no clean removes
        // an image or object while it is read. Layers take it one at a time.
        let damages = {
            let _layers = store.use_layers()?;
            crate::gc::composefs_verify::verify(store)?
        };
        let (covered, layer_damage) = crate::gc::layer_verify::verify(store)?;
        verified_layers = Some(covered);
        // Not repaired: containers may run the layer's files, and only a new import
        // makes it again (what the detail says to do).
        for damage in layer_damage {
            findings
                .problems
                .push(found(damage.kind, &damage.path, &damage.detail));
        }
        let in_use_at_scan = composefs_in_use(store, &scan);
        for damage in damages {
            let problem = found(damage.kind, &damage.path, &damage.detail);
            let unused = scan.bad.is_empty()
                && damage
                    .image_top
                    .as_ref()
                    .is_some_and(|top| !in_use_at_scan.contains(top));
            if !unused {
                findings.problems.push(problem);
                continue;
            }
            // An image nobody uses goes, with its mount (which shows the damaged bytes);
            // the next create builds and mounts it again. Under the layers lock taken
            // exclusively, as `clean` collects: no create is between building and
            // recording it, and the records are read again under it.
            let top = damage.image_top.clone().unwrap_or_default();
            findings.fix(problem, &|| {
                let _no_create_in_flight = store.collect_layers_lock()?;
                let scan = crate::model::record::scan(store)?;
                if !scan.bad.is_empty() || composefs_in_use(store, &scan).contains(&top) {
                    return Err(RootfsError::Refused(
                        "a container started using it meanwhile: left in place".into(),
                    ));
                }
                crate::uppers::remove_unmounted(mounter, &damage.path.with_extension("mnt"))?;
                // With its digest and marks; a refusal too, so `auto` builds it again.
                crate::lowers::composefs::remove_image(&damage.path).map_err(Into::into)
            });
        }
    }

    for mount in orphan_mounts(store, mounter, &live, &abandoned)? {
        let problem = found(
            "orphan_mount",
            &mount,
            "mounted under the store, and no container, pool slot, shared image or work in flight owns it",
        );
        findings.fix(problem, &|| {
            mounter.unmount(&mount).map(|_| ()).map_err(Into::into)
        });
    }

    for (device, backing) in leaked_loop_devices(store, mounter, &live) {
        let detail = format!(
            "{} is attached to {}, which no container uses",
            device.display(),
            backing.display()
        );
        findings.fix(found("leaked_loop_device", &device, &detail), &|| {
            mounter.detach_loop_device(&device).map_err(Into::into)
        });
    }

    let problems = findings.problems;
    let left = problems.iter().filter(|p| !p.repaired).count();
    let message = match (problems.len(), left) {
        (0, _) => "store is consistent".to_string(),
        (n, 0) => format!("found and repaired {n} problems"),
        (n, left) if repair => format!("found {n} problems; {left} could not be repaired"),
        (n, _) => {
            format!("found {n} problems; run `lamina check --repair` to fix what is safe to fix")
        }
    };
    tracing::info!(problems = problems.len(), left, "checked store");
    Ok(CheckReport {
        ok: left == 0,
        problems,
        message,
        verified_layers,
    })
}

/// The images (top chain ID hex) composefs containers (in `scan`) and pool targets use.
fn composefs_in_use(store: &Store, scan: &crate::model::record::Scan) -> HashSet<String> {
    scan.containers
        .iter()
        .filter_map(crate::lowers::composefs::image_of)
        .chain(crate::providers::pooled::pool::composefs_target_images(
            store,
        ))
        .collect()
}

/// Problems found so far; with `repair`, each fixable one is fixed as it is found.
struct Findings {
    repair: bool,
    problems: Vec<Problem>,
}

impl Findings {
    fn fix(&mut self, mut problem: Problem, action: &dyn Fn() -> Result<(), RootfsError>) {
        if self.repair {
            match action() {
                Ok(()) => problem.repaired = true,
                Err(e) => problem.detail = format!("{}; repair failed: {e}", problem.detail),
            }
        }
        self.problems.push(problem);
    }
}

/// A container whose record cannot be read. Not repairable: the record is the only place
/// that holds the image reference, config digest, environment and layer list, and the
/// mount table cannot name the layers of an idmapped or bind-mounted rootfs, so a rebuilt
/// record would be a guess. `lamina delete` removes the container (unmounting whatever is
/// mounted in it); until then `clean` keeps every layer.
fn bad_record(bad: &lamina_store::BadRecord) -> Problem {
    let detail = format!(
        "container `{}`: record unreadable ({}); it cannot be rebuilt, so it is left for the operator: `lamina delete {}` removes it, then recreate it",
        bad.id, bad.why, bad.id
    );
    found("bad_record", &bad.path, &detail)
}

fn found(kind: &'static str, path: &Path, detail: &str) -> Problem {
    Problem {
        kind,
        path: path.to_path_buf(),
        detail: detail.to_string(),
        repaired: false,
    }
}

/// Layer directories that break invariant 1: no readable record, a record for another
/// chain ID, or no `diff/`.
fn bad_layers(store: &Store) -> Result<Vec<(PathBuf, String)>, RootfsError> {
    let layers = store.layout().layers();
    let mut bad = Vec::new();
    for dir in lamina_store::list_dirs(&layers)? {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let record_path = dir.join("layer.json");
        let why = match lamina_store::read_regular_file(&record_path) {
            Err(e) => Some(format!("layer.json unreadable: {e}")),
            Ok(bytes) => match serde_json::from_slice::<LayerRecord>(&bytes) {
                Err(e) => Some(format!("layer.json is not a layer record: {e}")),
                Ok(r) if r.chain_id.hex() != name => {
                    Some(format!("layer.json names chain ID {}", r.chain_id))
                }
                Ok(_) if !dir.join("diff").is_dir() => Some("no diff/ directory".to_string()),
                Ok(_) => None,
            },
        };
        if let Some(why) = why {
            bad.push((dir, why));
        }
    }
    Ok(bad)
}

/// Mounts under the store that nothing owns. Owned: anything under a recorded container's
/// directory, a pool slot, a shared image (clean releases unused ones), the trash (the
/// reaper's), or a `tmp/` entry whose work is in flight (not among `abandoned`, judged
/// under the clean lock).
fn orphan_mounts(
    store: &Store,
    mounter: &dyn Mounter,
    live: &HashSet<String>,
    abandoned: &[PathBuf],
) -> Result<Vec<PathBuf>, RootfsError> {
    let layout = store.layout();
    let root = layout.root();
    let mut orphans = Vec::new();
    for mount in mounter.mounts_under(root)? {
        if mount == root {
            continue;
        }
        let under = |dir: PathBuf| mount.starts_with(dir);
        let owned = if under(layout.images()) {
            let id = mount
                .strip_prefix(layout.images())
                .ok()
                .and_then(|rel| rel.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            live.contains(&id) || store.try_lock_dir(&layout.container(&id))?.is_none()
        } else if under(layout.composefs()) || crate::providers::serves_mount(store, &mount) {
            // A composefs metadata image's mount (`clean` releases unused ones), or one a
            // provider serves pending layers from.
            true
        } else if under(layout.tmp()) {
            !abandoned.iter().any(|a| mount.starts_with(a))
        } else {
            under(layout.pool()) || under(layout.shared()) || under(layout.trash())
        };
        if !owned {
            orphans.push(mount);
        }
    }
    Ok(orphans)
}

/// Loop devices backed by a file in this store that no recorded container or pool slot
/// uses: the backing file was removed, or lies outside any live container.
fn leaked_loop_devices(
    store: &Store,
    mounter: &dyn Mounter,
    live: &HashSet<String>,
) -> Vec<(PathBuf, PathBuf)> {
    let layout = store.layout();
    mounter
        .loop_backing_files()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(layout.root()))
        .filter(|(_, backing)| {
            let text = backing.to_string_lossy();
            if text.ends_with(" (deleted)") {
                return true;
            }
            let in_live_container = backing
                .strip_prefix(layout.images())
                .ok()
                .and_then(|rel| rel.components().next())
                .is_some_and(|id| live.contains(&*id.as_os_str().to_string_lossy()));
            !(in_live_container
                || backing.starts_with(layout.pool())
                || backing.starts_with(layout.trash())
                || backing.starts_with(layout.tmp()))
        })
        .collect()
}
