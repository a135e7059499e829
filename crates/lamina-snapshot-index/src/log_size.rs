//! The write-ahead log at full size from the start, so that every synced change rewrites
//! it in place.
//!
//! A change's sync is an `fdatasync` of the log (`.cargo/config.toml`). While the log
//! grows, each one also commits the filesystem's journal — the file's new size and blocks
//! — and with it whatever else the journal holds, such as a Prepare's container
//! directories: 1–1.5 ms against 0.25 ms in place (docs/containerd.md). SQLite starts the
//! log over from its first frame after a checkpoint but never shrinks it, so a log grows
//! only until the first checkpoint; it is deleted when the daemon's connection closes, and
//! without this every start paid that growth again for its first ~75 container cycles.
//!
//! Zeros past the log's last frame are no frame to SQLite: a frame counts only if its
//! salt matches the log header's and its checksum chains from the frame before, so
//! recovery stops at the first zero frame, and a zero header is an empty log. Extending a
//! log in use therefore loses nothing; only the writer (the snapshotter, under its open)
//! extends it.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use lamina_store::{Store, StoreError};

/// A log frame's header, before the page it carries.
const FRAME_HEADER: u64 = 24;
/// The log's own header.
const LOG_HEADER: u64 = 32;
/// Frames past the checkpoint threshold: the transaction that crosses it is written
/// whole before the checkpoint runs.
const FRAMES_PAST_CHECKPOINT: u64 = 100;
/// Zeros written per call.
const CHUNK: usize = 256 * 1024;
/// The most a log is extended to, whatever the database's page size.
const MOST_BYTES: u64 = 16 << 20;
/// The log is extended only where this many times what it takes is free.
const FREE_FACTOR: u64 = 4;

/// The log's path beside the database at `db`.
fn log_path(db: &Path) -> PathBuf {
    let mut log = db.as_os_str().to_owned();
    log.push("-wal");
    PathBuf::from(log)
}

/// Extends the log of the database at `db`, open in `conn`, to the size it reaches
/// before its first checkpoint starts it over. Best effort: a store's filesystem too full
/// for it (or failing) leaves the log to grow as SQLite grows it, slower but whole, and
/// the daemon still starts and serves — containerd frees space through it.
pub(crate) fn extend(store: &Store, conn: &Connection, db: &Path) {
    let log = log_path(db);
    let extended = full_size(conn)
        .map_err(|e| crate::index::sql_error("reading", db, e))
        .and_then(|size| extend_to(store, &log, size));
    if let Err(e) = extended {
        tracing::warn!(log = %log.display(), error = %e, "the snapshot database's log was not extended to its full size: its syncs commit the filesystem's journal until it has grown");
    }
}

/// The size the log of `conn` reaches before its first checkpoint starts it over, at
/// most [`MOST_BYTES`].
fn full_size(conn: &Connection) -> rusqlite::Result<u64> {
    let page: i64 = conn.query_row("PRAGMA page_size", [], |row| row.get(0))?;
    let checkpoint_frames: i64 =
        conn.query_row("PRAGMA wal_autocheckpoint", [], |row| row.get(0))?;
    let frames = checkpoint_frames.max(0) as u64 + FRAMES_PAST_CHECKPOINT;
    Ok((LOG_HEADER + frames * (FRAME_HEADER + page.max(0) as u64)).min(MOST_BYTES))
}

/// Extends the log at `log` with zeros to `size` and syncs it (data, size and blocks), if
/// it is shorter. A log not there yet (SQLite makes it on the first read) is left to
/// SQLite. It only ever appends: a failure part-way leaves zeros, which are no frame
/// either, and the file is never cut, where another connection may have written frames.
fn extend_to(store: &Store, log: &Path, size: u64) -> Result<(), StoreError> {
    let file = match lamina_store::open_regular_file_to_append(log) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("opening", log)(e)),
    };
    let mut length = file
        .metadata()
        .map_err(StoreError::io("reading", log))?
        .len();
    if length >= size {
        return Ok(());
    }
    // Zeros are never given back: on a filesystem nearly full they would bring the
    // next Prepare's ENOSPC closer.
    let free = rustix::fs::fstatvfs(&file)
        .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        .map_err(StoreError::errno("reading the filesystem of", log))?;
    if free < (size - length).saturating_mul(FREE_FACTOR) {
        return Err(StoreError::io("extending", log)(std::io::Error::other(
            format!(
                "{free} bytes free, less than {FREE_FACTOR} times the {} the log would take",
                size - length
            ),
        )));
    }
    let zeros = vec![0u8; CHUNK];
    let host = store.host();
    while length < size {
        let n = (size - length).min(CHUNK as u64) as usize;
        host.write_all(&file, log, &zeros[..n])
            .map_err(StoreError::errno("extending", log))?;
        length += n as u64;
    }
    host.fsync(&file, log)
        .map_err(StoreError::errno("syncing", log))
}
