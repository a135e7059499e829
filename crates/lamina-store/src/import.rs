//! Importing layers: stream each blob through digest checks and decompression into the
//! unpacker, in a temporary directory, and rename it into `layers/` only once every
//! digest matched and the data is on disk. A layer directory under `layers/` is therefore
//! always complete and verified; anything else is in `tmp/` and never trusted.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use lamina_image::{Digest, HashingReader, Image, LayerBlob, compression};

/// Layers one import fetches and unpacks at once.
pub const PARALLEL_IMPORTS: usize = 3;
use serde::{Deserialize, Serialize};

use crate::file_objects;
use crate::layers_below::LayersBelow;
use crate::progress::Reported;
use crate::{Store, StoreError};

/// The layer an import is working on, and what it knows of the layers below it.
#[derive(Clone, Copy)]
struct Below<'a> {
    layers: &'a LayersBelow<'a>,
    index: usize,
}

/// Recorded next to each unpacked layer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerRecord {
    pub chain_id: Digest,
    /// Digest of the uncompressed tar; unknown for a layer a containerd snapshot commit
    /// made (containerd verified it before writing the files).
    #[serde(default)]
    pub diff_id: Option<Digest>,
    /// Digest of the blob as it came, where the source declared one.
    pub blob_digest: Option<Digest>,
    /// Uncompressed tar size.
    pub size: u64,
    /// Whiteouts and opaque markers in the layer; unknown for layers imported before
    /// lamina counted them.
    #[serde(default)]
    pub overlay_markers: Option<u64>,
    /// The import wrote `file-list` beside the tree (`file_list.rs`): its absence is damage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub file_list: bool,
    /// Files of the tree may be stubs whose data is in `objects/` (`object_layers.rs`):
    /// the layer's manifest names the objects it needs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub objects: bool,
}

impl LayerRecord {
    /// The record in layer directory `layer_dir` (`layers/<chain-id-hex>`).
    pub fn read(layer_dir: &Path) -> Result<LayerRecord, StoreError> {
        let path = layer_dir.join("layer.json");
        let bytes = crate::read_regular_file(&path).map_err(StoreError::io("reading", &path))?;
        serde_json::from_slice(&bytes).map_err(|e| StoreError::io("reading", &path)(e.into()))
    }

    /// Whether lamina imported the layer and verified it against its diffID: nothing
    /// writes its files. A committed containerd snapshot has no diffID, and its
    /// container may still write its upper through containerd's mount.
    pub fn imported(&self) -> bool {
        self.diff_id.is_some()
    }
}

/// Removes a directory when dropped unless disarmed: an unpack that fails or panics
/// leaves nothing behind.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = crate::remove_tree(path);
        }
    }
}

impl Store {
    /// Makes sure every layer of `image` is in the store, importing the missing ones, and
    /// returns their chain IDs bottom-most first.
    ///
    /// Layers are independent directories, so up to [`PARALLEL_IMPORTS`] are fetched and
    /// unpacked at once (a registry pull is mostly waiting on the network). The first
    /// failure, bottom-most first, is the one reported; layers that finished stay.
    pub fn import(&self, image: &Image) -> Result<Vec<Digest>, StoreError> {
        self.import_except(image, |_| false)
    }

    /// [`Store::import`] of every layer but those `skip` names by index (bottom-most 0):
    /// layers present some other way (lazy pulling's).
    pub fn import_except(
        &self,
        image: &Image,
        skip: impl Fn(usize) -> bool,
    ) -> Result<Vec<Digest>, StoreError> {
        let chain_ids = image.chain_ids();
        let mut missing = Vec::new();
        for (index, (layer, chain_id)) in image.layers.iter().zip(&chain_ids).enumerate() {
            if skip(index) {
                continue;
            }
            if self.has_layer(chain_id) {
                self.progress.present(layer);
            } else {
                missing.push((index, layer, chain_id));
            }
        }
        let below = LayersBelow::new(&self.layout, &chain_ids, missing.iter().map(|m| m.0));
        let next = std::sync::atomic::AtomicUsize::new(0);
        // Set by the first layer to fail: no worker starts another, and downloads in
        // flight stop at their next read (their "cancelled" errors are never reported).
        let failed = std::sync::atomic::AtomicBool::new(false);
        let first_error: std::sync::Mutex<Option<StoreError>> = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL_IMPORTS.min(missing.len()) {
                scope.spawn(|| {
                    while !failed.load(std::sync::atomic::Ordering::Relaxed) {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(index, layer, chain_id)) = missing.get(i) else {
                            return;
                        };
                        let _settle = below.settle_on_drop(index);
                        let below = Below {
                            layers: &below,
                            index,
                        };
                        if let Err(e) = self.ensure_layer(layer, chain_id, &failed, below) {
                            let mut first = first_error
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            if !failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                                *first = Some(e);
                            }
                            return;
                        }
                    }
                });
            }
        });
        let first = first_error
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match first {
            Some(e) => Err(e),
            None => Ok(chain_ids),
        }
    }

    /// Imports one layer, `layer`, whose chain is `chain_ids[..=index]` (the layers below
    /// it need not be present): how a lazy layer becomes an ordinary one. Verified as
    /// every import is: the blob's digest and size, and the tar's diffID.
    pub fn import_layer(
        &self,
        chain_ids: &[Digest],
        index: usize,
        layer: &LayerBlob,
    ) -> Result<(), StoreError> {
        let chain_id = chain_ids.get(index).ok_or_else(|| StoreError::Layer {
            layer: layer.describe(),
            message: format!("no chain ID at position {index}"),
        })?;
        let below = LayersBelow::new(&self.layout, &chain_ids[..=index], std::iter::once(index));
        let _settle = below.settle_on_drop(index);
        let cancelled = std::sync::atomic::AtomicBool::new(false);
        self.ensure_layer(
            layer,
            chain_id,
            &cancelled,
            Below {
                layers: &below,
                index,
            },
        )
    }

    pub fn has_layer(&self, chain_id: &Digest) -> bool {
        self.layout.layer(chain_id).is_dir()
    }

    fn ensure_layer(
        &self,
        layer: &LayerBlob,
        chain_id: &Digest,
        cancelled: &std::sync::atomic::AtomicBool,
        below: Below<'_>,
    ) -> Result<(), StoreError> {
        // One importer per layer: concurrent creates of images that share it wait here,
        // then find it done.
        let _lock = self.lock_layer(chain_id)?;
        if self.has_layer(chain_id) {
            self.progress.present(layer);
            return Ok(());
        }
        self.progress.started(layer);
        let imported = self.import_locked(layer, chain_id, cancelled, below);
        self.progress.finished(layer, imported.is_ok());
        imported
    }

    /// Imports `layer` as `chain_id`; the caller holds its lock and found it missing.
    fn import_locked(
        &self,
        layer: &LayerBlob,
        chain_id: &Digest,
        cancelled: &std::sync::atomic::AtomicBool,
        below: Below<'_>,
    ) -> Result<(), StoreError> {
        let (staging, staging_dir) = self.fresh_staging(chain_id)?;
        let mut guard = RemoveOnDrop(Some(staging.clone()));
        let diff = staging.join("diff");
        fs::create_dir(&diff).map_err(StoreError::io("creating", &diff))?;

        let started = std::time::Instant::now();
        let mut record = self.unpack_verified(layer, chain_id, &diff, cancelled)?;
        if self.properties.chowns_layers() {
            crate::shift::shift_ownership(&*self.host, &diff, &self.properties.id_map).map_err(
                |e| StoreError::Layer {
                    layer: layer.describe(),
                    message: format!("chowning to the store's id mappings: {e}"),
                },
            )?;
        }
        // Every entry as the import verified it, for `check --verify`: after the chown,
        // before anything links the files (which keeps all that is listed).
        // A layer that cannot be listed (a file this process may not read, when lamina
        // runs without root) is imported without a list, as one past the bounds is:
        // `check --verify` counts it as unlisted.
        let list_path = staging.join(crate::file_list::FILE_LIST);
        let mut listed_files = None;
        let collect = self.properties.shared_file_content || self.properties.layer_data_in_objects;
        record.file_list = match crate::file_list::write(
            &*self.host,
            &diff,
            &list_path,
            collect,
            cancelled,
        ) {
            Ok(listed) => {
                listed_files = listed;
                listed_files.is_some()
            }
            Err(_) if cancelled.load(std::sync::atomic::Ordering::Relaxed) => {
                return Err(StoreError::Layer {
                    layer: layer.describe(),
                    message: "the import is being given up".into(),
                });
            }
            Err(e) => {
                tracing::info!(layer = %layer.describe(), error = %e, "layer imported without a list of its entries");
                false
            }
        };
        let staged = self
            .stage_file_objects(&diff, listed_files, below, cancelled)
            .map_err(|e| StoreError::Layer {
                layer: layer.describe(),
                message: format!("storing its files as objects: {e}"),
            })?;
        record.objects = staged
            .as_ref()
            .is_some_and(|s| s.to_move.iter().any(|(_, nlink, _)| *nlink == 1));
        self.publish_staged(&staging, &staging_dir, &record, staged.as_ref())?;
        guard.0 = None;
        let (linked, linked_bytes) = staged.map_or((0, 0), |s| (s.linked, s.linked_bytes));
        tracing::info!(
            layer = %layer.describe(), chain_id = %chain_id, bytes = record.size,
            linked, linked_bytes, ms = started.elapsed().as_millis() as u64, "imported layer"
        );
        Ok(())
    }

    /// Makes directory `diff` (on the store's filesystem: a committed containerd
    /// snapshot's upper) the layer `chain_id` by moving it, not copying it. Returns false,
    /// leaving `diff` where it was, if the store already has that layer.
    ///
    /// The same lock and staging as an import: `diff` goes to `tmp/layer-<hex>/diff`, its
    /// record beside it, everything is synced, then one rename publishes it. If anything
    /// fails before that rename, `diff` is moved back.
    pub fn publish_layer_dir(&self, chain_id: &Digest, diff: &Path) -> Result<bool, StoreError> {
        let _lock = self.lock_layer(chain_id)?;
        if self.layout.layer(chain_id).is_dir() {
            return Ok(false);
        }
        let (staging, staging_dir) = self.fresh_staging(chain_id)?;
        let mut guard = RemoveOnDrop(Some(staging.clone()));
        let record = LayerRecord {
            chain_id: chain_id.clone(),
            diff_id: None,
            blob_digest: None,
            size: crate::disk_usage(diff)?,
            overlay_markers: None,
            file_list: false,
            objects: false,
        };
        let staged_diff = staging.join("diff");
        fs::rename(diff, &staged_diff).map_err(StoreError::io("moving", diff))?;
        if let Err(e) = self.publish_staged(&staging, &staging_dir, &record, None) {
            if let Err(back) = fs::rename(&staged_diff, diff) {
                // The files are only in the staging directory now: it stays, for the
                // caller's recovery to move back (a commit's intent names it).
                guard.0 = None;
                tracing::error!(staged = %staged_diff.display(), error = %back, "a failed publish could not move its files back; they stay staged");
            }
            return Err(e);
        }
        guard.0 = None;
        tracing::info!(chain_id = %chain_id, bytes = record.size, "published committed snapshot as a layer");
        Ok(true)
    }

    /// Takes layer `chain_id`'s lock: one writer per layer. The lock dies with its
    /// process, so a crash never blocks; a live writer stuck on its blob is waited for
    /// at most the store's lock timeout.
    fn lock_layer(&self, chain_id: &Digest) -> Result<File, StoreError> {
        let lock_path = self.layout.layer_lock(chain_id);
        let lock = crate::locks::open_lock_file(&lock_path)
            .map_err(StoreError::io("creating lock", &lock_path))?;
        self.wait_for_flock(&lock, &lock_path, false)?;
        Ok(lock)
    }

    /// An empty `tmp/layer-<hex>/` to stage layer `chain_id` in, and it opened: the
    /// descriptor a `syncfs` of the layer goes through, opened before anything is written
    /// so that the sync reports every write the device refused since (a descriptor opened
    /// later misses an error someone else has already been told of). The caller holds the
    /// layer's lock, so anything already there is a crashed writer's leftover.
    fn fresh_staging(&self, chain_id: &Digest) -> Result<(PathBuf, File), StoreError> {
        let staging = self.layout.tmp().join(format!("layer-{}", chain_id.hex()));
        if staging.exists() {
            tracing::info!(path = %staging.display(), "removing an interrupted layer import");
            crate::remove_tree(&staging).map_err(StoreError::io("removing", &staging))?;
        }
        fs::create_dir(&staging).map_err(StoreError::io("creating", &staging))?;
        let dir = File::open(&staging).map_err(StoreError::io("opening", &staging))?;
        Ok((staging, dir))
    }

    /// Writes `record` beside the staged `diff/`, makes everything durable, and renames
    /// `staging` into `layers/`. The rename is what makes the layer trusted, so its data
    /// must be durable first: after a crash, a layer under layers/ must never have lost
    /// its contents.
    ///
    /// Where the store's journal orders a direct write ahead of what it logs later
    /// (`HostFs::write_new_direct`: journaled ext4 and xfs whose commits flush the
    /// device's cache first), no `syncfs` is needed: the record is written direct, the
    /// layer's own files are written to the device and waited for (`HostFs::write_back`),
    /// and every change to the tree is in the journal before the rename that publishes
    /// it, so the commit that makes the rename durable — whose flush comes before its
    /// commit record — makes the whole layer durable. A `syncfs` wrote every container's
    /// dirty data on the store's filesystem too, for each layer a pull imported or a
    /// containerd unpack committed: a stall of its neighbours of the S1 kind.
    ///
    /// Everything else is synced whole first, as before: other filesystems, a tree with a
    /// symlink long enough for a block of its own (its block is not a file to write back),
    /// or one too big to walk ([`WRITE_BACK_WALK`] entries).
    fn publish_staged(
        &self,
        staging: &Path,
        staging_dir: &File,
        record: &LayerRecord,
        staged: Option<&file_objects::Staged>,
    ) -> Result<(), StoreError> {
        let manifest = staging.join(file_objects::MANIFEST);
        if let Some(staged) = staged {
            fs::write(&manifest, file_objects::manifest_bytes(&staged.digests))
                .map_err(StoreError::io("writing", &manifest))?;
        }
        let list_path = staging.join(crate::file_list::FILE_LIST);
        let record_path = staging.join("layer.json");
        let json = serde_json::to_vec_pretty(record)
            .map_err(|e| StoreError::io("encoding", &record_path)(e.into()))?;
        let direct = self
            .host
            .write_new_direct(&record_path, &json)
            .map_err(StoreError::errno("writing", &record_path))?;
        let written_back = direct
            && self.write_back_files(&staging.join("diff"))?
            && (staged.is_none() || self.write_back_file(&manifest)?)
            && (!record.file_list || self.write_back_file(&list_path)?);
        if !written_back {
            if !direct {
                fs::write(&record_path, json).map_err(StoreError::io("writing", &record_path))?;
            }
            self.host
                .syncfs(staging_dir, staging)
                .map_err(StoreError::errno("syncing", staging))?;
        }
        // The layer's data is durable: its new contents may become objects now.
        let mut _objects_kept = None;
        if let Some(staged) = staged {
            file_objects::publish(
                &staging.join("diff"),
                &self.layout.objects(),
                &staged.to_publish,
            );
            if record.objects {
                // No collection may remove an object this layer's stubs name before its
                // manifest is in `layers/`.
                _objects_kept = Some(self.use_layers()?);
                self.move_data_to_objects(staging, staging_dir, &staged.to_move, written_back)?;
            }
        }
        let final_dir = self.layout.layer(&record.chain_id);
        fs::rename(staging, &final_dir).map_err(StoreError::io("publishing layer", &final_dir))
    }

    /// Moves the staged layer's file data into `objects/`, leaving stubs, and makes the
    /// stubs as durable as the tree they replace: where the journal orders them before
    /// the publishing rename (`written_back`) nothing more is needed, otherwise the
    /// filesystem is synced again.
    fn move_data_to_objects(
        &self,
        staging: &Path,
        staging_dir: &File,
        files: &[(PathBuf, u64, file_objects::ObjectId)],
        written_back: bool,
    ) -> Result<(), StoreError> {
        let diff = staging.join("diff");
        let stubs = staging.join("stubs");
        fs::create_dir(&stubs).map_err(StoreError::io("creating", &stubs))?;
        let moved = crate::object_layers::move_data(
            &*self.host,
            &diff,
            &stubs,
            &self.layout.objects(),
            files,
        )
        .map_err(StoreError::io("moving file data to objects from", &diff))?;
        fs::remove_dir(&stubs).map_err(StoreError::io("removing", &stubs))?;
        if !written_back {
            self.host
                .syncfs(staging_dir, staging)
                .map_err(StoreError::errno("syncing", staging))?;
        }
        tracing::debug!(
            files = moved.files,
            bytes = moved.bytes,
            deduplicated = moved.deduplicated,
            "layer data moved to objects"
        );
        Ok(())
    }

    /// Writes every regular file with bytes under `diff` to the device and waits for it,
    /// a batch of files at a time (see [`write_back_batch`]): each batch is started whole
    /// first, so the device sees its files together. `Ok(false)`: the tree is not one this
    /// can make durable file by file (see [`files_with_data`]), or a file could not be
    /// opened as the regular file it was (replaced meanwhile: a commit's upper may still be
    /// reachable through a mount); the caller syncs the filesystem instead, which covers
    /// whatever this did.
    ///
    /// A write the device refused is an error, never a reason to sync instead: the error
    /// is reported once, to the first descriptor that asks, so a `syncfs` after it would
    /// succeed and publish the layer with the pages the device never took (a layer that
    /// reads back as zeros after a pull that exited 0).
    fn write_back_files(&self, diff: &Path) -> Result<bool, StoreError> {
        let Ok(tree) = crate::beneath::Tree::open(diff) else {
            return Ok(false);
        };
        let Some(files) = files_with_data(&tree) else {
            return Ok(false);
        };
        for batch in files.chunks(write_back_batch()) {
            let Ok(open) = batch
                .iter()
                .map(|rel| tree.open_regular(rel).map(|file| (file, diff.join(rel))))
                .collect::<Result<Vec<_>, _>>()
            else {
                return Ok(false);
            };
            for wait in [false, true] {
                for (file, path) in &open {
                    self.host
                        .write_back(file, path, wait)
                        .map_err(StoreError::errno("writing to the device", path))?;
                }
            }
        }
        Ok(true)
    }

    /// Writes the file `path` (beside a staged layer) to the device and waits for it.
    /// `Ok(false)` when it cannot be opened as the regular file it was.
    fn write_back_file(&self, path: &Path) -> Result<bool, StoreError> {
        let Ok(file) = crate::open_regular_file(path) else {
            return Ok(false);
        };
        for wait in [false, true] {
            self.host
                .write_back(&file, path, wait)
                .map_err(StoreError::errno("writing to the device", path))?;
        }
        Ok(true)
    }

    /// Hashes the staged layer `diff`'s files and links those it may to the store's
    /// objects (`file_objects.rs`). `None` (no manifest) unless the store shares file
    /// content and has `objects/`, or when the layer is past what is hashed. Nothing is
    /// linked or published when what lies below the layer is not known.
    fn stage_file_objects(
        &self,
        diff: &Path,
        listed: Option<file_objects::Hashed>,
        below: Below<'_>,
        cancelled: &std::sync::atomic::AtomicBool,
    ) -> std::io::Result<Option<file_objects::Staged>> {
        let objects = self.layout.objects();
        let sharing = self.properties.shared_file_content;
        let moving = self.properties.layer_data_in_objects;
        if !(sharing || moving) || !objects.is_dir() {
            return Ok(None);
        }
        // The listing's digests where it was written; else the files are read again.
        let hashed = match listed {
            Some(hashed) => hashed,
            None => match file_objects::hash(diff, cancelled)? {
                Some(hashed) => hashed,
                None => return Ok(None),
            },
        };
        if moving {
            // Nothing is linked: a stub is the layer's own inode. What lies below matters
            // only where it could hide an object from overlay (`could_shadow_objects`):
            // a chain ID fixes the layers below, so this is decided once for the layer.
            let (digests, files) = hashed.into_parts();
            let clear_below = files.is_empty()
                || below
                    .layers
                    .dirs(below.index, cancelled)
                    .is_some_and(|dirs| {
                        !dirs.iter().any(|dir| {
                            crate::object_layers::could_shadow_objects(&dir.join("diff"))
                        })
                    });
            if !clear_below {
                tracing::info!(layer = %diff.display(), "a layer below has an objects-like directory at its root: this layer keeps its files' data");
            }
            return Ok(Some(file_objects::Staged {
                digests,
                to_move: if clear_below { files } else { Vec::new() },
                ..Default::default()
            }));
        }
        // The layers below are waited for only when there is something to link.
        let known_below = if hashed.is_empty() {
            None
        } else {
            below.layers.manifests(below.index, cancelled)
        };
        match known_below {
            Some(manifests) => {
                file_objects::link(&*self.host, diff, &objects, hashed, &manifests).map(Some)
            }
            None => Ok(Some(file_objects::Staged {
                digests: hashed.digests,
                ..Default::default()
            })),
        }
    }

    fn unpack_verified(
        &self,
        layer: &LayerBlob,
        chain_id: &Digest,
        dest: &Path,
        cancelled: &std::sync::atomic::AtomicBool,
    ) -> Result<LayerRecord, StoreError> {
        let what = layer.describe();
        let fail = |message: String| StoreError::Layer {
            layer: what.clone(),
            message,
        };
        // A blob is read no further than its descriptor's size (one byte past, to know it
        // is longer): a layout blob that is endless, or sparse gigabytes of zstd skippable
        // frames that decode to nothing, costs no more than the manifest admits. A rootfs
        // tar has no descriptor; its compressed bytes are bounded by the layer limit.
        let most = match layer.size {
            Some(expected) => {
                // Longer is what costs; a shorter blob is read (briefly) so that what
                // is wrong with its content is named.
                if let Ok(actual) = layer.location.size()
                    && actual > expected
                {
                    return Err(fail(format!(
                        "blob size mismatch: manifest says {expected} bytes, blob has {actual}"
                    )));
                }
                expected
            }
            None => self
                .max_layer_bytes
                .saturating_add(self.max_layer_bytes / 8)
                .saturating_add(1 << 20),
        };
        let blob = layer
            .location
            .open()
            .map_err(|e| fail(format!("opening blob: {e}")))?;
        let blob = Reported {
            inner: std::io::Read::take(blob, most.saturating_add(1)),
            layer,
            progress: &self.progress,
            cancelled,
        };
        let mut stored = HashingReader::new(blob);
        let decoded = compression::decoder(&mut stored, layer.compression, &what)?;
        let mut tar = HashingReader::with_limit(decoded, self.max_layer_bytes);
        let summary = lamina_unpack::unpack_with(&mut tar, dest, self.max_layer_bytes, &*self.host)
            .map_err(|e| fail(e.to_string()))?;
        let (diff_id, size) = tar.finish().map_err(|e| fail(format!("reading: {e}")))?;
        let (blob_digest, blob_size) = stored
            .finish()
            .map_err(|e| fail(format!("reading blob: {e}")))?;

        if let Some(expected) = &layer.digest
            && *expected != blob_digest
        {
            return Err(fail(format!(
                "blob digest mismatch: manifest says {expected}, blob is {blob_digest}"
            )));
        }
        if blob_size > most {
            return Err(fail(match layer.size {
                Some(expected) => {
                    format!("blob size mismatch: manifest says {expected} bytes, blob has more")
                }
                None => format!("blob is past {most} bytes"),
            }));
        }
        if let Some(expected) = layer.size
            && expected != blob_size
        {
            return Err(fail(format!(
                "blob size mismatch: manifest says {expected} bytes, blob has {blob_size}"
            )));
        }
        if diff_id != layer.diff_id {
            // A plain rootfs tar's diffID may have come from the store's memo of it
            // (`tar_memo.rs`): a tar changed in a way its identity did not show is hashed
            // again by the next call instead of failing this check for ever.
            if let (lamina_image::BlobLocation::File(path), None) = (&layer.location, &layer.digest)
            {
                lamina_image::TarMemo::forget(self, path);
            }
            return Err(fail(format!(
                "diffID mismatch: image config says {}, content is {diff_id}",
                layer.diff_id
            )));
        }
        Ok(LayerRecord {
            chain_id: chain_id.clone(),
            diff_id: Some(diff_id),
            blob_digest: layer.digest.clone(),
            size,
            overlay_markers: Some(summary.overlay_markers),
            file_list: false,
            objects: false,
        })
    }

    /// The record written next to an imported layer.
    pub fn layer_record(&self, chain_id: &Digest) -> Result<LayerRecord, StoreError> {
        LayerRecord::read(&self.layout.layer(chain_id))
    }
}

/// The regular files with bytes in `tree` (each inode once: a hardlink's other names
/// are skipped), what a journal commit does not carry, as paths inside it. `None` when
/// the tree also holds what cannot be written back file by file — a symlink long enough
/// for a data block (ext4 keeps up to 59 bytes in the inode) — or more than
/// [`WRITE_BACK_FILES`] such files or [`WRITE_BACK_WALK`] entries, or an entry that
/// was gone or changed by the time it was looked at: such a tree is synced whole.
fn files_with_data(tree: &crate::beneath::Tree) -> Option<Vec<PathBuf>> {
    use rustix::fs::FileType;
    let mut files = Vec::new();
    let mut inodes = std::collections::HashSet::new();
    let mut seen = 0usize;
    let walked = tree.walk(|entry| {
        seen += 1;
        let too_big = || std::io::Error::other("too big to write back file by file");
        if seen > WRITE_BACK_WALK {
            return Err(too_big());
        }
        let size = entry.stat.st_size;
        match entry.kind() {
            FileType::RegularFile if size > 0 => {
                if inodes.insert((entry.stat.st_dev, entry.stat.st_ino)) {
                    files.push(entry.rel());
                }
                if files.len() > WRITE_BACK_FILES {
                    return Err(too_big());
                }
            }
            FileType::Symlink if size >= 60 => return Err(too_big()),
            _ => {}
        }
        Ok(true)
    });
    // Something skipped (a directory renamed or swapped under a live upper's walk) is
    // something not written back: the whole filesystem is synced instead.
    matches!(walked, Ok(true)).then_some(files)
}

/// Files with data past which a layer is synced whole: an open and two calls a file cost
/// about what one `syncfs` does at ~1000 small files when no neighbour has dirty data
/// (measured by review on loop-backed ext4 and xfs: 16 000 files of 4 KiB took 1.3–1.9 s
/// written back against 0.7–1.0 s synced). Past that the neighbours' writeback is the
/// smaller price. Most image layers are far below it.
const WRITE_BACK_FILES: usize = 2048;

/// Entries [`files_with_data`] looks at before the tree is synced whole.
const WRITE_BACK_WALK: usize = 16384;

/// Files opened and written back together: enough for the device to see them at once
/// (256), few enough to stay far from the open-files limit — a sixteenth of the soft
/// limit, since a pull imports three layers at once beside its sockets and blobs: 3 × 256
/// of a soft limit of 1024 leaves a concurrent open failing.
fn write_back_batch() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    usize::try_from(soft / 16)
        .unwrap_or(usize::MAX)
        .clamp(8, 256)
}
