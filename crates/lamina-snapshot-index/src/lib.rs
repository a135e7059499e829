//! containerd's snapshots as lamina keeps them, for the proxy snapshotter
//! (`lamina-snapshotter`), which writes them, and for layer collection and `check`
//! (`lamina-mount`), which must see them: a committed snapshot's content is a layer under
//! `layers/`, and an active snapshot a container under `images/`, so `clean` keeps what a
//! snapshot names exactly as it keeps what a container record names. It sits between the
//! store and those two, so data flows one way: store → snapshot index → mount → front-ends.
//!
//! The records are rows of an SQLite database (`snapshots/metadata.db`, see
//! [`SnapshotIndex`]): each call reads and writes only the rows it names, through an
//! index, so a node with thousands of snapshots pays per call what a node with ten does.

mod index;
mod legacy;
mod log_size;
mod records;

pub use index::SnapshotIndex;
pub use records::{Committing, REF_LABEL, SnapshotKind, SnapshotRecord, StoreSnapshots};
