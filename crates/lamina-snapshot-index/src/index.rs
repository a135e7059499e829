//! The containerd snapshot metadata as an SQLite database, `snapshots/metadata.db`.
//!
//! Why SQLite (rusqlite, SQLite compiled in): the snapshotter daemon holds it open while
//! `lamina clean`, `check` and `list` — separate processes — read it; SQLite is made for
//! several processes on one file, where redb, the pure-Rust choice, locks its file for one
//! process at a time. Every change is one transaction, written ahead to the WAL and
//! synced before it returns (`synchronous=FULL`): a crash keeps each call whole or not at
//! all, and nothing is rewritten whole. The indexes answer what each call asks — a key, a
//! parent's children, a committed layer under a parent, the commits in flight — so a call
//! costs the same with ten snapshots or ten thousand; only a listing and garbage
//! collection read every row, streaming. Statements are prepared once per connection
//! (`prepare_cached`): parsing SQL on every call was 7% of the daemon's CPU.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};

use crate::legacy::{self as snapshot_legacy, Legacy};
use crate::records::{Committing, REF_LABEL, SnapshotKind, SnapshotRecord};
use lamina_store::{Store, StoreError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
    key TEXT PRIMARY KEY NOT NULL,
    kind TEXT NOT NULL,
    parent TEXT,
    labels TEXT NOT NULL,
    reference TEXT,
    created_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    layer TEXT,
    container TEXT,
    committing TEXT
);
CREATE INDEX IF NOT EXISTS snapshots_by_parent ON snapshots (parent, reference);
CREATE INDEX IF NOT EXISTS snapshots_by_layer ON snapshots (layer) WHERE layer IS NOT NULL;
CREATE INDEX IF NOT EXISTS snapshots_by_container ON snapshots (container)
    WHERE container IS NOT NULL;
CREATE INDEX IF NOT EXISTS snapshots_committing ON snapshots (key)
    WHERE committing IS NOT NULL;
CREATE TABLE IF NOT EXISTS shapes (key TEXT PRIMARY KEY NOT NULL, shape TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS facts (name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
";

const COLUMNS: &str =
    "key, kind, parent, labels, created_ns, updated_ns, layer, container, committing";

/// Numbers the containers of actives and views (`snap-<n>`), never reused.
const NEXT_ID: &str = "next_id";
/// Set once `metadata.json` is in the database.
const MIGRATED: &str = "migrated_json";
/// The digest of the `metadata.json` that was migrated (a fact).
const MIGRATED_DIGEST: &str = "migrated_json_digest";
/// [`MIGRATED_DIGEST`] of a store that had no `metadata.json` to migrate.
const NOTHING_MIGRATED: &str = "none";

/// An open connection to a store's snapshot metadata.
#[derive(Debug)]
pub struct SnapshotIndex {
    conn: Connection,
    path: PathBuf,
    /// Never settled: no marker, nothing migrated (see [`SnapshotIndex::settle`]).
    fresh: bool,
    /// The connection was left syncing less than every write (a failed return to
    /// `synchronous=FULL` after [`SnapshotIndex::replace_unsynced`]): the next write
    /// sets it again first, or fails rather than be written unsynced.
    relaxed: bool,
}

/// Refuses a database, or its log or shared-memory file, that is not a regular file:
/// SQLite opens them itself, and a FIFO there would block every call.
fn refuse_non_regular_database(path: &Path) -> Result<(), StoreError> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::PathBuf::from(file);
        lamina_store::refuse_non_regular(&file).map_err(StoreError::io("opening", &file))?;
    }
    Ok(())
}

impl SnapshotIndex {
    /// Opens the database to read and write (the snapshotter): creates it, or migrates
    /// `metadata.json` into it, if needed.
    pub(crate) fn open(store: &Store) -> Result<SnapshotIndex, StoreError> {
        let dir = store.layout().snapshots();
        fs::create_dir_all(&dir).map_err(StoreError::io("creating", &dir))?;
        let path = store.layout().snapshot_db();
        let failed = |e: rusqlite::Error| sql_error("opening", &path, e);
        refuse_non_regular_database(&path)?;
        let conn = Connection::open(&path).map_err(failed)?;
        conn.busy_timeout(store.lock_timeout()).map_err(failed)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(failed)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(failed)?;
        let mut index = SnapshotIndex {
            conn,
            path,
            fresh: false,
            relaxed: false,
        };
        index.fresh = index.create_and_migrate(&store.layout().snapshot_metadata())?;
        // After the first transaction, which made the log: each later sync rewrites it
        // in place (`log_size.rs`).
        crate::log_size::extend(store, &index.conn, &index.path);
        Ok(index)
    }

    /// Opens the snapshots to read only (`check`, layer collection): the database if there
    /// is one, else an earlier release's `metadata.json`, read in place and not migrated
    /// (that release's daemon may still be running); none if there is neither. A database
    /// without its table is refused, never read as "no snapshots": collection would take
    /// every snapshot's layers.
    pub(crate) fn open_read_only(store: &Store) -> Result<Option<SnapshotIndex>, StoreError> {
        let path = store.layout().snapshot_db();
        let legacy_path = store.layout().snapshot_metadata();
        if path.exists() {
            let failed = |e: rusqlite::Error| sql_error("opening", &path, e);
            refuse_non_regular_database(&path)?;
            let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(failed)?;
            conn.busy_timeout(store.lock_timeout()).map_err(failed)?;
            let index = SnapshotIndex {
                conn,
                path: path.clone(),
                fresh: false,
                relaxed: false,
            };
            let has_table = index
                .conn
                .query_row(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'",
                    [],
                    |_| Ok(()),
                )
                .optional()
                .map_err(failed)?
                .is_some();
            if !has_table {
                return Err(
                    index.bad("it has no snapshot table (empty, or its -wal file was lost)".into())
                );
            }
            return Ok(Some(index));
        }
        let legacy = snapshot_legacy::read(&legacy_path)?;
        if path.exists() {
            // The daemon's first open made it meanwhile (and may have set the file aside).
            return Self::open_read_only(store);
        }
        match legacy {
            Legacy::Absent => Ok(None),
            Legacy::Tombstone => Err(StoreError::io("reading", &path)(std::io::Error::other(
                format!(
                    "it is missing, and {} says the snapshots moved there",
                    legacy_path.display()
                ),
            ))),
            Legacy::File(old, _) => {
                let failed = |e: rusqlite::Error| sql_error("reading", &legacy_path, e);
                let conn = Connection::open_in_memory().map_err(failed)?;
                conn.execute_batch(SCHEMA).map_err(failed)?;
                for (key, record) in &old.snapshots {
                    insert(&conn, key, record).map_err(failed)?;
                }
                Ok(Some(SnapshotIndex {
                    conn,
                    path: legacy_path,
                    fresh: false,
                    relaxed: false,
                }))
            }
        }
    }

    /// Whether the database has never been settled (see [`SnapshotIndex::settle`]): a
    /// store whose snapshots were never recorded — or whose database was lost. The
    /// snapshotter refuses the second (its containers would look unnamed), on every start
    /// until an operator restores the database or removes the containers.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// Marks a fresh database as the store's own (the marker) and puts the tombstone at
    /// `metadata.json`, once the snapshotter found nothing a new database would wrongly
    /// call unnamed. Until then every open is fresh again.
    pub fn settle(&mut self, legacy_path: &Path) -> Result<(), StoreError> {
        if !self.fresh {
            return Ok(());
        }
        // No file was migrated: a `metadata.json` that turns up later (an earlier release
        // run against this store) matches no digest and is refused, not set aside.
        self.write(|tx| {
            set_counter(tx, MIGRATED, 1)?;
            set_fact(tx, MIGRATED_DIGEST, NOTHING_MIGRATED)
        })?;
        snapshot_legacy::write_tombstone(legacy_path, &self.path)?;
        self.fresh = false;
        Ok(())
    }

    /// Puts the tombstone at `metadata.json` without settling: a refused start still stops
    /// an earlier release from reading "no snapshots" and removing their containers.
    pub fn write_tombstone(&self, legacy_path: &Path) -> Result<(), StoreError> {
        snapshot_legacy::write_tombstone(legacy_path, &self.path)
    }

    /// Creates the tables and moves an earlier release's `metadata.json` in, in one
    /// transaction, then sets the file aside with a tombstone in its place
    /// (`snapshot_legacy.rs`); a crash in between migrates nothing twice (the marker says
    /// it is done). True if the database is new and nothing was migrated.
    fn create_and_migrate(&mut self, legacy_path: &Path) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let failed = |e: rusqlite::Error| sql_error("creating", &path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(failed)?;
        tx.execute_batch(SCHEMA).map_err(failed)?;
        let migrated = counter(&tx, MIGRATED).map_err(failed)?.is_some();
        let legacy = snapshot_legacy::read(legacy_path)?;
        let mut fresh = false;
        if migrated && let Legacy::File(_, digest) = &legacy {
            // Migrated already: only the very file that was (a crash before it was set
            // aside) may stand there. Another is an earlier release's work since, whose
            // snapshots the database does not have.
            let was = fact(&tx, MIGRATED_DIGEST).map_err(failed)?;
            // No digest: a database made before digests were kept, trusted as before.
            if was.is_some_and(|was| was != *digest) {
                return Err(StoreError::io("opening", &path)(std::io::Error::other(
                    format!(
                        "{} changed after its snapshots were migrated here (an earlier release wrote it again?): the two disagree; keep one and move the other away",
                        legacy_path.display()
                    ),
                )));
            }
        }
        if !migrated {
            match &legacy {
                Legacy::File(old, digest) => {
                    for (key, record) in &old.snapshots {
                        insert(&tx, key, record).map_err(failed)?;
                    }
                    set_counter(&tx, NEXT_ID, old.next_id).map_err(failed)?;
                    set_fact(&tx, MIGRATED_DIGEST, digest).map_err(failed)?;
                    tracing::info!(snapshots = old.snapshots.len(), from = %legacy_path.display(), "migrated snapshot metadata");
                }
                Legacy::Tombstone => {
                    return Err(StoreError::io("opening", &path)(std::io::Error::other(
                        format!(
                            "it holds no snapshots, but {} says they moved here: the database was lost or replaced (restore it together with its -wal file), or an earlier start refused the snapshot containers it did not know",
                            legacy_path.display()
                        ),
                    )));
                }
                // Settled (marker and tombstone) only once the snapshotter has checked
                // that no container needs a row this database lacks: see `settle`.
                Legacy::Absent => fresh = true,
            }
            if !fresh {
                set_counter(&tx, MIGRATED, 1).map_err(failed)?;
            }
        }
        tx.commit().map_err(failed)?;
        match legacy {
            Legacy::File(..) => snapshot_legacy::set_aside(legacy_path, &self.path)?,
            // A crash between setting the file aside and writing the tombstone.
            Legacy::Absent if !fresh => snapshot_legacy::write_tombstone(legacy_path, &self.path)?,
            Legacy::Absent | Legacy::Tombstone => {}
        }
        Ok(fresh)
    }

    /// The snapshot `key`, if there is one.
    pub fn get(&self, key: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE key = ?1");
        let row = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut statement| statement.query_row([key], decode))
            .optional()
            .map_err(|e| self.failed("reading", e))?;
        match row {
            None => Ok(None),
            Some((_, record)) => record.map(Some).map_err(|why| self.bad(why)),
        }
    }

    pub fn contains(&self, key: &str) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached("SELECT 1 FROM snapshots WHERE key = ?1")
            .and_then(|mut statement| statement.query_row([key], |_| Ok(())))
            .optional()
            .map(|found| found.is_some())
            .map_err(|e| self.failed("reading", e))
    }

    /// A snapshot whose parent is `key`, if any.
    pub fn first_child(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .prepare_cached("SELECT key FROM snapshots WHERE parent = ?1 LIMIT 1")
            .and_then(|mut statement| statement.query_row([key], |row| row.get(0)))
            .optional()
            .map_err(|e| self.failed("reading", e))
    }

    /// Whether a committed snapshot on `parent` (none: a bottom layer) carries `reference`
    /// as its [`REF_LABEL`].
    pub fn has_committed(&self, parent: Option<&str>, reference: &str) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT 1 FROM snapshots WHERE parent IS ?1 AND reference = ?2 AND kind = 'committed' LIMIT 1",
            )
            .and_then(|mut statement| statement.query_row(params![parent, reference], |_| Ok(())))
            .optional()
            .map(|found| found.is_some())
            .map_err(|e| self.failed("reading", e))
    }

    /// The number the next snapshot container takes (`snap-<n>`).
    pub fn next_container_number(&self) -> Result<u64, StoreError> {
        counter(&self.conn, NEXT_ID)
            .map(|n| n.unwrap_or(0))
            .map_err(|e| self.failed("reading", e))
    }

    /// Records a new snapshot that took container number `number`, in one transaction.
    pub fn insert_numbered(
        &mut self,
        key: &str,
        record: &SnapshotRecord,
        number: u64,
        shape: &str,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            insert(tx, key, record)?;
            tx.prepare_cached("INSERT OR REPLACE INTO shapes (key, shape) VALUES (?1, ?2)")?
                .execute(params![key, shape])?;
            set_counter(tx, NEXT_ID, number.saturating_add(1))
        })
    }

    /// Moves the container counter past `number` (never back): a container about to be
    /// made there, past the next number, is then not newer than the database.
    pub fn reserve_numbers_to(&mut self, number: u64) -> Result<(), StoreError> {
        if self.next_container_number()? > number {
            return Ok(());
        }
        self.write(|tx| set_counter(tx, NEXT_ID, number.saturating_add(1)))
    }

    /// What snapshot `key`'s container was made from (the snapshotter's own encoding),
    /// as its Prepare recorded it; `None` for one prepared by an earlier release. Only
    /// the snapshotter reads it: the table is not in databases an earlier release made
    /// until the snapshotter opens them.
    pub fn shape(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .prepare_cached("SELECT shape FROM shapes WHERE key = ?1")
            .and_then(|mut statement| statement.query_row([key], |row| row.get(0)).optional())
            .map_err(|e| self.failed("reading", e))
    }

    /// Gives active snapshot or view `key` (`record`) the new container numbered
    /// `number`, and moves the counter past it, in one transaction.
    pub fn renumber(
        &mut self,
        key: &str,
        record: &SnapshotRecord,
        number: u64,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            delete(tx, key)?;
            insert(tx, key, record)?;
            set_counter(tx, NEXT_ID, number.saturating_add(1))
        })
    }

    /// Records a new snapshot.
    pub fn insert(&mut self, key: &str, record: &SnapshotRecord) -> Result<(), StoreError> {
        self.write(|tx| insert(tx, key, record))
    }

    /// Replaces the record of existing snapshot `key`.
    pub fn update(&mut self, key: &str, record: &SnapshotRecord) -> Result<(), StoreError> {
        self.replace(key, key, record)
    }

    /// Swaps snapshot `old` for `new_key` (a commit: the active goes, the committed
    /// snapshot comes), in one transaction.
    pub fn replace(
        &mut self,
        old: &str,
        new_key: &str,
        record: &SnapshotRecord,
    ) -> Result<(), StoreError> {
        self.write(|tx| replace_rows(tx, old, new_key, record))
    }

    /// [`SnapshotIndex::replace`], committed without syncing the log
    /// (`synchronous=NORMAL` for this one transaction): for a change that a crash may
    /// lose because a synced row already says how to make it again (a commit's intent).
    /// The next synced transaction, or a checkpoint, makes it durable with everything
    /// before it: the log is one file, synced whole.
    pub fn replace_unsynced(
        &mut self,
        old: &str,
        new_key: &str,
        record: &SnapshotRecord,
    ) -> Result<(), StoreError> {
        self.unsynced(|tx| replace_rows(tx, old, new_key, record))
    }

    /// `change` in one transaction committed without syncing the log
    /// (`synchronous=NORMAL` for it alone); later writes sync every write again.
    fn unsynced(
        &mut self,
        change: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        self.relaxed = true;
        self.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| sql_error("writing", &self.path, e))?;
        let changed = self.transaction(change);
        // The change is made whatever this says: a failure here is the next write's.
        // Returned as the change's, it would fail a call that happened and leave every
        // later write unsynced.
        if let Err(e) = self.sync_every_write() {
            tracing::warn!(error = %e, "could not set the snapshot database to sync every write again: the next write tries first");
        }
        changed
    }

    pub fn remove(&mut self, key: &str) -> Result<(), StoreError> {
        self.write(|tx| remove_rows(tx, key))
    }

    /// [`SnapshotIndex::remove`], committed without syncing the log: for an active or a
    /// view, whose row a crash may bring back. containerd has forgotten the snapshot
    /// before it asks (its garbage collection removes it again from the snapshotter's
    /// walk), and the daemon's start makes its container again like any other a crash
    /// lost. The next synced write makes the removal durable with everything before it.
    pub fn remove_unsynced(&mut self, key: &str) -> Result<(), StoreError> {
        self.unsynced(|tx| remove_rows(tx, key))
    }

    /// Keys of actives whose commit started and may not have finished.
    pub fn interrupted_commits(&self) -> Result<Vec<String>, StoreError> {
        self.collect(
            "SELECT key FROM snapshots WHERE committing IS NOT NULL",
            |row| row.get(0),
        )
    }

    /// Each recorded commit intent, by the key of the active it commits.
    pub fn commit_intents(&self) -> Result<Vec<(String, Committing)>, StoreError> {
        let mut intents = Vec::new();
        for key in self.interrupted_commits()? {
            if let Some(committing) = self.get(&key)?.and_then(|row| row.committing) {
                intents.push((key, committing));
            }
        }
        Ok(intents)
    }

    /// How many snapshots there are of each kind, every kind named (zero if none). One
    /// aggregate query that decodes no row: the daemon's metrics ask on every scrape,
    /// holding the connection the snapshots service shares.
    pub fn count_by_kind(&self) -> Result<[(SnapshotKind, u64); 3], StoreError> {
        let counted: Vec<(String, i64)> = self.collect(
            "SELECT kind, COUNT(*) FROM snapshots GROUP BY kind",
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        let mut counts = [
            (SnapshotKind::Active, 0),
            (SnapshotKind::Committed, 0),
            (SnapshotKind::View, 0),
        ];
        for (kind, n) in counted {
            let kind = SnapshotKind::parse(&kind)
                .ok_or_else(|| self.bad(format!("a snapshot of unknown kind `{kind}`")))?;
            if let Some(slot) = counts.iter_mut().find(|(k, _)| *k == kind) {
                slot.1 = u64::try_from(n).unwrap_or(0);
            }
        }
        Ok(counts)
    }

    /// Containers that snapshots name.
    pub fn containers(&self) -> Result<HashSet<String>, StoreError> {
        self.collect(
            "SELECT container FROM snapshots WHERE container IS NOT NULL",
            |row| row.get(0),
        )
    }

    /// Layers that committed snapshots hold and commits in flight are making.
    pub fn layers(&self) -> Result<HashSet<Digest>, StoreError> {
        let mut layers = HashSet::new();
        self.for_each(|_, record| {
            layers.extend(record.layer.clone());
            layers.extend(record.committing.map(|c| c.layer));
        })?;
        Ok(layers)
    }

    /// Every snapshot, by key, one row at a time.
    pub fn for_each(&self, mut each: impl FnMut(String, SnapshotRecord)) -> Result<(), StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM snapshots ORDER BY key");
        let mut statement = self
            .conn
            .prepare_cached(&sql)
            .map_err(|e| self.failed("reading", e))?;
        let rows = statement
            .query_map([], decode)
            .map_err(|e| self.failed("reading", e))?;
        for row in rows {
            let (key, record) = row.map_err(|e| self.failed("reading", e))?;
            each(key, record.map_err(|why| self.bad(why))?);
        }
        Ok(())
    }

    fn collect<T: Eq + std::hash::Hash, C: FromIterator<T>>(
        &self,
        sql: &str,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<C, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(sql)
            .map_err(|e| self.failed("reading", e))?;
        let rows = statement
            .query_map([], map)
            .map_err(|e| self.failed("reading", e))?;
        rows.collect::<rusqlite::Result<C>>()
            .map_err(|e| self.failed("reading", e))
    }

    /// One synced transaction.
    fn write(
        &mut self,
        change: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        self.sync_every_write()?;
        self.transaction(change)
    }

    /// Puts `synchronous=FULL` back if [`SnapshotIndex::replace_unsynced`] could not.
    fn sync_every_write(&mut self) -> Result<(), StoreError> {
        if self.relaxed {
            self.conn
                .pragma_update(None, "synchronous", "FULL")
                .map_err(|e| sql_error("writing", &self.path, e))?;
            self.relaxed = false;
        }
        Ok(())
    }

    /// One transaction, synced as the connection is set to.
    fn transaction(
        &mut self,
        change: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let failed = |e| sql_error("writing", &path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(failed)?;
        change(&tx).map_err(failed)?;
        tx.commit().map_err(failed)
    }

    fn failed(&self, op: &'static str, e: rusqlite::Error) -> StoreError {
        sql_error(op, &self.path, e)
    }

    fn bad(&self, why: String) -> StoreError {
        StoreError::io("reading", &self.path)(std::io::Error::other(why))
    }
}

/// Snapshot `old` swapped for `new_key` (the same key: an update).
fn replace_rows(
    tx: &rusqlite::Transaction<'_>,
    old: &str,
    new_key: &str,
    record: &SnapshotRecord,
) -> rusqlite::Result<()> {
    delete(tx, old)?;
    if old != new_key {
        forget_shape(tx, old)?;
    }
    insert(tx, new_key, record)
}

pub(crate) fn sql_error(op: &'static str, path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::io(op, path)(std::io::Error::other(e))
}

fn counter(conn: &Connection, name: &str) -> rusqlite::Result<Option<u64>> {
    conn.query_row(
        "SELECT value FROM counters WHERE name = ?1",
        [name],
        |row| row.get::<_, i64>(0),
    )
    .optional()
    .map(|v| v.map(|v| u64::try_from(v).unwrap_or(0)))
}

fn set_counter(conn: &Connection, name: &str, value: u64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![name, i64::try_from(value).unwrap_or(i64::MAX)])
    .map(drop)
}

/// A text fact about the database (what was migrated), if recorded.
fn fact(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row("SELECT value FROM facts WHERE name = ?1", [name], |row| {
        row.get(0)
    })
    .optional()
}

fn set_fact(conn: &Connection, name: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO facts (name, value) VALUES (?1, ?2)",
        params![name, value],
    )
    .map(drop)
}

fn insert(conn: &Connection, key: &str, r: &SnapshotRecord) -> rusqlite::Result<()> {
    let labels = serde_json::to_string(&r.labels).unwrap_or_else(|_| "{}".into());
    let committing = r
        .committing
        .as_ref()
        .and_then(|c| serde_json::to_string(c).ok());
    conn.prepare_cached(&format!(
        "INSERT INTO snapshots ({COLUMNS}, reference) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
    ))?
    .execute(params![
            key,
            r.kind.as_str(),
            r.parent,
            labels,
            nanos(r.created_ns),
            nanos(r.updated_ns),
            r.layer.as_ref().map(ToString::to_string),
            r.container,
            committing,
            r.labels.get(REF_LABEL),
    ])
    .map(drop)
}

fn delete(conn: &Connection, key: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM snapshots WHERE key = ?1")?
        .execute([key])
        .map(drop)
}

/// Snapshot `key`'s row and the shape its Prepare recorded.
fn remove_rows(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<()> {
    delete(tx, key)?;
    forget_shape(tx, key)
}

fn forget_shape(conn: &Connection, key: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM shapes WHERE key = ?1")?
        .execute([key])
        .map(drop)
}

fn nanos(ns: u128) -> i64 {
    i64::try_from(ns).unwrap_or(i64::MAX)
}

/// One row, as its key and its record — or why the record is not one (a damaged or
/// hand-edited database), which the caller reports naming the file.
type Decoded = (String, Result<SnapshotRecord, String>);

fn decode(row: &Row<'_>) -> rusqlite::Result<Decoded> {
    let key: String = row.get(0)?;
    let kind: String = row.get(1)?;
    let parent: Option<String> = row.get(2)?;
    let labels: String = row.get(3)?;
    let created: i64 = row.get(4)?;
    let updated: i64 = row.get(5)?;
    let layer: Option<String> = row.get(6)?;
    let container: Option<String> = row.get(7)?;
    let committing: Option<String> = row.get(8)?;
    let record = (|| {
        let kind = SnapshotKind::parse(&kind).ok_or_else(|| format!("kind `{kind}`"))?;
        let labels: BTreeMap<String, String> =
            serde_json::from_str(&labels).map_err(|e| format!("labels: {e}"))?;
        let layer = layer
            .map(|l| Digest::parse(&l).map_err(|e| format!("layer: {e}")))
            .transpose()?;
        let committing = committing
            .map(|c| serde_json::from_str::<Committing>(&c).map_err(|e| format!("commit: {e}")))
            .transpose()?;
        Ok(SnapshotRecord {
            kind,
            parent,
            labels,
            created_ns: u128::try_from(created).unwrap_or(0),
            updated_ns: u128::try_from(updated).unwrap_or(0),
            layer,
            container,
            committing,
        })
    })()
    .map_err(|why: String| format!("snapshot `{key}`: {why}"));
    Ok((key, record))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::StoreSnapshots;

    fn record(kind: SnapshotKind, parent: Option<&str>, layer: Option<&str>) -> SnapshotRecord {
        SnapshotRecord {
            kind,
            parent: parent.map(str::to_string),
            labels: BTreeMap::new(),
            created_ns: 1,
            updated_ns: 2,
            layer: layer.map(|l| Digest::of(l.as_bytes())),
            container: (kind != SnapshotKind::Committed).then(|| format!("snap-{parent:?}")),
            committing: None,
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    #[test]
    fn counts_by_kind_name_every_kind() {
        let (_dir, store) = store();
        let mut index = store.snapshots().unwrap();
        let none = [
            (SnapshotKind::Active, 0),
            (SnapshotKind::Committed, 0),
            (SnapshotKind::View, 0),
        ];
        assert_eq!(index.count_by_kind().unwrap(), none);
        index
            .insert("c", &record(SnapshotKind::Committed, None, Some("c")))
            .unwrap();
        index
            .insert("a1", &record(SnapshotKind::Active, Some("c"), None))
            .unwrap();
        index
            .insert("a2", &record(SnapshotKind::Active, Some("c"), None))
            .unwrap();
        assert_eq!(
            index.count_by_kind().unwrap(),
            [
                (SnapshotKind::Active, 2),
                (SnapshotKind::Committed, 1),
                (SnapshotKind::View, 0),
            ]
        );
    }

    /// The one unsynced change leaves the connection syncing every later write, and a
    /// connection left relaxed (its reset failed) is set again before the next write.
    #[test]
    fn an_unsynced_replace_leaves_every_later_write_synced() {
        let (_dir, store) = store();
        let mut index = store.snapshots().unwrap();
        let synchronous = |index: &SnapshotIndex| -> i64 {
            index
                .conn
                .query_row("PRAGMA synchronous", [], |row| row.get(0))
                .unwrap()
        };
        const FULL: i64 = 2;
        let active = record(SnapshotKind::Active, None, None);
        index.insert("a", &active).unwrap();
        let committed = record(SnapshotKind::Committed, None, Some("l"));
        index.replace_unsynced("a", "c", &committed).unwrap();
        assert_eq!(index.get("c").unwrap(), Some(committed));
        assert_eq!(synchronous(&index), FULL);

        index
            .conn
            .pragma_update(None, "synchronous", "NORMAL")
            .unwrap();
        index.relaxed = true;
        index.insert("b", &active).unwrap();
        assert_eq!(synchronous(&index), FULL);
        assert!(!index.relaxed);
    }

    #[test]
    fn each_query_answers_from_the_rows_it_names() {
        let (_dir, store) = store();
        let mut index = store.snapshots().unwrap();
        let mut base = record(SnapshotKind::Committed, None, Some("a"));
        base.labels.insert(REF_LABEL.into(), "sha256:aa".into());
        index.insert("base", &base).unwrap();
        index
            .insert_numbered(
                "p",
                &record(SnapshotKind::Active, Some("base"), None),
                7,
                "{}",
            )
            .unwrap();
        assert_eq!(index.get("base").unwrap(), Some(base.clone()));
        assert_eq!(index.get("nope").unwrap(), None);
        assert!(index.contains("p").unwrap());
        assert_eq!(index.next_container_number().unwrap(), 8);
        assert_eq!(index.shape("p").unwrap().as_deref(), Some("{}"));
        assert_eq!(index.shape("base").unwrap(), None);
        assert_eq!(index.first_child("base").unwrap().as_deref(), Some("p"));
        assert_eq!(index.first_child("p").unwrap(), None);
        assert!(index.has_committed(None, "sha256:aa").unwrap());
        assert!(!index.has_committed(Some("base"), "sha256:aa").unwrap());
        assert!(!index.has_committed(None, "sha256:bb").unwrap());

        // A commit: intent first, then the swap in one transaction.
        let mut active = index.get("p").unwrap().unwrap();
        active.committing = Some(Committing {
            name: "c".into(),
            layer: Digest::of(b"b"),
            labels: BTreeMap::new(),
            parent: None,
        });
        index.update("p", &active).unwrap();
        assert_eq!(index.shape("p").unwrap().as_deref(), Some("{}"), "kept");
        assert_eq!(index.interrupted_commits().unwrap(), ["p"]);
        assert_eq!(
            index.layers().unwrap(),
            HashSet::from([Digest::of(b"a"), Digest::of(b"b")])
        );
        let committed = record(SnapshotKind::Committed, Some("base"), Some("b"));
        index.replace("p", "c", &committed).unwrap();
        assert_eq!(
            index.shape("p").unwrap(),
            None,
            "the active's shape goes with it"
        );
        assert!(index.interrupted_commits().unwrap().is_empty());
        assert_eq!(index.get("p").unwrap(), None);
        assert!(index.containers().unwrap().is_empty());
        let mut keys = Vec::new();
        index.for_each(|key, _| keys.push(key)).unwrap();
        assert_eq!(keys, ["base", "c"]);
        index.remove("c").unwrap();
        assert_eq!(index.first_child("base").unwrap(), None);
    }

    #[test]
    fn a_json_file_of_an_earlier_release_is_migrated_once_and_kept_aside() {
        let (_dir, store) = store();
        let legacy = store.layout().snapshot_metadata();
        fs::create_dir_all(legacy.parent().unwrap()).unwrap();
        let old = serde_json::json!({
            "next_id": 12,
            "snapshots": {
                "base": record(SnapshotKind::Committed, None, Some("a")),
                "p": record(SnapshotKind::Active, Some("base"), None),
            }
        });
        fs::write(&legacy, serde_json::to_vec_pretty(&old).unwrap()).unwrap();
        let index = store.snapshots().unwrap();
        assert_eq!(index.next_container_number().unwrap(), 12);
        assert_eq!(
            index.get("p").unwrap(),
            Some(record(SnapshotKind::Active, Some("base"), None))
        );
        assert!(!index.fresh());
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::Tombstone
        ));
        let aside = legacy.with_extension("json.migrated");
        assert!(aside.exists());
        drop(index);
        // A crash between the commit and the rename: the marker stops a second import.
        fs::remove_file(&legacy).unwrap();
        fs::rename(&aside, &legacy).unwrap();
        let mut index = store.snapshots().unwrap();
        index.remove("p").unwrap();
        drop(index);
        let index = store.snapshots().unwrap();
        assert_eq!(index.get("p").unwrap(), None, "migrated twice");
        drop(index);

        // An earlier release that wrote its file again after the migration (over the
        // tombstone) is refused, naming both files, and neither is touched.
        fs::write(&legacy, serde_json::to_vec(&old).unwrap()).unwrap();
        let err = store.snapshots().unwrap_err().to_string();
        assert!(
            err.contains("changed after its snapshots were migrated"),
            "{err}"
        );
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::File(..)
        ));
    }

    #[test]
    fn readers_neither_create_nor_migrate_and_refuse_a_database_without_its_table() {
        let (_dir, store) = store();
        assert!(store.snapshots_if_any().unwrap().is_none());
        assert!(
            !store.layout().snapshot_db().exists(),
            "a reader made a database"
        );
        let legacy = store.layout().snapshot_metadata();
        fs::create_dir_all(legacy.parent().unwrap()).unwrap();
        let old = serde_json::json!({
            "next_id": 3,
            "snapshots": { "base": record(SnapshotKind::Committed, None, Some("a")) }
        });
        fs::write(&legacy, serde_json::to_vec(&old).unwrap()).unwrap();
        let read = store.snapshots_if_any().unwrap().unwrap();
        assert_eq!(read.layers().unwrap(), HashSet::from([Digest::of(b"a")]));
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::File(..)
        ));
        assert!(!store.layout().snapshot_db().exists(), "a reader migrated");

        // The database lost its contents (a zero-length file; a main file whose -wal
        // was deleted): readers refuse it, and the snapshotter's open refuses it when the
        // tombstone says the snapshots moved there.
        drop(read);
        drop(store.snapshots().unwrap());
        fs::write(store.layout().snapshot_db(), b"").unwrap();
        for name in ["metadata.db-wal", "metadata.db-shm"] {
            let _ = fs::remove_file(legacy.with_file_name(name));
        }
        let err = store.snapshots_if_any().unwrap_err().to_string();
        assert!(err.contains("no snapshot table"), "{err}");
        let err = store.snapshots().unwrap_err().to_string();
        assert!(err.contains("says they moved here"), "{err}");
    }

    #[test]
    fn a_new_database_is_fresh_until_settled_then_tombstoned() {
        let (_dir, store) = store();
        let legacy = store.layout().snapshot_metadata();
        assert!(store.snapshots().unwrap().fresh());
        // Still fresh on the next open: nothing settled it (a refused start stays refused).
        let mut index = store.snapshots().unwrap();
        assert!(index.fresh());
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::Absent
        ));
        index.settle(&legacy).unwrap();
        drop(index);
        assert!(!store.snapshots().unwrap().fresh());
        // An earlier release must refuse this store too, not read "no snapshots".
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::Tombstone
        ));
        // One run against it anyway (the tombstone removed by hand) wrote its own file:
        // refused, not set aside with its snapshots dropped.
        let old = serde_json::json!({ "next_id": 1, "snapshots": {} });
        fs::write(&legacy, serde_json::to_vec(&old).unwrap()).unwrap();
        let err = store.snapshots().unwrap_err().to_string();
        assert!(err.contains("changed after"), "{err}");
        // Lost between setting a migrated file aside and writing the tombstone: put back.
        fs::remove_file(&legacy).unwrap();
        drop(store.snapshots().unwrap());
        assert!(matches!(
            snapshot_legacy::read(&legacy).unwrap(),
            Legacy::Tombstone
        ));
    }

    #[test]
    fn a_damaged_row_is_an_error_naming_the_database_and_the_snapshot() {
        let (_dir, store) = store();
        let mut index = store.snapshots().unwrap();
        index
            .insert("k", &record(SnapshotKind::View, Some("x"), None))
            .unwrap();
        index
            .conn
            .execute("UPDATE snapshots SET kind = 'bogus' WHERE key = 'k'", [])
            .unwrap();
        let err = index.get("k").unwrap_err().to_string();
        assert!(err.contains("metadata.db"), "{err}");
        assert!(err.contains("snapshot `k`: kind `bogus`"), "{err}");
    }

    #[test]
    fn a_json_file_that_is_not_one_is_refused_and_left_in_place() {
        let (_dir, store) = store();
        let legacy = store.layout().snapshot_metadata();
        fs::create_dir_all(legacy.parent().unwrap()).unwrap();
        fs::write(&legacy, b"{\"next_id\": 1, \"snap").unwrap();
        let err = store.snapshots().unwrap_err().to_string();
        assert!(err.contains("metadata.json"), "{err}");
        assert!(legacy.exists());
    }
}
