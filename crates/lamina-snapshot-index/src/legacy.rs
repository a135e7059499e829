//! `snapshots/metadata.json`, where releases before the database kept every snapshot (one
//! file, rewritten whole on every call), and what replaces it once the database holds its
//! records: a tombstone in the same place. An earlier release that finds the tombstone
//! cannot parse it and refuses to start — rather than finding no file, concluding there
//! are no snapshots, and removing every snapshot's container as unnamed. The migrated
//! file itself is kept beside it as `metadata.json.migrated`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::records::SnapshotRecord;
use lamina_store::StoreError;

/// The whole of the metadata as earlier releases kept it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct LegacySnapshotFile {
    pub next_id: u64,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

/// What stands at `metadata.json` once the database holds the snapshots.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tombstone {
    lamina_snapshots_moved_to: String,
    why: String,
}

/// What is at `metadata.json`.
#[derive(Debug)]
pub(crate) enum Legacy {
    Absent,
    /// The database holds the snapshots (this release or a later one wrote this).
    Tombstone,
    /// An earlier release's snapshots, and the digest of the file's bytes.
    File(LegacySnapshotFile, String),
}

pub(crate) fn read(path: &Path) -> Result<Legacy, StoreError> {
    let bytes = match lamina_store::read_regular_file(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Legacy::Absent),
        Err(e) => return Err(StoreError::io("reading", path)(e)),
    };
    if serde_json::from_slice::<Tombstone>(&bytes).is_ok() {
        return Ok(Legacy::Tombstone);
    }
    let digest = lamina_image::Digest::of(&bytes).to_string();
    serde_json::from_slice(&bytes)
        .map(|file| Legacy::File(file, digest))
        .map_err(|e| StoreError::io("reading", path)(std::io::Error::other(e)))
}

/// Where a migrated file is kept.
pub(crate) fn kept(path: &Path) -> PathBuf {
    path.with_extension("json.migrated")
}

/// Keeps a migrated `metadata.json` as `metadata.json.migrated` (a hard link: the name
/// `metadata.json` is never missing, so no reader ever sees "no snapshots") and replaces
/// it with the tombstone. A kept copy with the same bytes is already the file; one with
/// other bytes is never overwritten.
pub(crate) fn set_aside(path: &Path, database: &Path) -> Result<(), StoreError> {
    let kept = kept(path);
    match fs::hard_link(path, &kept) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let same = lamina_store::read_regular_file(&kept)
                .and_then(|k| lamina_store::read_regular_file(path).map(|now| now == k))
                .map_err(StoreError::io("reading", &kept))?;
            if !same {
                return Err(StoreError::io("migrating", path)(std::io::Error::other(
                    format!(
                        "{} exists too, with other snapshots: an earlier release wrote snapshots after they moved to {}; compare the two and keep one",
                        kept.display(),
                        database.display()
                    ),
                )));
            }
        }
        Err(e) => {
            return Err(StoreError::io("keeping", path)(std::io::Error::other(
                format!(
                    "{e}; its snapshots are in {} already: move it to {} by hand and start again",
                    database.display(),
                    kept.display()
                ),
            )));
        }
    }
    write_tombstone(path, database)
}

/// Puts the tombstone at `path`, durably: on a store that never had a `metadata.json`
/// too, so that an earlier release refuses it rather than reading "no snapshots".
pub(crate) fn write_tombstone(path: &Path, database: &Path) -> Result<(), StoreError> {
    let tombstone = Tombstone {
        lamina_snapshots_moved_to: database.display().to_string(),
        why: "lamina keeps containerd snapshots in this SQLite database now; a release that reads this file would find no snapshots and remove their containers, so it refuses to start instead".into(),
    };
    let bytes = serde_json::to_vec_pretty(&tombstone)
        .map_err(|e| StoreError::io("encoding", path)(e.into()))?;
    lamina_store::write_durably(path, &bytes)
}
