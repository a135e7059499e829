//! Named store-wide locks (`locks/<name>.lock`, flock). A flock dies with its process, so
//! a crash never leaves a lock held; whoever takes it next finds the dead holder's work
//! half done and finishes or removes it.

use std::fs::File;
use std::os::fd::AsFd;

use rustix::fs::FlockOperation;

use crate::{Store, StoreError};

/// A held store lock, released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl Store {
    /// Waits for and takes the lock called `name`.
    pub fn lock(&self, name: &str) -> Result<StoreLock, StoreError> {
        self.wait_for_lock(name, FlockOperation::LockExclusive)
    }

    /// Takes the lock called `name` in blocking mode `op` (shared or exclusive).
    fn wait_for_lock(&self, name: &str, op: FlockOperation) -> Result<StoreLock, StoreError> {
        let path = self.layout.lock(name);
        // A blocking flock never reports EWOULDBLOCK; if it did, say so.
        self.take_lock(name, op)?
            .ok_or_else(|| StoreError::errno("locking", &path)(rustix::io::Errno::WOULDBLOCK))
    }

    /// Takes the lock called `name` if nobody holds it.
    pub fn try_lock(&self, name: &str) -> Result<Option<StoreLock>, StoreError> {
        self.take_lock(name, FlockOperation::NonBlockingLockExclusive)
    }

    fn take_lock(&self, name: &str, op: FlockOperation) -> Result<Option<StoreLock>, StoreError> {
        let path = self.layout.lock(name);
        let file = File::create(&path).map_err(StoreError::io("creating lock", &path))?;
        match rustix::fs::flock(file.as_fd(), op) {
            Ok(()) => Ok(Some(StoreLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(StoreError::errno("locking", &path)(e)),
        }
    }
}

/// Held shared by every process that needs layers to stay (a create from import until its
/// record names them, a pool fill, a refill) and exclusively by layer collection, which
/// therefore never removes a layer a create in flight is about to use.
const LAYERS_IN_USE: &str = "layers-in-use";

impl Store {
    /// Waits until no collection runs, then keeps layers from being collected until the
    /// returned lock drops.
    pub fn use_layers(&self) -> Result<StoreLock, StoreError> {
        self.wait_for_lock(LAYERS_IN_USE, FlockOperation::LockShared)
    }

    /// Waits for every holder of [`Store::use_layers`] to finish; while held, nobody
    /// starts to use layers.
    pub fn collect_layers_lock(&self) -> Result<StoreLock, StoreError> {
        self.lock(LAYERS_IN_USE)
    }
}
