//! Every image a power cut may leave, rebuilt from the writes and flushes the disk was
//! sent (`recording_disk`): the layer publish, a Garden create whose container fsyncs,
//! containerd's Prepare, Commit and Remove and the snapshot index run once on a
//! filesystem over a recording disk, then each image —
//! at each flush, and with the writes after it kept in part and out of order — is
//! mounted, opened by the snapshotter, and must hold each layer and snapshot either whole
//! or not at all, and each committed snapshot for certain once its Commit returned.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use lamina_integration::recorded_fs::RecordedFs;
use lamina_integration::recording_disk::Recording;
use lamina_integration::rng::Xorshift;
use lamina_integration::tree::Tree;
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root, sample_image};
use lamina_snapshot_index::{SnapshotKind, StoreSnapshots};
use lamina_snapshotter::Snapshotter;
use lamina_sys::{HostFs, RealHost};

/// The filesystems tried, each at its smallest convenient size (xfs refuses under 300 MB).
const FILESYSTEMS: [(FsKind, u64); 2] = [(FsKind::Ext4, 96), (FsKind::Xfs, 300)];

fn open_snapshotter(root: &Path) -> Snapshotter {
    lamina_integration::snapshotter::open_in_process(root).unwrap()
}

fn container_of(snapshotter: &Snapshotter, key: &str) -> String {
    let row = snapshotter.store().snapshots().unwrap().get(key).unwrap();
    row.unwrap().container.unwrap()
}

/// The layer the snapshot `key` names, if it has a row and one.
fn layer_of(snapshotter: &Snapshotter, key: &str) -> Option<PathBuf> {
    let row = snapshotter.store().snapshots().unwrap().get(key).unwrap()?;
    Some(snapshotter.store().layout().layer_diff(row.layer.as_ref()?))
}

/// A committed snapshot: the files written before its Commit, and its layer's tree
/// (contents included) as the run left it.
struct Committed {
    key: &'static str,
    files: Vec<(&'static str, Vec<u8>)>,
    tree: Option<Tree>,
}

/// What the run made, and which of it each image held: the test must have tried images
/// with and without each, or it proved nothing.
struct Expected {
    root: PathBuf,
    top: String,
    layer_tree: Tree,
    committed: Vec<Committed>,
    /// In a store whose layers keep their data in objects, the pulled layer whose files
    /// became stubs (the top one has none past the inline size).
    stubbed: Option<String>,
}

#[test]
fn every_image_a_power_cut_may_leave_holds_each_layer_and_snapshot_whole_or_not_at_all() {
    require_root();
    for (kind, size_mb) in FILESYSTEMS {
        cut_everywhere(kind, size_mb, &lamina_store::StoreProperties::default());
    }
}

/// The same in a store whose layers keep their data in objects: the pull's files move
/// into `objects/` behind stubs, and every image holds the layer with each stub's object
/// whole (`check --verify` hashes them), or no layer.
#[test]
fn every_image_a_power_cut_may_leave_holds_a_layer_of_stubs_with_its_objects_or_none() {
    require_root();
    let properties = lamina_store::StoreProperties {
        layer_data_in_objects: true,
        ..Default::default()
    };
    for (kind, size_mb) in FILESYSTEMS {
        cut_everywhere(kind, size_mb, &properties);
    }
}

fn cut_everywhere(kind: FsKind, size_mb: u64, properties: &lamina_store::StoreProperties) {
    let scratch = ScratchFs::tmpfs();
    let images = scratch.path().join("images");
    fs::create_dir(&images).unwrap();
    let sample = sample_image(&images);
    let reference = sample.references()[0].clone();

    let fs = RecordedFs::new(kind, size_mb);
    let root = fs.path().join("store");
    lamina_store::Store::init_with(&root, properties).unwrap();
    let lamina = Lamina::new(&root);
    let snapshotter = open_snapshotter(&root);
    fs.start();

    let pulled = lamina.run(&["pull", &reference]);
    assert_eq!(pulled.code, 0, "{pulled:?}");
    let top = pulled.json()["top_chain_id"].as_str().unwrap().to_string();
    let top = top.strip_prefix("sha256:").unwrap_or(&top).to_string();

    // A Garden container: its first record goes unsynced, and must be whole wherever
    // the container's own fsync is.
    let created = lamina.run(&["create", "--strategy", "classic", &reference, "garden"]);
    assert_eq!(created.code, 0, "{created:?}");
    let written = lamina.rootfs("garden").join("written");
    fs::write(&written, b"the container's data").unwrap();
    let file = fs::File::open(&written).unwrap();
    HostFs::fsync(&RealHost, &file, &written).unwrap();
    drop(file);
    fs.mark("container fsync");

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
    snapshotter.remove("gone").unwrap();

    let layer_tree = Tree::with_contents(&root.join("layers").join(&top));
    let stubbed = properties
        .layer_data_in_objects
        .then(|| stubbed_layer(&root));
    for commit in &mut committed {
        let layer = layer_of(&snapshotter, commit.key).unwrap();
        commit.tree = Some(Tree::with_contents(&layer));
    }
    drop(snapshotter);
    let recording = fs.stop();
    let expected = Expected {
        root,
        top,
        layer_tree,
        committed,
        stubbed,
    };

    let mut rng = Xorshift::new(0x5eed_cafe);
    let cuts = recording.cut_images(2, &mut rng);
    let flushes = recording.flush_indexes().len();
    eprintln!(
        "{kind:?}: {} events, {flushes} flushes, {} images",
        recording.log.len(),
        cuts.len()
    );
    assert!(
        cuts.iter().any(|c| !c.unflushed.is_empty()),
        "{kind:?}: no image kept a write the disk was not told to flush"
    );

    let mut seen: BTreeMap<String, [bool; 2]> = BTreeMap::new();
    fs.check_each(&recording, &cuts, scratch.path(), |cut| {
        let at = format!("{kind:?}, {}", cut.label);
        let must = |what: &str| cut.flushes >= recording.flushes_before(what);
        for (what, held) in check_cut(&at, &expected, &must) {
            seen.entry(what).or_default()[usize::from(held)] = true;
        }
    });
    for (what, [absent, present]) in &seen {
        assert!(
            *absent && *present,
            "{kind:?}: {what} was {} in every image tried",
            if *present { "present" } else { "absent" }
        );
    }
    let stubbed = usize::from(expected.stubbed.is_some());
    assert_eq!(
        seen.len(),
        2 + stubbed + expected.committed.len(),
        "{seen:?}"
    );
}

/// The chain (hex) of the one pulled layer whose files became stubs, checked to have
/// moved data into `objects/`: without it the variant would test nothing new.
fn stubbed_layer(root: &Path) -> String {
    let stubbed: Vec<String> = fs::read_dir(root.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|layer| {
            let record: serde_json::Value =
                serde_json::from_slice(&fs::read(layer.join("layer.json")).unwrap()).unwrap();
            record["objects"] == true
        })
        .map(|layer| layer.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stubbed.len(), 1, "layers of stubs: {stubbed:?}");
    let objects = fs::read_dir(root.join("objects")).unwrap().count();
    assert!(objects > 0, "no object made");
    stubbed[0].clone()
}

/// Checks the store in the image mounted at `expected.root`; returns, for the pulled
/// layer and each committed snapshot, whether the image held it.
fn check_cut(at: &str, expected: &Expected, must: &dyn Fn(&str) -> bool) -> Vec<(String, bool)> {
    let root = &expected.root;
    let mut held = Vec::new();
    let layer = root.join("layers").join(&expected.top);
    // A pull's layer may be lost to a cut right after it returns (its publish does not
    // flush: the next journal commit carries it), but never half.
    let has_layer = layer.try_exists().unwrap();
    if has_layer {
        let tree = Tree::with_contents(&layer);
        assert!(
            tree == expected.layer_tree,
            "{at}: the pulled layer:\n{}",
            expected.layer_tree.diff(&tree)
        );
    }
    held.push(("the pulled layer".to_string(), has_layer));
    // Its stubs' objects are hashed against the layer's list by `check --verify` below.
    let has_stubs = expected
        .stubbed
        .as_ref()
        .is_some_and(|chain| root.join("layers").join(chain).try_exists().unwrap());
    if let Some(chain) = &expected.stubbed {
        held.push((format!("the layer of stubs {chain}"), has_stubs));
    }

    let store = lamina_store::Store::open(root).unwrap();
    match store.record("garden") {
        Ok(record) => assert_eq!(record.id, "garden", "{at}"),
        Err(lamina_store::StoreError::NotFound(_)) => {}
        Err(e) => panic!("{at}: the container's record: {e}"),
    }
    let written = root.join("images/garden/upper/written");
    if must("container fsync") {
        assert!(
            store.record("garden").is_ok(),
            "{at}: the record lost under fsynced data"
        );
        assert_eq!(fs::read(&written).unwrap(), b"the container's data", "{at}");
    }
    held.push((
        "the container's record".to_string(),
        store.record("garden").is_ok(),
    ));
    drop(store);

    let snapshotter = open_snapshotter(root);
    for commit in &expected.committed {
        let row = snapshotter
            .store()
            .snapshots()
            .unwrap()
            .get(commit.key)
            .unwrap();
        held.push((format!("snapshot {}", commit.key), row.is_some()));
        let Some(row) = row else {
            assert!(
                !must(&format!("commit {}", commit.key)),
                "{at}: snapshot {} lost after its Commit returned",
                commit.key
            );
            continue;
        };
        assert_eq!(row.kind, SnapshotKind::Committed, "{at}: {}", commit.key);
        let diff = layer_of(&snapshotter, commit.key).unwrap();
        let tree = Tree::with_contents(&diff);
        let want = commit.tree.as_ref().unwrap();
        assert!(
            tree == *want,
            "{at}: {}'s layer:\n{}",
            commit.key,
            want.diff(&tree)
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
    let check = lamina.run(&["check", "--verify"]);
    // The one thing a reboot leaves to find: the Garden container is not mounted.
    let report: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
    let problems: Vec<String> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .filter(|kind| kind != "rootfs_not_mounted")
        .collect();
    assert!(problems.is_empty(), "{at}: {check:?}");
    let verified = report["verified_layers"]["layers"].as_u64().unwrap();
    assert!(
        !has_layer || verified >= 1,
        "{at}: the layer was not verified: {check:?}"
    );
    assert!(
        !has_stubs || verified >= 1,
        "{at}: the layer of stubs was not verified: {check:?}"
    );
    let reap = lamina.run(&["reap"]);
    assert_eq!(reap.code, 0, "{at}: {reap:?}");
    held
}

/// The harness itself: a file written without a sync and renamed into place, its
/// directory then synced, is found empty or zeroed in some image after that sync — the
/// bug a publish without write-back would be. Written with an fsync before the rename,
/// it is whole in every image after the directory's sync.
#[test]
fn the_harness_finds_a_file_published_without_its_data_synced() {
    require_root();
    for (kind, size_mb) in FILESYSTEMS {
        let scratch = ScratchFs::tmpfs();
        let fs = RecordedFs::new(kind, size_mb);
        let content = vec![0x5a; 256 * 1024];
        fs.start();
        for (name, sync_data) in [("unsynced", false), ("synced", true)] {
            let tmp = fs.path().join(format!("{name}.tmp"));
            let file = fs::File::create(&tmp).unwrap();
            std::io::Write::write_all(&mut &file, &content).unwrap();
            if sync_data {
                HostFs::fsync(&RealHost, &file, &tmp).unwrap();
            }
            drop(file);
            fs::rename(&tmp, fs.path().join(name)).unwrap();
            let dir = fs::File::open(fs.path()).unwrap();
            HostFs::fsync(&RealHost, &dir, fs.path()).unwrap();
            fs.mark(name);
        }
        let recording: Recording = fs.stop();
        let cuts = recording.cut_images(2, &mut Xorshift::new(7));
        let mut torn = 0;
        fs.check_each(&recording, &cuts, scratch.path(), |cut| {
            let whole = |name: &str| fs::read(fs.path().join(name)).is_ok_and(|b| b == content);
            if cut.flushes >= recording.flushes_before("unsynced") && !whole("unsynced") {
                torn += 1;
            }
            if cut.flushes >= recording.flushes_before("synced") {
                assert!(whole("synced"), "{kind:?}, {}: the synced file", cut.label);
            }
        });
        assert!(torn > 0, "{kind:?}: no image showed the unsynced file torn");
    }
}

/// A symlink's target is journaled with its creation on ext4 and xfs: in every image
/// after a later commit it is whole, and in none is it torn (what lets a small record be
/// made durable without a write to the device).
#[test]
fn a_symlink_is_whole_or_absent_in_every_image() {
    require_root();
    for (kind, size_mb) in FILESYSTEMS {
        let scratch = ScratchFs::tmpfs();
        let fs = RecordedFs::new(kind, size_mb);
        let target: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        fs.start();
        std::os::unix::fs::symlink(&target, fs.path().join("record")).unwrap();
        let other = fs.path().join("other");
        fs::write(&other, b"later").unwrap();
        let file = fs::File::open(&other).unwrap();
        HostFs::fsync(&RealHost, &file, &other).unwrap();
        drop(file);
        fs.mark("later");
        let recording = fs.stop();
        let cuts = recording.cut_images(4, &mut Xorshift::new(11));
        let mut seen = [false; 2];
        fs.check_each(&recording, &cuts, scratch.path(), |cut| {
            let link = fs.path().join("record");
            let read = fs::read_link(&link);
            if let Ok(read) = &read {
                assert_eq!(read.to_str().unwrap(), target, "{kind:?}, {}", cut.label);
            }
            seen[usize::from(read.is_ok())] = true;
            if cut.flushes >= recording.flushes_before("later") {
                assert!(
                    read.is_ok(),
                    "{kind:?}, {}: lost after a later fsync",
                    cut.label
                );
            }
        });
        assert_eq!(seen, [true, true], "{kind:?}");
    }
}
