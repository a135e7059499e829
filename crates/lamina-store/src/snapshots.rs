//! containerd snapshots kept in the store (`snapshots/metadata.json`), for the proxy
//! snapshotter in `lamina-snapshotter`. They live here, not in the front-end, because
//! layer collection must see them: a committed snapshot's content is a layer under
//! `layers/`, and an active snapshot is a container under `images/`, so `clean` keeps what
//! a snapshot names exactly as it keeps what a container record names.
//!
//! The file is small and rewritten whole, atomically (write, fsync, rename), so a crash
//! between two calls loses nothing and a crash during one leaves the previous version.

use std::collections::{BTreeMap, HashSet};
use std::fs;

use lamina_image::Digest;
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError, StoreLock};

/// The three kinds of snapshot containerd knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Read-only view of a committed snapshot.
    View,
    /// Writable; becomes committed by `Commit`.
    Active,
    /// Immutable; the parent of actives, views and other committed snapshots.
    Committed,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::View => "view",
            SnapshotKind::Active => "active",
            SnapshotKind::Committed => "committed",
        }
    }
}

/// One snapshot, keyed in [`SnapshotDb::snapshots`] by its key (active, view) or name
/// (committed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub kind: SnapshotKind,
    /// Key of the committed snapshot it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Nanoseconds since the epoch.
    pub created_ns: u128,
    pub updated_ns: u128,
    /// Committed: the store layer holding its content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<Digest>,
    /// Active or view: the container (under `images/`) whose directory provides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Active: a commit that started and may not have finished, so the next start of the
    /// snapshotter can finish or undo it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committing: Option<Committing>,
}

/// A commit in flight: the committed snapshot it makes, and the layer its content goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committing {
    pub name: String,
    pub layer: Digest,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Every snapshot of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDb {
    /// Numbers the containers of actives and views (`snap-<n>`), never reused.
    pub next_id: u64,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

impl SnapshotDb {
    /// Layers that committed snapshots hold and commits in flight are making.
    pub fn layers(&self) -> HashSet<Digest> {
        self.snapshots
            .values()
            .flat_map(|s| {
                s.layer
                    .iter()
                    .chain(s.committing.as_ref().map(|c| &c.layer))
            })
            .cloned()
            .collect()
    }

    /// Keys of the snapshots whose parent is `key`.
    pub fn children_of<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.snapshots
            .iter()
            .filter(move |(_, s)| s.parent.as_deref() == Some(key))
            .map(|(k, _)| k)
    }
}

impl Store {
    /// Serialises changes to the snapshot metadata (and to what it names) between
    /// processes; a snapshotter holds it for each call.
    pub fn lock_snapshots(&self) -> Result<StoreLock, StoreError> {
        self.lock("snapshots")
    }

    /// The snapshots recorded; none if no snapshotter ever ran on this store.
    pub fn load_snapshots(&self) -> Result<SnapshotDb, StoreError> {
        let path = self.layout.snapshot_metadata();
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::io("reading", &path)(std::io::Error::other(e))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(SnapshotDb::default()),
            Err(e) => Err(StoreError::io("reading", &path)(e)),
        }
    }

    /// Replaces the snapshot metadata with `db`, durably: after this returns, a crash
    /// keeps it; a crash before keeps the previous version whole.
    pub fn save_snapshots(&self, db: &SnapshotDb) -> Result<(), StoreError> {
        let dir = self.layout.snapshots();
        fs::create_dir_all(&dir).map_err(StoreError::io("creating", &dir))?;
        let path = self.layout.snapshot_metadata();
        let bytes = serde_json::to_vec_pretty(db)
            .map_err(|e| StoreError::io("encoding", &path)(std::io::Error::other(e)))?;
        self.write_durably(&path, &bytes)
    }
}
