//! A layer with file data is published without a `syncfs` of the store's filesystem on
//! journaled ext4 and xfs (`lamina-store/src/import.rs`, `publish_staged`): its own files
//! are written to the device and waited for, and the journal commit that makes its rename
//! durable flushes them with it. Proven here through a containerd commit and a power cut
//! (`xfs_io -x -c shutdown`): the layer's files come back whole, and a neighbour's dirty
//! data, which a `syncfs` would have written, does not. In a file of its own: a `sync` by
//! another test in the same binary would write the neighbour's data too.

#![allow(clippy::unwrap_used)]

use lamina_snapshot_index::StoreSnapshots;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use lamina_integration::{FsKind, ScratchFs, require_root};
use lamina_snapshotter::Snapshotter;

const NEIGHBOUR_BYTES: usize = 8 << 20;

#[test]
fn a_committed_layers_files_survive_a_power_cut_and_its_neighbours_are_not_written() {
    require_root();
    for kind in [FsKind::Xfs, FsKind::Ext4] {
        let fs = ScratchFs::loop_backed(kind, 512, false);
        let root = fs.path().join("store");
        lamina_store::Store::init(&root).unwrap();
        let snapshotter = open_snapshotter(&root);
        snapshotter.prepare("active", "", BTreeMap::new()).unwrap();
        snapshotter
            .prepare("neighbour", "", BTreeMap::new())
            .unwrap();
        let upper = |key: &str| {
            let row = snapshotter.store().snapshots().unwrap().get(key).unwrap();
            root.join("images")
                .join(row.unwrap().container.unwrap())
                .join("upper")
        };
        // Everything so far is durable: what the cut keeps of the rest is the commit's.
        rustix::fs::sync();
        let files: Vec<(String, Vec<u8>)> = (0..40u32)
            .map(|i| {
                (
                    format!("file-{i}"),
                    content(i, 1 + (i as usize * 27_001) % (1 << 20)),
                )
            })
            .collect();
        let dir = upper("active").join("dir");
        fs::create_dir(&dir).unwrap();
        for (name, bytes) in &files {
            fs::write(dir.join(name), bytes).unwrap();
        }
        let neighbour = upper("neighbour").join("dirty");
        fs::write(&neighbour, vec![7u8; NEIGHBOUR_BYTES]).unwrap();

        snapshotter
            .commit("layer", "active", BTreeMap::new())
            .unwrap();
        let layer = snapshotter
            .store()
            .snapshots()
            .unwrap()
            .get("layer")
            .unwrap();
        let diff = root
            .join("layers")
            .join(layer.unwrap().layer.unwrap().hex())
            .join("diff");
        fs.cut_power();
        drop(snapshotter);
        fs.remount_after_cut();

        for (name, bytes) in &files {
            let kept = fs::read(diff.join("dir").join(name))
                .unwrap_or_else(|e| panic!("{kind:?}: {name} lost with the cut: {e}"));
            assert!(kept == *bytes, "{kind:?}: {name} came back changed");
        }
        let neighbour_kept = fs::read(&neighbour).map_or(0, |b| b.len());
        assert!(
            neighbour_kept < NEIGHBOUR_BYTES,
            "{kind:?}: the neighbour's dirty data survived the cut whole: the commit wrote it (a syncfs)"
        );
        // The store opens clean after the cut.
        open_snapshotter(&root);
    }
}

fn open_snapshotter(root: &Path) -> Snapshotter {
    lamina_integration::snapshotter::open_in_process(root).unwrap()
}

/// `len` bytes that differ from file to file and along each file.
fn content(file: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (file as usize * 31 + j * 7 + j / 4096) as u8)
        .collect()
}
