//! One container ID, one lifecycle step at a time. A create holds its container
//! directory's flock (`images/<id>/lock`) from the moment the directory is published until
//! its record is written; a delete of the same ID waits for that flock, so it never tears
//! a half-made rootfs from under its create (EBUSY on a mount being made, ENOENT on the
//! record being written) — Garden deletes a container whose create timed out. A flock dies
//! with its process, so a killed create never blocks a delete.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

use crate::container::LOCK;
use crate::{DirLock, Store, StoreError, validate_id};

const POLL: Duration = Duration::from_millis(20);

impl Store {
    /// Waits until nobody works on container `id`, then holds its directory lock until the
    /// returned guard drops. `None`: there is no such container (any more).
    pub fn wait_for_container(&self, id: &str) -> Result<Option<DirLock>, StoreError> {
        // A create holds the lock while it imports layers, so this is the store's long
        // lock wait; a waiter that gives up says so.
        self.wait_for_container_within(id, self.lock_timeout())
    }

    /// [`Store::wait_for_container`] giving up after `wait`.
    pub fn wait_for_container_within(
        &self,
        id: &str,
        wait: Duration,
    ) -> Result<Option<DirLock>, StoreError> {
        validate_id(id)?;
        let base = self.layout.container(id);
        let path = base.join(LOCK);
        let started = Instant::now();
        loop {
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // No lock file: no container, or one made by an older lamina.
                    return Ok(base.is_dir().then_some(DirLock { _held: None }));
                }
                Err(e) => return Err(StoreError::io("opening", &path)(e)),
            };
            match rustix::fs::flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
                // The directory may have been removed (a failed create) or replaced (a
                // new create of the ID) while we waited: hold the lock of the one there now.
                Ok(()) if same_file(&file, &path) => {
                    return Ok(Some(DirLock { _held: Some(file) }));
                }
                Ok(()) => continue,
                Err(rustix::io::Errno::WOULDBLOCK) if started.elapsed() < wait => {
                    std::thread::sleep(POLL);
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(StoreError::ContainerBusy {
                        id: id.to_string(),
                        waited_secs: started.elapsed().as_secs(),
                    });
                }
                Err(e) => return Err(StoreError::errno("locking", &path)(e)),
            }
        }
    }
}

fn same_file(file: &File, path: &std::path::Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
        _ => false,
    }
}
