//! Containers a power cut lost under rows it kept.
//!
//! Prepare and View sync the snapshot's row and nothing else: the database's sync flushes
//! its own log and commits none of the directories the container is made of, so after a
//! power cut a row can name a container that is gone, or half made (a directory without
//! its record). What that container held when the call returned is known exactly — an
//! empty upper on the snapshot's parent, made as the Prepare's [`Shape`] said — so
//! recovery makes it again. Anything a container wrote into its upper after that is no
//! more durable with containerd's own overlayfs snapshotter, which syncs nothing of an
//! upper either.
//!
//! The container is made again under a new number, and the row moved to it. Under the old
//! name, only a crashed create is removed (a directory without a record whose lock is
//! free, as `lamina clean` removes it); a `lamina create snap-7` in flight, or a Garden
//! container made under that name since the cut, is Garden's: rebuilding in place would
//! delete a create in flight, or adopt a Garden container.
//!
//! Only a container whose record file is not there is lost. One whose record is there is
//! whole (on ext4 and xfs the record is a symlink whose target the journal logs with it,
//! or written direct and renamed into place, after every directory of the container was
//! made, and the journal commits those in order; elsewhere the record's write syncs the
//! container's directory), even when the record
//! cannot be read or stat fails: a newer release's, or one an I/O error hides, is
//! reported by `lamina check` and left with what the container wrote, never deleted and
//! made again empty.

use std::collections::{BTreeMap, HashSet};

use lamina_snapshot_index::SnapshotRecord;
use serde::{Deserialize, Serialize};

use crate::snapshotter::{CONTAINER_PREFIX, is_snapshot_container, layer_chain};
use crate::{SnapshotError, Snapshotter};

/// What a snapshot's container is made from besides its parent and kind, recorded at
/// its Prepare so that a container made again is the one containerd was answered for:
/// the labels as they were then (an Update may change them since; they carry a uid/gid
/// mapping, a size limit, a strategy), and the daemon's default strategies then (it may
/// restart with others).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Shape {
    pub labels: BTreeMap<String, String>,
    pub default_strategies: String,
    /// The row's `created_ns`: a shape another row of the same key left (an earlier
    /// release's Remove does not know the table) is not this row's.
    pub created_ns: u128,
}

impl Shape {
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The names in `images/` whose readable record is not a snapshot's: Garden's.
pub(crate) fn foreign_names(scan: &lamina_mount::record::Scan) -> HashSet<String> {
    scan.containers
        .iter()
        .filter(|c| !is_snapshot_container(c))
        .map(|c| c.id().to_string())
        .collect()
}

impl Snapshotter {
    /// Makes again the container of every row whose container is lost (see the module
    /// doc). One that cannot be made again is left as it is and logged: that snapshot's
    /// Mounts fails, and the others start.
    pub(crate) fn rebuild_lost_containers(
        &self,
        foreign_names: &HashSet<String>,
    ) -> Result<(), SnapshotError> {
        let mut lost: Vec<(String, SnapshotRecord, bool)> = Vec::new();
        let layout = self.store.layout();
        self.index().for_each(|key, row| {
            let Some(id) = &row.container else {
                return;
            };
            // A commit whose layer is published is finished from the layer: its
            // container is not needed, and a commit's final row, not synced, can be lost
            // while the container's removal is kept, so it is not made again only to be
            // deleted and logged as lost.
            if row
                .committing
                .as_ref()
                .is_some_and(|c| self.store.has_layer(&c.layer))
            {
                return;
            }
            let foreign = foreign_names.contains(id);
            // Another snapshot's record under this name is not ours to judge; an
            // unreadable one is left for `check`.
            let gone = match layout
                .container(id)
                .join("container.json")
                .symlink_metadata()
            {
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                Ok(_) => foreign,
            };
            if gone {
                lost.push((key, row, foreign));
            }
        })?;
        for (key, row, foreign) in lost {
            let old = row.container.clone().unwrap_or_default();
            match self.rebuild(&key, row, foreign) {
                Ok(id) => {
                    tracing::warn!(key, lost = %old, container = %id, "a crash lost this snapshot's container: made it again, empty, on its parent");
                }
                Err(e) => {
                    tracing::error!(key, container = %old, error = %e, "a crash lost this snapshot's container, and it could not be made again: its Mounts fails until it is removed");
                }
            }
            // What the cut left under the old name, if nobody is working on it.
            lamina_mount::remove_crashed_create(&self.store, self.mounter.as_ref(), &old)?;
        }
        Ok(())
    }

    /// Makes snapshot `key`'s container again under a new number (the next free one:
    /// see [`Snapshotter::make_numbered`]), then moves its row there. Returns the new
    /// container's name. The container is claimed first: a `lamina create` of that name
    /// in flight makes the making fail as taken, and the next number is tried, so the row
    /// never moves onto a Garden container still being made. If it cannot be made and the
    /// old name is a Garden container (`foreign`), the row still moves off it, to a number
    /// nobody holds: left on Garden's, a Remove would delete it.
    fn rebuild(
        &self,
        key: &str,
        mut row: SnapshotRecord,
        foreign: bool,
    ) -> Result<String, SnapshotError> {
        let made = self.shape_of(key, &row).and_then(|shape| {
            let chain = match &row.parent {
                Some(parent) => layer_chain(&self.index(), parent)?,
                None => Vec::new(),
            };
            self.make_numbered(key, row.kind, &chain, &shape, true)
        });
        let (number, id, result) = match made {
            Ok((number, id)) => (number, id.clone(), Ok(id)),
            Err(e) if foreign => {
                let number = self.free_number(0)?;
                (number, format!("{CONTAINER_PREFIX}{number}"), Err(e))
            }
            Err(e) => return Err(e),
        };
        row.container = Some(id.clone());
        if let Err(e) = self.index().renumber(key, &row, number) {
            // Unnamed, and numbered no further than the counter: the next start removes
            // it, and makes the snapshot's again.
            return Err(e.into());
        }
        result
    }

    /// The shape snapshot `key`'s Prepare recorded, if it is this row's.
    pub(crate) fn shape_of(&self, key: &str, row: &SnapshotRecord) -> Result<Shape, SnapshotError> {
        let shape = self.index().shape(key)?;
        shape
            .and_then(|shape| serde_json::from_str::<Shape>(&shape).ok())
            .filter(|shape| shape.created_ns == row.created_ns)
            .ok_or_else(|| {
                SnapshotError::FailedPrecondition(
                    "what it was made from is not recorded (prepared by an earlier release?)"
                        .into(),
                )
            })
    }
}
