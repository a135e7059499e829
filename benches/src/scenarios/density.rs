//! S4 read-only density: many read-only containers of one image. An overlay per
//! container costs a superblock and its own inode and dentry cache for every file
//! walked; `shared-ro` binds one shared read-only overlay, `direct` binds the layer (or a
//! flattened hardlink tree) with no overlay at all; `composefs` mounts an overlay per
//! container on the image's EROFS metadata image. Then as many read-write containers,
//! `classic` against `composefs` (issue 24). Reports create and delete latency and slab
//! growth after walking every rootfs once.

use std::path::Path;
use std::time::Instant;

use super::{Ctx, progress};
use crate::host;
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

/// Strategy name as `--strategy` takes it, and whether the containers are read-only.
const STRATEGIES: &[(&str, bool)] = &[
    ("classic", true),
    ("shared-ro", true),
    ("direct", true),
    ("composefs", true),
    ("classic", false),
    ("composefs", false),
];
const CACHES: &[&str] = &["ovl_inode", "dentry", "erofs_inode"];

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let containers = ctx.mode.pick(1000, 10);
    let mut table = Table::new(
        "s4-density",
        &[
            "fs",
            "strategy",
            "mode",
            "containers",
            "create p50",
            "create p99",
            "create max",
            "delete p50",
            "delete p99",
            "delete max",
            "create+delete all",
            "vs classic",
            "ovl_inode after walk",
            "dentry after walk",
            "erofs_inode after walk",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 1024);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        let mut baselines = [None, None];
        for &(strategy, read_only) in STRATEGIES {
            let mode = if read_only { "read-only" } else { "read-write" };
            progress(&format!(
                "S4 {} {strategy} {mode} × {containers}",
                rig.fs_name()
            ));
            host::drop_caches();
            let ovl_before = host::slab_bytes(&CACHES[..1]);
            let dentry_before = host::slab_bytes(&CACHES[1..2]);
            let erofs_before = host::slab_bytes(&CACHES[2..]);
            let ids: Vec<String> = (0..containers).map(|i| format!("s4-{i}")).collect();
            let mut creates = Samples::new();
            let mut deletes = Samples::new();
            let mut rootfs = Vec::new();
            let start = Instant::now();
            for id in &ids {
                let t = Instant::now();
                rootfs.push(rig.create(&image, id, strategy, read_only).rootfs);
                creates.push(t.elapsed());
            }
            let created = start.elapsed();
            for r in &rootfs {
                walk(r);
            }
            let ovl = host::slab_bytes(&CACHES[..1]).saturating_sub(ovl_before);
            let dentry = host::slab_bytes(&CACHES[1..2]).saturating_sub(dentry_before);
            let erofs = host::slab_bytes(&CACHES[2..]).saturating_sub(erofs_before);
            let start = Instant::now();
            for id in &ids {
                deletes.push(rig.timed_delete(id));
            }
            // Deferred deletes: the reaper's time counts.
            rig.reap_all();
            let total = created + start.elapsed();
            assert!(rig.no_trace(), "S4 left containers behind ({strategy})");
            let (c, d) = (creates.summary(), deletes.summary());
            let base = *baselines[usize::from(read_only)].get_or_insert(total);
            table.row(vec![
                rig.fs_name().into(),
                format!("`{strategy}`"),
                mode.into(),
                containers.to_string(),
                human(c.p50),
                human(c.p99),
                human(c.max),
                human(d.p50),
                human(d.p99),
                human(d.max),
                human(total),
                ratio(total, base),
                mib(ovl),
                mib(dentry),
                mib(erofs),
            ]);
        }
    }
    vec![table]
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Stats every entry of the tree once, as a container's first `ls -R` or process start
/// would, without following symlinks.
fn walk(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if std::fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            walk(&entry.path());
        }
    }
}
