//! S1 at publish: a containerd commit of a layer with file data beside a neighbour whose
//! freshly written data nobody has synced. Publishing used to `syncfs` the store's
//! filesystem, which wrote the neighbour's data too; on journaled ext4 and xfs it now
//! writes only the layer's own files and lets the journal commit that publishes the layer
//! flush them (docs/store.md, invariant 1). The baseline is the same commit after a
//! `syncfs` of the store (what the publish did before), alternated with it in one loop.

use lamina_snapshot_index::StoreSnapshots;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use lamina_snapshotter::Snapshotter;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

/// Files in each committed layer, and the bytes of each.
const LAYER_FILES: usize = 10;
const FILE_BYTES: usize = 20_000;

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let rounds = ctx.mode.pick(12, 2);
    let neighbour_mib = ctx.mode.pick(vec![0, 64], vec![0, 1]);
    let mut table = Table::new(
        "s1-publish",
        &[
            "fs",
            "neighbour's dirty data",
            "commits",
            "commit p50 (files written back)",
            "`syncfs` + commit p50 (as before)",
            "vs before",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 2048);
        let snapshotter = Snapshotter::open(
            rig.store.clone(),
            Arc::new(lamina_sys::RealMounter::new()),
            lamina_mount::Strategies::CLASSIC,
        )
        .expect("opening the snapshotter");
        snapshotter
            .prepare("neighbour", "", BTreeMap::new())
            .expect("preparing the neighbour");
        let neighbour = upper(&rig, &snapshotter, "neighbour");
        for &mib in &neighbour_mib {
            progress(&format!(
                "s1-publish {} beside {mib} MiB dirty",
                rig.fs_name()
            ));
            let mut now = Samples::new();
            let mut before = Samples::new();
            for round in 0..rounds {
                // A new file each round: rewriting one would make the filesystem start
                // its writeback at close (ext4's and xfs's truncate heuristics).
                if mib > 0 {
                    let dirty = neighbour.join(format!("dirty-{mib}-{round}"));
                    std::fs::write(&dirty, vec![1u8; mib << 20]).expect("neighbour's data");
                }
                let key = format!("layer-{mib}-{round}");
                snapshotter
                    .prepare(&key, "", BTreeMap::new())
                    .expect("preparing");
                let layer = upper(&rig, &snapshotter, &key);
                for i in 0..LAYER_FILES {
                    std::fs::write(layer.join(format!("f{i}")), vec![i as u8; FILE_BYTES])
                        .expect("layer file");
                }
                let as_before = round % 2 == 1;
                let t = Instant::now();
                if as_before {
                    sync_store(rig.store.root());
                }
                snapshotter
                    .commit(&format!("committed-{mib}-{round}"), &key, BTreeMap::new())
                    .expect("committing");
                let took = t.elapsed();
                if as_before {
                    before.push(took);
                } else {
                    now.push(took);
                }
                rustix::fs::sync();
            }
            let (now, before) = (now.summary(), before.summary());
            table.row(vec![
                rig.fs_name().into(),
                format!("{mib} MiB"),
                format!("{} + {}", now.n, before.n),
                human(now.p50),
                human(before.p50),
                ratio(now.p50, before.p50),
            ]);
        }
    }
    vec![table]
}

fn upper(rig: &Rig, snapshotter: &Snapshotter, key: &str) -> PathBuf {
    let row = snapshotter.store().snapshots().expect("snapshots").get(key);
    let container = row
        .expect("reading")
        .expect("a row")
        .container
        .expect("a container");
    rig.store.layout().container(&container).join("upper")
}

fn sync_store(root: &Path) {
    let dir = std::fs::File::open(root).expect("store root");
    lamina_sys::HostFs::syncfs(&lamina_sys::RealHost, &dir, root).expect("syncfs");
}
