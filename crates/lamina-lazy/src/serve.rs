//! Serving a store's lazy layers: one FUSE mount of each layer's objects, on its
//! `objects.mnt`, for as long as this process lives. One server per store, shown by the
//! lock it holds (`lazy/server.lock`): a create checks [`running`] and starts `lamina
//! daemon` when no server is. A mount left by a server that died fails every read
//! (`ENOTCONN`, which overlay passes on): a new server unmounts it and mounts its own, and
//! containers made before keep failing reads of what was missing (never zeros, never a
//! hang) until they are mounted again.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lamina_image::Digest;
use lamina_image::lazy::estargz::prefetch_end;
use lamina_image::lazy::source::Format;
use lamina_registry::PullOptions;
use lamina_store::Store;
use lamina_sys::Mounter;

use crate::complete::{Completed, complete};
use crate::fetched::Fetched;
use crate::layer::{self, LazyRecord};

/// Layers completed at once from one registry host: each is a blob's download and unpack.
/// Counted per host, so a registry that trickles its blobs (an image's own, which it
/// controls) holds back only the completion of its own layers.
const COMPLETING_AT_ONCE: usize = 2;
/// How long a completion that failed (the registry, the disk) waits to be tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// Failed completions of one layer after which it is marked bad: what the network or the
/// host keeps failing is as unusable as what the image gets wrong, and each try fetches
/// the whole blob.
const GIVE_UP_AFTER: u32 = 5;
use crate::{ChunkSource, LazyObject, ObjectsFs, RegistryBlob};

fn lock_path(store: &Path) -> PathBuf {
    layer::lazy_root(store).join("server.lock")
}

/// How long a layer whose serving failed waits to be tried again.
const SERVE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether a server holds `store`'s lazy layers.
pub fn running(store: &Path) -> bool {
    let Ok(file) = File::open(lock_path(store)) else {
        return false;
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => false,
        Err(_) => true,
    }
}

/// Whether `target` is a FUSE mount whose server answers `statfs` (a dead server's fails
/// it). The directory under a mount answers too, so it must be a mount's root: a new
/// server unmounts a dead one's mount before mounting its own, and an overlay mounted in
/// between would get that empty directory for its objects. May block while the server
/// does.
pub fn answering_fuse_mount(target: &Path) -> bool {
    const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;
    rustix::fs::statfs(target).is_ok_and(|fs| fs.f_type as u64 == FUSE_SUPER_MAGIC)
        && lamina_sys::is_mount_root(target).unwrap_or(false)
}

/// One layer being served: its FUSE session, since when, when a read last fetched, and
/// what was fetched of its blob (completion fetches only the rest).
struct Serving {
    _session: fuser::BackgroundSession,
    since: Instant,
    last_fetch: Arc<AtomicU64>,
    fetched: Arc<Fetched>,
    /// The registry host its blob comes from.
    host: String,
}

/// Completion waits until a layer has been served this long and no read has fetched
/// from it for [`QUIET`], so it does not compete with a starting container for the
/// network; after [`COMPLETE_BY`] it begins whatever the reads do.
const SETTLE: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_secs(2);
const COMPLETE_BY: Duration = Duration::from_secs(60);

/// A layer's chunks, noting when each fetch was asked (milliseconds since `epoch`) and
/// keeping what it brought.
struct Watched {
    inner: RegistryBlob,
    epoch: Instant,
    last_fetch: Arc<AtomicU64>,
    fetched: Arc<Fetched>,
}

impl ChunkSource for Watched {
    fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        self.last_fetch
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        let bytes = self.inner.fetch(start, end)?;
        // Not kept, completion fetches it again: a cost, never a wrong byte.
        if let Err(e) = self.fetched.record(start, &bytes) {
            tracing::warn!(error = %e, "keeping fetched bytes for completion failed");
        }
        Ok(bytes)
    }
}

/// The server of one store's lazy layers.
pub struct Server {
    store: Store,
    pull: PullOptions,
    served: HashMap<Digest, Serving>,
    /// Layers whose serving failed, and when they may be tried again.
    failed: HashMap<Digest, Instant>,
    /// Where this server keeps its layers' fetched chunks: `copies-<pid>-<time>-<n>` in
    /// each layer's directory, so no other server (nor an earlier one of this process)
    /// ever has its copies where it reads.
    copies: String,
    /// Layers whose completion ended (whole or bad), or is running, or waits to retry.
    completed: HashSet<Digest>,
    /// Layers being completed, each with its registry host.
    completing: Arc<Mutex<HashMap<Digest, String>>>,
    /// When a completion that failed may be tried again, and how many times it failed.
    retry_at: Arc<Mutex<HashMap<Digest, (Instant, u32)>>>,
    lock: File,
    /// What [`Watched`] times fetches from.
    epoch: Instant,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("store", &self.store.root())
            .field("served", &self.served.len())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The store's server, if no other process is it. `pull` gives the registry settings
    /// every layer shares (timeouts, certificates, an auth file); a layer's own
    /// credentials and plain HTTP come from its record, never from another layer's.
    pub fn start(store: &Store, pull: PullOptions) -> io::Result<Option<Server>> {
        let root = layer::lazy_root(store.root());
        {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&root)?;
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path(store.root()))?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(None);
        }
        Ok(Some(Server {
            store: store.clone(),
            pull: PullOptions {
                credentials: None,
                insecure_registries: Vec::new(),
                ..pull
            },
            served: HashMap::new(),
            failed: HashMap::new(),
            copies: format!("copies-{}", lamina_store::unique_suffix()),
            completed: HashSet::new(),
            completing: Arc::default(),
            retry_at: Arc::default(),
            lock,
            epoch: Instant::now(),
        }))
    }

    /// Stops serving a store that is no longer this server's, leaving its mounts as they
    /// are: unmounting by path could take a new store's mount at the same place, so the
    /// sessions are let go of, serving on for whatever still holds them.
    pub fn abandon(mut self) {
        for (_, serving) in self.served.drain() {
            std::mem::forget(serving);
        }
    }

    /// Whether the lock this server holds is still the store's: a store deleted (and
    /// perhaps made again at the same path) is no longer this server's to serve.
    pub fn still_the_stores(&self) -> bool {
        let (Ok(held), Ok(there)) = (
            rustix::fs::fstat(&self.lock),
            rustix::fs::stat(lock_path(self.store.root())),
        ) else {
            return false;
        };
        (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
    }

    /// Serves every lazy layer not served yet, and starts completing the served ones
    /// (at most [`COMPLETING_AT_ONCE`] at a time); returns how many it started serving.
    pub fn serve_new(&mut self, mounter: &dyn Mounter) -> usize {
        let started = self.serve_unserved(mounter);
        self.complete_some();
        started
    }

    fn serve_unserved(&mut self, mounter: &dyn Mounter) -> usize {
        let now = Instant::now();
        let mut started = 0;
        for chain_id in layer::named_layers(self.store.root()) {
            if self.served.contains_key(&chain_id)
                || self.failed.get(&chain_id).is_some_and(|at| *at > now)
                || !layer::is_lazy(self.store.root(), &chain_id)
            {
                continue;
            }
            let last_fetch = Arc::new(AtomicU64::new(0));
            match self.serve(mounter, &chain_id, last_fetch.clone()) {
                Ok((session, fetched, host)) => {
                    tracing::info!(layer = %chain_id, "serving lazy layer");
                    self.failed.remove(&chain_id);
                    let serving = Serving {
                        _session: session,
                        since: now,
                        last_fetch,
                        fetched,
                        host,
                    };
                    self.served.insert(chain_id, serving);
                    started += 1;
                }
                Err(e) => {
                    tracing::warn!(layer = %chain_id, error = %e, retry_s = SERVE_RETRY_AFTER.as_secs(), "cannot serve lazy layer; trying again later");
                    self.failed.insert(chain_id, now + SERVE_RETRY_AFTER);
                }
            }
        }
        started
    }

    fn serve(
        &self,
        mounter: &dyn Mounter,
        chain_id: &Digest,
        last_fetch: Arc<AtomicU64>,
    ) -> io::Result<(fuser::BackgroundSession, Arc<Fetched>, String)> {
        let root = self.store.root();
        let record = LazyRecord::read(root, chain_id).map_err(io::Error::other)?;
        let tree = record.tree(root).map_err(io::Error::other)?;
        // A container waits on each read: one retry, not an import's four, so a read of
        // what a gone registry holds fails within about two registry timeouts.
        let reads = PullOptions {
            retries: 1,
            ..self.pull.clone()
        };
        let client = layer::client(root, &record, &reads)?;
        let dir = layer::dir(root, chain_id);
        let target = layer::objects_mount(root, chain_id);
        // A mount there that answers is another server's: never taken from under it. One
        // that does not is a dead server's, and goes.
        let mounted = mounter
            .mounts_under(&dir)
            .map_err(io::Error::other)?
            .into_iter()
            .any(|m| m == target);
        if mounted {
            if answering_fuse_mount(&target) {
                return Err(io::Error::other(
                    "its objects are served by another process",
                ));
            }
            mounter.unmount(&target).map_err(io::Error::other)?;
        }
        // Copies other servers left (this one holds the store's lock: they are dead).
        for entry in fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("copies") {
                lamina_store::remove_tree(entry.path()).map_err(io::Error::other)?;
            }
        }
        let copies = dir.join(&self.copies);
        {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new().mode(0o700).create(&copies)?;
        }
        let objects = tree
            .files
            .iter()
            .enumerate()
            .filter(|(_, file)| file.size > 0)
            .map(|(n, file)| LazyObject {
                name: layer::object_name(chain_id, n).into(),
                file: file.clone(),
                copy: copies.join(layer::object_name(chain_id, n)),
            })
            .collect();
        let fetched = Arc::new(Fetched::create(
            &copies.join("blob.part"),
            record.blob_size,
        )?);
        // The index is part of the blob, fetched already.
        let index = layer::index_bytes(root, chain_id).map_err(io::Error::other)?;
        fetched.record(record.index.offset, &index)?;
        let source = Watched {
            inner: RegistryBlob {
                client,
                digest: record.blob_digest.to_string(),
                size: record.blob_size,
            },
            epoch: self.epoch,
            last_fetch,
            fetched: fetched.clone(),
        };
        let prefetch_end = match record.index.format {
            Format::Estargz => prefetch_end(&tree.files),
            Format::ZstdChunked => None,
        };
        let fs = Arc::new(ObjectsFs::new(objects, Arc::new(source))?);
        let session = fs.mount_shared(&target)?;
        if let Some(end) = prefetch_end {
            let layer = chain_id.clone();
            std::thread::spawn(move || {
                let got = fs.prefetch(end);
                tracing::info!(layer = %layer, chunks = got.chunks, bytes = got.bytes, failed = got.failed, "prefetched what the image marks as read at start");
            });
        }
        let host = lamina_registry::RegistryRef::parse(&record.repository)
            .and_then(Result::ok)
            .map(|r| r.host)
            .unwrap_or_default();
        Ok((session, fetched, host))
    }
}

impl Server {
    /// Starts completing served layers not yet completed, in threads of their own.
    fn complete_some(&mut self) {
        let now = Instant::now();
        let since_epoch = self.epoch.elapsed().as_millis() as u64;
        for (chain_id, serving) in &self.served {
            if self.completed.contains(chain_id) {
                continue;
            }
            let quiet = Duration::from_millis(
                since_epoch.saturating_sub(serving.last_fetch.load(Ordering::Relaxed)),
            );
            let served_for = now.saturating_duration_since(serving.since);
            if served_for < SETTLE || (quiet < QUIET && served_for < COMPLETE_BY) {
                continue;
            }
            let mut completing = self
                .completing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let waiting = self
                .retry_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(chain_id)
                .is_some_and(|(at, _)| *at > now);
            let from_host = completing
                .values()
                .filter(|host| **host == serving.host)
                .count();
            if completing.contains_key(chain_id) || waiting || from_host >= COMPLETING_AT_ONCE {
                continue;
            }
            completing.insert(chain_id.clone(), serving.host.clone());
            let fetched = serving.fetched.clone();
            let (store, pull, chain_id) = (self.store.clone(), self.pull.clone(), chain_id.clone());
            let (completing, retry_at) = (self.completing.clone(), self.retry_at.clone());
            std::thread::spawn(move || {
                // The slot is given back however the completion ends, a panic included.
                struct Slot(Arc<Mutex<HashMap<Digest, String>>>, Digest);
                impl Drop for Slot {
                    fn drop(&mut self) {
                        self.0
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&self.1);
                    }
                }
                let _slot = Slot(completing.clone(), chain_id.clone());
                let ended = LazyRecord::read(store.root(), &chain_id)
                    .and_then(|record| complete(&store, &record, &pull, Some(&fetched)));
                match &ended {
                    Ok(Completed::Whole) | Ok(Completed::Bad(_)) => {}
                    Err(e) => {
                        let mut retries = retry_at.lock().unwrap_or_else(PoisonError::into_inner);
                        let failures = retries.get(&chain_id).map_or(0, |(_, n)| *n) + 1;
                        if failures >= GIVE_UP_AFTER {
                            fetched.discard();
                            let why = format!("completion failed {failures} times, last: {e}");
                            if let Err(e) = crate::complete::mark_bad(&store, &chain_id, &why) {
                                tracing::error!(layer = %chain_id, error = %e, "cannot mark lazy layer bad");
                            }
                        } else {
                            tracing::warn!(layer = %chain_id, error = %e, retry_s = RETRY_AFTER.as_secs(), "completing lazy layer failed; trying again later");
                        }
                        retries.insert(chain_id.clone(), (Instant::now() + RETRY_AFTER, failures));
                    }
                }
            });
        }
        // A layer is completed once it is whole or bad; whole, until `clean` collects the
        // ordinary layer while its lazy one is still served: then it is completed again.
        let root = self.store.root();
        let store = &self.store;
        self.completed.retain(|chain_id| {
            store.has_layer(chain_id) || crate::complete::bad_reason(root, chain_id).is_some()
        });
        for chain_id in self.served.keys() {
            if self.store.has_layer(chain_id)
                || crate::complete::bad_reason(root, chain_id).is_some()
            {
                let running = self
                    .completing
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains_key(chain_id);
                if !running {
                    self.completed.insert(chain_id.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_under_an_objects_mount_is_not_a_server_answering() {
        let dir = tempfile::tempdir().unwrap();
        let objects = dir.path().join("objects.mnt");
        std::fs::create_dir(&objects).unwrap();
        assert!(!answering_fuse_mount(&objects));
    }
}
