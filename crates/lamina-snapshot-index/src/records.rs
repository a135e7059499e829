//! What a snapshot is: its kind, parent, labels, layer or container, and a commit in
//! flight.

use std::collections::BTreeMap;

use lamina_image::Digest;
use serde::{Deserialize, Serialize};

use lamina_store::{Store, StoreError, StoreLock};

use crate::SnapshotIndex;

/// The label an unpack names the layer it extracts with (containerd's pull); the index
/// keeps it in a column of its own so a Prepare finds an existing layer without a scan.
pub const REF_LABEL: &str = "containerd.io/snapshot.ref";

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

    pub fn parse(text: &str) -> Option<SnapshotKind> {
        match text {
            "view" => Some(SnapshotKind::View),
            "active" => Some(SnapshotKind::Active),
            "committed" => Some(SnapshotKind::Committed),
            _ => None,
        }
    }
}

/// One snapshot, keyed by its key (active, view) or name (committed).
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
    /// The parent the committed snapshot takes when the commit rebases an unpack's
    /// parentless snapshot (containerd 2.x's parallel unpack); none keeps the active one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// The store's snapshots: how the snapshotter, `clean` and `check` reach them.
pub trait StoreSnapshots {
    /// Serialises changes to the snapshot metadata (and to what it names) between
    /// processes; a snapshotter holds it for each call that changes anything.
    fn lock_snapshots(&self) -> Result<StoreLock, StoreError>;

    /// The snapshot index, created empty if no snapshotter ever ran on this store, and
    /// migrated from `snapshots/metadata.json` the first time a store that has one opens.
    fn snapshots(&self) -> Result<SnapshotIndex, StoreError>;

    /// The snapshots, to read only, if a snapshotter ever ran on this store: what
    /// `check` and layer collection open. They create nothing and migrate nothing (an
    /// earlier release's daemon may be running on its `metadata.json`).
    fn snapshots_if_any(&self) -> Result<Option<SnapshotIndex>, StoreError>;
}

impl StoreSnapshots for Store {
    /// Serialises changes to the snapshot metadata (and to what it names) between
    /// processes; a snapshotter holds it for each call that changes anything.
    fn lock_snapshots(&self) -> Result<StoreLock, StoreError> {
        self.lock("snapshots")
    }

    /// The snapshot index, created empty if no snapshotter ever ran on this store, and
    /// migrated from `snapshots/metadata.json` the first time a store that has one opens.
    fn snapshots(&self) -> Result<SnapshotIndex, StoreError> {
        SnapshotIndex::open(self)
    }

    /// The snapshots, to read only, if a snapshotter ever ran on this store: what
    /// `check` and layer collection open. They create nothing and migrate nothing (an
    /// earlier release's daemon may be running on its `metadata.json`).
    fn snapshots_if_any(&self) -> Result<Option<SnapshotIndex>, StoreError> {
        SnapshotIndex::open_read_only(self)
    }
}
