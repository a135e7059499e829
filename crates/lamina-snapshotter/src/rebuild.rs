//! Containers a power cut lost under rows it kept.
//!
//! Prepare and View sync the snapshot's row and nothing else: the database's sync flushes
//! its own log and commits none of the directories the container is made of, so after a
//! power cut a row can name a container that is gone, or half made (a directory without
//! its record). What that container held when the call returned is known exactly — an
//! empty upper on the snapshot's parent — so recovery makes it again from the row.
//! Anything a container wrote into its upper after that is no more durable with
//! containerd's own overlayfs snapshotter, which syncs nothing of an upper either.
//!
//! Only a container without a record file is made again. One whose record is there is
//! whole (on ext4 and xfs the record is written direct and renamed into place after every
//! directory of the container was made, and the journal commits those in order;
//! elsewhere the record's write syncs the container's directory), even when the record
//! cannot be read: a newer release's, or one an I/O error hides, is reported by `lamina
//! check` and left with what the container wrote (review finding: taking it for lost
//! deleted its upper).

use lamina_store::SnapshotRecord;

use crate::snapshotter::layer_chain;
use crate::{SnapshotError, Snapshotter};

impl Snapshotter {
    /// Makes again the container of every row whose container has no record file. A
    /// container that cannot be made again is left missing and logged: that snapshot's
    /// Mounts fails, and the others start.
    pub(crate) fn rebuild_lost_containers(&self) -> Result<(), SnapshotError> {
        let mut lost: Vec<(String, SnapshotRecord)> = Vec::new();
        let layout = self.store.layout();
        self.index().for_each(|key, row| {
            let recorded = row.container.as_ref().is_none_or(|id| {
                layout
                    .container(id)
                    .join("container.json")
                    .symlink_metadata()
                    .is_ok()
            });
            if !recorded {
                lost.push((key, row));
            }
        })?;
        for (key, row) in lost {
            let id = row.container.clone().unwrap_or_default();
            match self.rebuild(&key, &id, &row) {
                Ok(true) => {
                    tracing::warn!(key, container = %id, "a crash lost this snapshot's container: made it again, empty, on its parent");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(key, container = %id, error = %e, "a crash lost this snapshot's container, and it could not be made again: its Mounts fails until it is removed");
                }
            }
        }
        Ok(())
    }

    /// Makes container `id` of snapshot `key` again. `Ok(false)`: left alone, because
    /// another process is working on the directory (a `lamina create` of that name).
    fn rebuild(&self, key: &str, id: &str, row: &SnapshotRecord) -> Result<bool, SnapshotError> {
        // The labels shape the container (a uid/gid mapping, a size limit, a strategy).
        // Changed by an Update since the Prepare, they would make a container other than
        // the one containerd was answered for — one without the mapping, say, whose
        // writes a commit would then publish with host ids (review finding).
        if row.updated_ns != row.created_ns {
            return Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}`'s labels were updated after it was prepared, so the container it was made as is not known"
            )));
        }
        let dir = self.store.layout().container(id);
        if dir.exists() {
            let Some(_held) = self.store.try_lock_dir(&dir)? else {
                tracing::warn!(key, container = %id, "a crash lost this snapshot's container, but another process is working on its directory: left alone");
                return Ok(false);
            };
        }
        // What is left of it: a directory without a record.
        lamina_mount::delete(&self.store, self.mounter.as_ref(), id)?;
        let chain = match &row.parent {
            Some(parent) => layer_chain(&self.index(), parent)?,
            None => Vec::new(),
        };
        self.make_container(id, key, row.kind, &chain, &row.labels, true)?;
        Ok(true)
    }
}
