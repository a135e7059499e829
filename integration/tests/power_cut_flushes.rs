//! Every image a power cut may leave, rebuilt from the writes and flushes the disk was
//! sent (`recording_disk`): the layer publish, containerd's Prepare, Commit and Remove and
//! the snapshot index run once on a filesystem over a recording disk, then each image —
//! at each flush, and with the writes after it kept in part and out of order — is
//! mounted, opened as `lamina daemon` opens it, and must hold each layer and snapshot
//! either whole or not at all, and whole for certain once the call that made it returned.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use lamina_integration::recorded_fs::RecordedFs;
use lamina_integration::rng::Xorshift;
use lamina_integration::tree::Tree;
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root, sample_image};
use lamina_snapshot_index::{SnapshotKind, StoreSnapshots};
use lamina_snapshotter::Snapshotter;

fn open_snapshotter(root: &Path) -> Snapshotter {
    lamina_integration::snapshotter::open_in_process(root).unwrap()
}

fn container_of(snapshotter: &Snapshotter, key: &str) -> String {
    let row = snapshotter.store().snapshots().unwrap().get(key).unwrap();
    row.unwrap().container.unwrap()
}

/// What a committed snapshot's layer must hold: its files and their contents.
struct Committed {
    key: &'static str,
    files: Vec<(&'static str, Vec<u8>)>,
    tree: Option<Tree>,
}

#[test]
fn every_image_a_power_cut_may_leave_holds_each_layer_and_snapshot_whole_or_not_at_all() {
    require_root();
    // XFS's smallest.
    for (kind, size_mb) in [(FsKind::Ext4, 96), (FsKind::Xfs, 300)] {
        cut_everywhere(kind, size_mb);
    }
}

fn cut_everywhere(kind: FsKind, size_mb: u64) {
    let scratch = ScratchFs::tmpfs();
    let images = scratch.path().join("images");
    fs::create_dir(&images).unwrap();
    let sample = sample_image(&images);
    let reference = sample.references()[0].clone();

    let fs = RecordedFs::new(kind, size_mb);
    let root = fs.path().join("store");
    lamina_store::Store::init(&root).unwrap();
    let lamina = Lamina::new(&root);
    let snapshotter = open_snapshotter(&root);
    fs.start();

    let pulled = lamina.run(&["pull", &reference]);
    assert_eq!(pulled.code, 0, "{pulled:?}");
    fs.mark("pull");
    let top = pulled.json()["top_chain_id"].as_str().unwrap().to_string();

    let mut committed = vec![
        Committed {
            key: "c",
            files: vec![
                ("file", b"committed data".to_vec()),
                ("big", vec![7; 300_000]),
            ],
            tree: None,
        },
        Committed {
            key: "d",
            files: vec![("dir/inner", b"on c".to_vec())],
            tree: None,
        },
    ];
    for (n, commit) in committed.iter().enumerate() {
        let (key, parent) = (format!("active-{}", commit.key), ["", "c"][n]);
        snapshotter.prepare(&key, parent, BTreeMap::new()).unwrap();
        fs.mark(&format!("prepare {key}"));
        let upper = root
            .join("images")
            .join(container_of(&snapshotter, &key))
            .join("upper");
        for (name, content) in &commit.files {
            let path = upper.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
        snapshotter
            .commit(commit.key, &key, BTreeMap::new())
            .unwrap();
        fs.mark(&format!("commit {}", commit.key));
    }
    snapshotter.prepare("gone", "d", BTreeMap::new()).unwrap();
    fs.mark("prepare gone");
    snapshotter.remove("gone").unwrap();
    fs.mark("remove gone");

    let layer_tree = Tree::of(&root.join("layers").join(&top), &[]);
    for commit in &mut committed {
        let layer = layer_of(&snapshotter, commit.key).unwrap();
        commit.tree = Some(Tree::of(&layer, &[]));
    }
    drop(snapshotter);
    let recording = fs.stop();

    let mut rng = Xorshift::new(0x5eed_cafe);
    let cuts = recording.cut_images(2, &mut rng);
    let flushes = recording.flush_indexes().len();
    eprintln!(
        "{kind:?}: {} events, {flushes} flushes, {} images",
        recording.log.len(),
        cuts.len()
    );
    assert!(
        flushes >= 5,
        "{kind:?}: the disk saw the flushes: {flushes}"
    );

    fs.check_each(&recording, &cuts, scratch.path(), |cut| {
        let must = |what: &str| cut.flushes >= recording.flushes_before(what);
        let at = format!("{kind:?}, {}", cut.label);
        check_cut(
            &at,
            &root,
            &top,
            &layer_tree,
            &committed,
            must("pull"),
            &must,
        );
    });
}

/// The layer the snapshot `key` names, if it has a row and one.
fn layer_of(snapshotter: &Snapshotter, key: &str) -> Option<std::path::PathBuf> {
    let row = snapshotter.store().snapshots().unwrap().get(key).unwrap()?;
    Some(snapshotter.store().layout().layer_diff(row.layer.as_ref()?))
}

fn check_cut(
    at: &str,
    root: &Path,
    top: &str,
    layer_tree: &Tree,
    committed: &[Committed],
    pulled: bool,
    must: &dyn Fn(&str) -> bool,
) {
    let layer = root.join("layers").join(top);
    if layer.exists() || pulled {
        let tree = Tree::of(&layer, &[]);
        assert!(
            tree == *layer_tree,
            "{at}: the pulled layer:\n{}",
            layer_tree.diff(&tree)
        );
    }
    let snapshotter = open_snapshotter(root);
    for commit in committed {
        let must_be = must(&format!("commit {}", commit.key));
        let row = snapshotter
            .store()
            .snapshots()
            .unwrap()
            .get(commit.key)
            .unwrap();
        let Some(row) = row else {
            assert!(
                !must_be,
                "{at}: snapshot {} lost after its Commit returned",
                commit.key
            );
            continue;
        };
        assert_eq!(row.kind, SnapshotKind::Committed, "{at}: {}", commit.key);
        let diff = layer_of(&snapshotter, commit.key).unwrap();
        let tree = Tree::of(&diff, &[]);
        let expected = commit.tree.as_ref().unwrap();
        assert!(
            tree == *expected,
            "{at}: {}'s layer:\n{}",
            commit.key,
            expected.diff(&tree)
        );
        for (name, content) in &commit.files {
            assert_eq!(
                &fs::read(diff.join(name)).unwrap(),
                content,
                "{at}: {} {name}",
                commit.key
            );
        }
    }
    // A Remove is not synced: a cut may bring its row back, and the start makes its
    // container again.
    let gone = snapshotter
        .store()
        .snapshots()
        .unwrap()
        .get("gone")
        .unwrap();
    if let Some(gone) = gone {
        assert_eq!(gone.kind, SnapshotKind::Active, "{at}");
        let container = root.join("images").join(gone.container.unwrap());
        assert!(
            container.join("upper").is_dir(),
            "{at}: the active's container"
        );
    }
    drop(snapshotter);
    let lamina = Lamina::new(root);
    let _ = lamina.run(&["reap"]);
    let check = lamina.run(&["check", "--verify"]);
    assert_eq!(check.code, 0, "{at}: {check:?}");
}
