//! One container ID, one lifecycle step at a time. Garden deletes a container whose create
//! timed out, so a delete can arrive at any moment of its create: while layers import
//! (nothing of the container exists yet), while its rootfs is being mounted, before its
//! record is written. Two locks make that safe:
//!
//! - `locks/id-<ID>.lock`, taken by a create for its whole run and by a delete while it
//!   deletes: a delete waits for the create (bounded, naming the holder) and then deletes
//!   what the create made, instead of answering "not found" and leaving a container to
//!   appear after it, or tearing a half-made rootfs from under its create. Removed when the
//!   container is gone (or was never made), so IDs used once leave no file behind.
//! - the container directory's own flock (`images/<id>/lock`), held from the moment the
//!   directory is published until its record is written, which also covers work on the
//!   directory that does not come from a create (`clean` removing a crashed create).
//!
//! flocks die with their process, so a killed create never blocks a delete.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

use crate::container::LOCK;
use crate::{DirLock, Store, StoreError, validate_id};

/// The per-ID lock: dropped, it is released; [`IdLock::release_gone`] also removes its
/// file, once the container does not exist.
#[derive(Debug)]
pub struct IdLock {
    file: crate::Flocked,
    path: PathBuf,
}

impl IdLock {
    /// Removes the lock file, then releases the lock. Call once the container is gone
    /// (deleted, or its create failed): a waiter holding the old file sees it replaced and
    /// takes the new one, so no two processes ever hold "the" lock of one ID.
    pub fn release_gone(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

impl Store {
    /// Waits (at most the store's lock timeout) for any other create or delete of `id`,
    /// then holds the ID until the returned lock drops.
    pub fn lock_id(&self, id: &str) -> Result<IdLock, StoreError> {
        validate_id(id)?;
        let path = self.layout.lock(&format!("id-{id}"));
        loop {
            let file = crate::locks::open_lock_file(&path)
                .map_err(StoreError::io("creating lock", &path))?;
            self.wait_for_flock(&file, &path, false)?;
            // Whoever held it may have removed the file (the container is gone) and a
            // third process made a new one: hold the file that is there now.
            if same_file(&file, &path) {
                return Ok(IdLock {
                    file: crate::Flocked::new(file),
                    path,
                });
            }
        }
    }

    /// Whether some process holds `id`'s lock now (a create, delete, mount or commit of
    /// it in flight), asked without waiting and without making the lock file: an answer
    /// given without the lock (a kept Mounts answer) defers to such a step.
    pub fn id_held(&self, id: &str) -> bool {
        if validate_id(id).is_err() {
            return false;
        }
        let path = self.layout.lock(&format!("id-{id}"));
        // Only a regular file is a lock (`open_lock_file` refuses anything else).
        let file = match crate::open_regular_file(&path) {
            // A holder makes the file before it locks it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Ok(file) => file,
            // Anything else is for the lock's own taker to report.
            Err(_) => return true,
        };
        if rustix::fs::flock(file.as_fd(), FlockOperation::NonBlockingLockShared).is_err() {
            return true;
        }
        // Given back at once, and explicitly (see `Flocked`).
        drop(crate::Flocked::new(file));
        false
    }

    /// Removes the ID lock files of containers that do not exist and that nobody holds:
    /// what creates killed before they finished leave. Returns how many went.
    pub fn sweep_id_locks(&self) -> Result<usize, StoreError> {
        let dir = self.layout.locks();
        let mut removed = 0;
        for entry in std::fs::read_dir(&dir).map_err(StoreError::io("listing", &dir))? {
            let entry = entry.map_err(StoreError::io("listing", &dir))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("id-"))
                .and_then(|n| n.strip_suffix(".lock"))
            else {
                continue;
            };
            if validate_id(id).is_err() || self.container_exists(id) {
                continue;
            }
            let path = entry.path();
            let file = match crate::open_regular_file(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    // Not ours to remove (only root could have put it there), but said:
                    // every create of this ID fails on it, naming it.
                    tracing::warn!(path = %path.display(), error = %e, "left an ID lock that is not a lock file");
                    continue;
                }
            };
            let free =
                rustix::fs::flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive).is_ok();
            if free && same_file(&file, &path) && !self.container_exists(id) {
                IdLock {
                    file: crate::Flocked::new(file),
                    path,
                }
                .release_gone();
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Waits (at most the store's lock timeout, naming the holder, like every store lock)
    /// until nobody works on container `id`'s directory, then holds its directory lock
    /// until the returned guard drops. `None`: there is no such container (any more).
    pub fn wait_for_container(&self, id: &str) -> Result<Option<DirLock>, StoreError> {
        validate_id(id)?;
        let base = self.layout.container(id);
        let path = base.join(LOCK);
        loop {
            let Some(file) = open_dir_lock(&path)? else {
                // No lock file: no container, or one made by an older lamina, or one
                // with something there nobody can hold.
                return Ok(base.is_dir().then_some(DirLock { _held: None }));
            };
            self.wait_for_flock(&file, &path, false)?;
            // The directory may have been removed (a failed create) or replaced (a new
            // create of the ID) while we waited: hold the lock of the one there now.
            if same_file(&file, &path) {
                return Ok(Some(DirLock {
                    _held: Some(crate::Flocked::new(file)),
                }));
            }
        }
    }
}

/// The lock file of a container-shaped directory, opened; `None` when there is none to
/// hold — no file, or something no lamina could open as one (a FIFO, a symlink, a
/// directory: only root can put it there, and nobody can be holding it), which is logged
/// and otherwise taken for no lock. One such entry then costs `clean`, `check`, a
/// collection or a delete nothing, rather than failing them for every container.
pub(crate) fn open_dir_lock(path: &Path) -> Result<Option<File>, StoreError> {
    match crate::open_regular_file(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => match crate::regular_file::refuse_non_regular(path) {
            Err(_) => {
                tracing::warn!(path = %path.display(), error = %e, "not a lock file: taken for no lock");
                Ok(None)
            }
            Ok(()) => Err(StoreError::io("opening", path)(e)),
        },
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
        _ => false,
    }
}
