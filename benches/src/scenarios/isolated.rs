//! isolated's price: what a create costs with a container's own upper filesystem made
//! on the spot (mkfs, loop attach, mount), claimed ready from a pool, or on tmpfs — all
//! against classic in the same run — and what each live isolated container costs the
//! host (unreclaimable kernel memory, slab, loop devices, kernel threads, disk) at 100
//! and 1000 containers.
//! Its gains are in the S1 and S3 tables.
//!
//! The same create and cost rows on a btrfs store with quotas, where `isolated-quota`
//! gives each container a subvolume with a qgroup limit instead of a filesystem of its
//! own: no mkfs, no loop device, no mount.

use std::time::Duration;

use lamina_image::Image;
use lamina_mount::pool::{self, PoolKind};
use lamina_mount::{CreateOptions, DiskLimit, UpperBackend, UpperPlan};
use lamina_sys::DiskFs;

use super::{Ctx, progress};
use crate::host;
use crate::report::Table;
use crate::rig::{Rig, options};
use crate::stats::{Samples, human, ratio};

/// How a create row gets its rootfs.
#[derive(Debug, Clone, Copy)]
enum Source {
    Fresh(&'static str),
    /// An isolated create claiming one of the bare upper filesystems in the pool.
    UpperPool,
    /// A `pooled,isolated` create claiming a slot with upper and overlay mounted.
    OverlayPool,
}

impl Source {
    fn label(self) -> String {
        match self {
            Source::Fresh(s) => format!("`{s}`"),
            Source::UpperPool => "`isolated`, upper claimed from the pool".into(),
            Source::OverlayPool => "`pooled,isolated`, overlay claimed from the pool".into(),
        }
    }

    fn strategies(self) -> &'static str {
        match self {
            Source::Fresh(s) => s,
            Source::UpperPool => "isolated",
            Source::OverlayPool => "pooled,isolated",
        }
    }
}

const CREATES: &[Source] = &[
    Source::Fresh("classic"),
    Source::Fresh("isolated"),
    Source::UpperPool,
    Source::OverlayPool,
    Source::Fresh("isolated-memory"),
];

/// Strategies whose per-container cost is measured, and the disk limit each container
/// gets (an isolated upper is that big; classic ignores it).
const COST: &[&str] = &["classic", "isolated", "isolated-memory"];
const COST_LIMIT: u64 = 256 << 20;

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let samples = ctx.mode.pick(50, 3);
    let live_counts = ctx.mode.pick(vec![100, 1000], vec![3, 6]);
    let mut creates = Table::new(
        "isolated-create",
        &[
            "fs",
            "rootfs from",
            "create p50",
            "create p99",
            "p50 vs classic",
        ],
    );
    let mut cost = Table::new(
        "isolated-cost",
        &[
            "fs",
            "strategy",
            "live containers",
            "kernel memory / container",
            "slab / container",
            "loop devices",
            "kernel threads / container",
            "store disk / container",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 4096);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        let mut classic = None;
        for &source in CREATES {
            progress(&format!(
                "isolated {} create: {}",
                rig.fs_name(),
                source.label()
            ));
            let s = timed_creates(&rig, &image, source, samples).summary();
            let base = *classic.get_or_insert(s.p50);
            creates.row(vec![
                rig.fs_name().into(),
                source.label(),
                human(s.p50),
                human(s.p99),
                ratio(s.p50, base),
            ]);
        }
        for strategy in COST {
            for &count in &live_counts {
                progress(&format!(
                    "isolated {} cost: {count} × {strategy}",
                    rig.fs_name()
                ));
                let per = per_container_cost(&rig, &image, strategy, count);
                cost.row(per.row(rig.fs_name(), strategy, count));
            }
        }
    }
    quota_rows(samples, &live_counts, &mut creates, &mut cost);
    vec![creates, cost]
}

/// Strategies compared on btrfs: the loop-backed upper against the qgroup-limited
/// subvolume, with classic as the baseline.
const QUOTA_ROWS: &[&str] = &["classic", "isolated", "isolated-quota"];

/// Creates (each with a disk limit, deleted and reaped untimed) and per-container cost on
/// a btrfs store with quotas enabled.
fn quota_rows(samples: usize, live_counts: &[usize], creates: &mut Table, cost: &mut Table) {
    let rig = Rig::btrfs_with_quotas(4096);
    let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
    let mut classic = None;
    for &strategy in QUOTA_ROWS {
        progress(&format!("isolated btrfs create: {strategy}"));
        let options = limited(strategy);
        let s: Samples = (0..samples)
            .map(|i| {
                let id = format!("timed-{i}");
                let t = std::time::Instant::now();
                rig.create_with(&image, &id, &options);
                let t = t.elapsed();
                rig.delete(&id);
                t
            })
            .collect();
        rig.reap_all();
        let s = s.summary();
        let base = *classic.get_or_insert(s.p50);
        creates.row(vec![
            "btrfs (quotas on)".into(),
            format!("`{strategy}`"),
            human(s.p50),
            human(s.p99),
            ratio(s.p50, base),
        ]);
        for &count in live_counts {
            progress(&format!("isolated btrfs cost: {count} × {strategy}"));
            let per = per_container_cost(&rig, &image, strategy, count);
            cost.row(per.row("btrfs (quotas on)", strategy, count));
        }
    }
}

/// Options for `strategy` with the cost rows' disk limit (classic refuses a limit).
fn limited(strategy: &str) -> CreateOptions {
    if strategy == "classic" {
        return options(strategy, false);
    }
    CreateOptions {
        disk_limit: Some(DiskLimit {
            bytes: COST_LIMIT,
            exclude_image: true,
        }),
        ..options(strategy, false)
    }
}

/// `n` timed creates from `source`, each deleted (untimed) before the next. Pools are
/// filled (untimed) with one entry per create first.
fn timed_creates(rig: &Rig, image: &Image, source: Source, n: usize) -> Samples {
    let plan = UpperPlan::new(UpperBackend::Disk, None, DiskFs::Ext4);
    let kind = match source {
        Source::Fresh(_) => None,
        Source::UpperPool => Some(PoolKind::uppers(plan)),
        Source::OverlayPool => {
            let flavour = lamina_mount::Flavour::of(options("isolated", false).strategies);
            Some(PoolKind::overlays(&image.chain_ids(), flavour, Some(plan)))
        }
    };
    if let Some(kind) = &kind {
        pool::fill(&rig.store, &rig.mounter, kind, Some(n)).expect("filling the pool");
    }
    let samples = (0..n)
        .map(|i| {
            let id = format!("timed-{i}");
            let t = rig.timed_create(image, &id, source.strategies(), false);
            rig.delete(&id);
            t
        })
        .collect();
    rig.reap_all();
    pool::drain(&rig.store, &rig.mounter).expect("draining the pool");
    samples
}

struct Cost {
    memory: f64,
    slab: f64,
    loops: usize,
    threads: f64,
    disk: f64,
}

impl Cost {
    /// The cost table's row for `count` live `strategy` containers on `fs`.
    fn row(&self, fs: &str, strategy: &str, count: usize) -> Vec<String> {
        vec![
            fs.into(),
            format!("`{strategy}`"),
            count.to_string(),
            bytes(self.memory),
            bytes(self.slab),
            self.loops.to_string(),
            format!("{:.2}", self.threads),
            bytes(self.disk),
        ]
    }
}

/// Creates `n` containers with a disk limit, measures the host before and after (page
/// caches dropped both times), and deletes them.
fn per_container_cost(rig: &Rig, image: &Image, strategy: &str, n: usize) -> Cost {
    let options = limited(strategy);
    let before = Snapshot::take(rig);
    for i in 0..n {
        rig.create_with(image, &format!("cost-{i}"), &options);
    }
    let after = Snapshot::take(rig);
    rig.delete_all();
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
    Cost {
        memory: per(after.kernel_memory, before.kernel_memory),
        slab: per(after.slab, before.slab),
        loops: after.loops.saturating_sub(before.loops),
        threads: per(after.threads, before.threads),
        disk: per(after.disk_used, before.disk_used),
    }
}

struct Snapshot {
    kernel_memory: u64,
    slab: u64,
    loops: usize,
    threads: u64,
    disk_used: u64,
}

impl Snapshot {
    fn take(rig: &Rig) -> Self {
        rustix::fs::sync();
        host::drop_caches();
        std::thread::sleep(Duration::from_millis(200));
        let stat = rustix::fs::statvfs(rig.fs.path()).expect("statvfs");
        Snapshot {
            kernel_memory: host::kernel_unreclaimable(),
            slab: host::slab_total(),
            loops: lamina_sys::loop_backing_files().len(),
            threads: kernel_threads(),
            disk_used: (stat.f_blocks - stat.f_bfree) * stat.f_frsize,
        }
    }
}

/// Kernel threads (children of kthreadd, pid 2) alive now.
fn kernel_threads() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
                // Field 4 (ppid) follows the `(comm)` field, which may contain spaces.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(|p| p == "2"))
                    .unwrap_or(false)
            })
        })
        .count() as u64
}

fn bytes(b: f64) -> String {
    let abs = b.abs();
    if abs >= (1 << 20) as f64 {
        format!("{:.2} MiB", b / (1 << 20) as f64)
    } else if abs >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}
