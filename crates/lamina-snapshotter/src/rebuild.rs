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
//! A container whose record is readable is whole: on ext4 and xfs the record is written
//! direct and renamed into place after every directory of the container was made, and
//! the journal commits those in order; elsewhere the record's write syncs the container's
//! directory.

use std::collections::HashSet;

use lamina_store::SnapshotRecord;

use crate::snapshotter::layer_chain;
use crate::{SnapshotError, Snapshotter};

impl Snapshotter {
    /// Makes again the container of every row whose container has no readable record
    /// (`readable`: the IDs of those that have one). A container that cannot be made
    /// again (its parent's layer is gone, its labels no longer pass) is left missing and
    /// logged: that snapshot's Mounts fails, and the others start.
    pub(crate) fn rebuild_lost_containers(
        &self,
        readable: &HashSet<String>,
    ) -> Result<(), SnapshotError> {
        let mut lost: Vec<(String, SnapshotRecord)> = Vec::new();
        self.index().for_each(|key, row| {
            if row
                .container
                .as_ref()
                .is_some_and(|id| !readable.contains(id))
            {
                lost.push((key, row));
            }
        })?;
        for (key, row) in lost {
            let id = row.container.clone().unwrap_or_default();
            tracing::warn!(key, container = %id, "a crash lost this snapshot's container: making it again, empty, on its parent");
            if let Err(e) = self.rebuild(&key, &id, &row) {
                tracing::error!(key, container = %id, error = %e, "could not make the snapshot's container again: its Mounts will fail until it is removed");
            }
        }
        Ok(())
    }

    fn rebuild(&self, key: &str, id: &str, row: &SnapshotRecord) -> Result<(), SnapshotError> {
        // What is left of it: a directory without a record, or with a torn one.
        lamina_mount::delete(&self.store, self.mounter.as_ref(), id)?;
        let chain = match &row.parent {
            Some(parent) => layer_chain(&self.index(), parent)?,
            None => Vec::new(),
        };
        self.make_container(id, key, row.kind, &chain, &row.labels)
    }
}
