//! The snapshot index's write-ahead log is at full size once the snapshotter has opened
//! it, so a synced change rewrites it in place (no journal commit for a new size), and
//! the zeros past its frames lose nothing across a crash.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use lamina_snapshot_index::{SnapshotKind, SnapshotRecord, StoreSnapshots};
use lamina_store::Store;

fn committed(n: u64) -> SnapshotRecord {
    SnapshotRecord {
        kind: SnapshotKind::Committed,
        parent: None,
        labels: BTreeMap::from([("n".to_string(), n.to_string())]),
        created_ns: n.into(),
        updated_ns: n.into(),
        layer: Some(lamina_image::Digest::of(&n.to_le_bytes())),
        container: None,
        committing: None,
    }
}

/// The snapshot database's write-ahead log.
fn log_path(store: &Store) -> std::path::PathBuf {
    let mut log = store.layout().snapshot_db().into_os_string();
    log.push("-wal");
    log.into()
}

fn log_size(store: &Store) -> u64 {
    std::fs::metadata(log_path(store)).unwrap().len()
}

#[test]
fn the_log_is_full_size_once_opened_and_synced_changes_do_not_grow_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("store")).unwrap();
    let mut index = store.snapshots().unwrap();
    let opened = log_size(&store);
    // 1100 frames of 4 KiB pages past the header: the size of the first checkpoint.
    assert!(opened >= 32 + 1100 * (24 + 4096), "log of {opened} bytes");
    index.insert("first", &committed(u64::MAX)).unwrap();
    let generation = log_generation(&store);
    let mut n = 0;
    // Until a checkpoint has started the log over (its header's checkpoint sequence
    // moves on), and then as far again: the log never grew.
    while log_generation(&store) == generation {
        index.insert(&format!("k{n}"), &committed(n)).unwrap();
        n += 1;
        assert!(n < 5000, "no checkpoint started the log over");
    }
    for m in n..2 * n {
        index.insert(&format!("k{m}"), &committed(m)).unwrap();
    }
    assert_eq!(log_size(&store), opened);
}

/// The log header's checkpoint sequence number: a checkpoint that starts the log over
/// moves it on.
fn log_generation(store: &Store) -> [u8; 4] {
    let mut sequence = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(log_path(store)).unwrap(),
        &mut sequence,
        12,
    )
    .unwrap();
    sequence
}

#[test]
fn rows_synced_into_an_extended_log_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(&dir.path().join("store")).unwrap();
    let mut index = store.snapshots().unwrap();
    for n in 0..20 {
        index.insert(&format!("k{n}"), &committed(n)).unwrap();
    }
    // The files as a crash leaves them: the database and its log with the frames not
    // checkpointed yet, then zeros; no shared-memory index.
    let copy = dir.path().join("copy");
    copy_tree(store.root(), &copy);
    let _ = std::fs::remove_file(copy.join("snapshots").join("metadata.db-shm"));
    drop(index);
    // The rows are in the log alone: the database file without it has none of them.
    let alone = dir.path().join("alone.db");
    std::fs::copy(copy.join("snapshots/metadata.db"), &alone).unwrap();
    // Even the table is made in the log: the file alone has none.
    let rows = rusqlite::Connection::open(&alone).unwrap().query_row(
        "SELECT count(*) FROM snapshots",
        [],
        |row| row.get::<_, i64>(0),
    );
    match rows {
        Err(e) => assert!(e.to_string().contains("no such table"), "{e}"),
        Ok(rows) => assert_eq!(rows, 0),
    }
    let reopened = Store::open(&copy).unwrap();
    let index = reopened.snapshots().unwrap();
    for n in 0..20 {
        assert_eq!(index.get(&format!("k{n}")).unwrap(), Some(committed(n)));
    }
}

fn copy_tree(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}
