//! S1 teardown storm: containers that just wrote data are deleted all at once (and one
//! after another). On the classic path each unmount syncs the whole upper filesystem
//! under its superblock lock, so deletes queue behind each other's writeback. Reports
//! what the caller of `delete` waits (p50/p99) and how long until nothing is left,
//! reaper included. The noisy-neighbour table deletes one container that wrote nothing
//! while nine neighbours on the same upper filesystem are dirty: on a shared upper its
//! unmount writes their data back; on an isolated upper it syncs only its own.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use lamina_image::Image;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Rounds, Samples};

const STRATEGIES: &[&str] = &[
    "classic",
    "volatile",
    "deferred",
    "volatile,deferred",
    "isolated",
    "isolated-memory",
];

/// What the kernel alone takes for each kind of teardown, measured in the same run as
/// the strategies above it: the floor a strategy's time until no trace stands on.
type Floor = fn(&Rig, Load, usize, usize) -> Duration;
const FLOORS: [(&str, Floor); 5] = [
    (
        "files unlinked alone, one container after another",
        |rig, load, n, round| unlink_floor(rig, load, n, round, false),
    ),
    (
        "files unlinked alone, all at once",
        |rig, load, n, round| unlink_floor(rig, load, n, round, true),
    ),
    (
        "files unlinked through overlays alone, one after another",
        |rig, load, n, round| overlay_unlink_floor(rig, load, n, round, false),
    ),
    (
        "files unlinked through overlays alone, all at once",
        |rig, load, n, round| overlay_unlink_floor(rig, load, n, round, true),
    ),
    ("own filesystems alone, all at once", own_fs_floor),
];

/// The neighbour table: a shared upper's options, against the container's own upper.
const NEIGHBOUR_STRATEGIES: &[&str] = &[
    "classic",
    "volatile",
    "deferred",
    "isolated",
    "isolated-memory",
];

#[derive(Debug, Clone, Copy)]
enum Load {
    /// One file of this many MiB.
    OneFile(usize),
    /// This many 4 KiB files.
    SmallFiles(usize),
}

impl Load {
    fn name(self) -> String {
        match self {
            Load::OneFile(mb) => format!("1 × {mb} MB file"),
            Load::SmallFiles(n) => format!("{n} × 4 KiB files"),
        }
    }

    fn write(self, rootfs: &Path) {
        match self {
            Load::OneFile(mb) => {
                let mut f = fs::File::create(rootfs.join("data.bin")).unwrap();
                let chunk = vec![0x5a; 1 << 20];
                for _ in 0..mb {
                    f.write_all(&chunk).unwrap();
                }
            }
            Load::SmallFiles(n) => {
                let dir = rootfs.join("small");
                fs::create_dir(&dir).unwrap();
                let data = vec![0x5a; 4096];
                for i in 0..n {
                    fs::write(dir.join(format!("f{i}")), &data).unwrap();
                }
            }
        }
    }

    /// The files [`Load::write`] writes under `rootfs`.
    fn files(self, rootfs: &Path) -> Vec<std::path::PathBuf> {
        match self {
            Load::OneFile(_) => vec![rootfs.join("data.bin")],
            Load::SmallFiles(n) => {
                let dir = rootfs.join("small");
                (0..n).map(|i| dir.join(format!("f{i}"))).collect()
            }
        }
    }
}

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let containers = ctx.mode.pick(10, 2);
    let mb = ctx.mode.pick(100, 2);
    let small = ctx.mode.pick(1000, 20);
    let rounds = ctx.mode.pick(3, 1);
    let mut table = Table::new(
        "s1-teardown",
        &[
            "fs",
            "load per container",
            "deletes",
            "strategy",
            "delete p50",
            "delete p99",
            "p50 vs classic",
            "until no trace",
            "vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, (containers * mb * 2 + 1024) as u64);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        for load in [Load::OneFile(mb), Load::SmallFiles(small)] {
            for parallel in [true, false] {
                let group = [
                    rig.fs_name().to_string(),
                    load.name(),
                    format!(
                        "{containers} {}",
                        if parallel { "in parallel" } else { "serially" }
                    ),
                ];
                let mut baseline = None;
                for strategy in STRATEGIES {
                    progress(&format!(
                        "S1 {} {} {} {strategy}",
                        rig.fs_name(),
                        load.name(),
                        if parallel { "parallel" } else { "serial" }
                    ));
                    let mut storms = Rounds::default();
                    for round in 0..rounds {
                        storms.add(storm(
                            &rig, &image, strategy, load, containers, parallel, round,
                        ));
                    }
                    let result = storms.result();
                    let base = *baseline.get_or_insert(result);
                    let mut row = group.to_vec();
                    row.push(format!("`{strategy}`"));
                    row.extend(result.cells(&base));
                    table.row(row);
                }
                let base = baseline.expect("classic ran");
                for (floor, work) in FLOORS {
                    progress(&format!("S1 {} {} {floor}", rig.fs_name(), load.name()));
                    let wall = (0..rounds)
                        .map(|round| work(&rig, load, containers, round))
                        .collect::<Samples>()
                        .summary()
                        .p50;
                    let mut row = group.to_vec();
                    row.extend([floor.to_string(), "–".into(), "–".into(), "–".into()]);
                    row.extend([
                        crate::stats::human(wall),
                        crate::stats::ratio(wall, base.wall),
                    ]);
                    table.row(row);
                }
            }
        }
    }
    let neighbours = neighbour_table(ctx);
    vec![table, neighbours]
}

fn neighbour_table(ctx: &Ctx) -> Table {
    let neighbours = ctx.mode.pick(9, 2);
    let mb = ctx.mode.pick(100, 2);
    let rounds = ctx.mode.pick(5, 1);
    let mut table = Table::new(
        "s1-neighbour",
        &[
            "fs",
            "dirty neighbours",
            "strategy",
            "clean container gone p50",
            "p99",
            "p50 vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, (neighbours * mb * 2 + 1024) as u64);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        let mut baseline = None;
        for strategy in NEIGHBOUR_STRATEGIES {
            progress(&format!(
                "S1 neighbour {} {neighbours} × {mb} MB {strategy}",
                rig.fs_name()
            ));
            let gone: Samples = (0..rounds)
                .map(|round| clean_among_dirty(&rig, &image, strategy, neighbours, mb, round))
                .collect();
            let s = gone.summary();
            let base = *baseline.get_or_insert(s.p50);
            table.row(vec![
                rig.fs_name().into(),
                format!("{neighbours} × {mb} MB written"),
                format!("`{strategy}`"),
                crate::stats::human(s.p50),
                crate::stats::human(s.p99),
                crate::stats::ratio(s.p50, base),
            ]);
        }
    }
    table
}

/// One round: `n` neighbours (same strategy, same store) write `mb` each and stay; a
/// container that wrote nothing is deleted. Returns the time until it is gone — its
/// delete plus, for a deferred strategy, the reaper's teardown of it.
fn clean_among_dirty(
    rig: &Rig,
    image: &Image,
    strategy: &str,
    n: usize,
    mb: usize,
    round: usize,
) -> Duration {
    rustix::fs::sync();
    for i in 0..n {
        let created = rig.create(image, &format!("n-{round}-{i}"), strategy, false);
        Load::OneFile(mb).write(&created.rootfs);
    }
    let clean = format!("clean-{round}");
    rig.create(image, &clean, strategy, false);
    let start = Instant::now();
    rig.delete(&clean);
    rig.reap_all();
    let gone = start.elapsed();
    rig.delete_all();
    gone
}

/// The kernel's floor under `isolated`: `n` filesystems made as an isolated upper is
/// (sparse image, loop device with direct I/O, lamina's default upper filesystem), each
/// holding `load` written straight into it, then shut down without a log flush,
/// unmounted and removed — no overlay, no record, nothing of lamina's. All `n` go at
/// once, the kernel's best, whether the deletes above it came at once or one after
/// another. Returns the time until all are gone.
fn own_fs_floor(rig: &Rig, load: Load, n: usize, round: usize) -> Duration {
    use lamina_sys::{DiskFs, Mounter, UpperFs};
    rustix::fs::sync();
    let dir = rig.scratch(&format!("floor-{round}"));
    let own: Vec<(std::path::PathBuf, std::path::PathBuf)> = (0..n)
        .map(|i| {
            let (image, target) = (dir.join(format!("{i}.img")), dir.join(format!("{i}")));
            fs::create_dir(&target).unwrap();
            let spec = UpperFs::Disk {
                image: image.clone(),
                size_bytes: lamina_mount::isolated::DEFAULT_DISK_BYTES,
                fs: DiskFs::default(),
                format: true,
            };
            rig.mounter.mount_upper_fs(&spec, &target).unwrap();
            load.write(&target);
            (image, target)
        })
        .collect();
    let tear_down = |(image, target): &(std::path::PathBuf, std::path::PathBuf)| {
        assert!(
            lamina_sys::shut_down_own_fs(target, image),
            "shutting {} down",
            target.display()
        );
        rig.mounter.unmount(target).unwrap();
        fs::remove_file(image).unwrap();
    };
    let start = Instant::now();
    each(&own, true, tear_down);
    let wall = start.elapsed();
    fs::remove_dir_all(&dir).unwrap();
    wall
}

/// The kernel's floor under `deferred`: `load` written, `n` times, into directories on
/// the store's filesystem and left dirty, as a container's upper holds it, then every
/// file unlinked (a thread per directory, or one directory after another) — no overlay,
/// no unmount, nothing of lamina's. Leaving no trace means at least this. Returns the
/// time until all are gone.
fn unlink_floor(rig: &Rig, load: Load, n: usize, round: usize, at_once: bool) -> Duration {
    rustix::fs::sync();
    let dir = rig.scratch(&format!("unlink-floor-{round}"));
    let dirs: Vec<std::path::PathBuf> = (0..n)
        .map(|i| {
            let one = dir.join(i.to_string());
            fs::create_dir(&one).unwrap();
            load.write(&one);
            one
        })
        .collect();
    let start = Instant::now();
    each(&dirs, at_once, |one| fs::remove_dir_all(one).unwrap());
    let wall = start.elapsed();
    fs::remove_dir_all(&dir).unwrap();
    wall
}

/// The kernel's floor under `deferred` itself: `load` written through `n` plain overlays
/// (an empty lower; upper and work directories on the store's filesystem, as a
/// container's) and left dirty; then each file unlinked through its overlay by the name
/// it was written under, with no directory read (a thread per overlay, or one overlay
/// after another), and only then every overlay unmounted (a sync of the store's
/// filesystem each) before any directory is removed — nothing of lamina's. A delete whose
/// container's upper is on the shared filesystem, and that leaves nothing written back,
/// does at least this.
fn overlay_unlink_floor(rig: &Rig, load: Load, n: usize, round: usize, at_once: bool) -> Duration {
    rustix::fs::sync();
    let dir = rig.scratch(&format!("overlay-floor-{round}"));
    let lower = dir.join("lower");
    fs::create_dir_all(&lower).unwrap();
    let mut overlays: Vec<Overlay> = (0..n)
        .map(|i| Overlay::mount(rig, &dir.join(i.to_string()), &lower))
        .collect();
    for overlay in &overlays {
        load.write(&overlay.merged);
    }
    let start = Instant::now();
    each(&overlays, at_once, |overlay| {
        for file in load.files(&overlay.merged) {
            fs::remove_file(file).unwrap();
        }
    });
    for overlay in &mut overlays {
        overlay.unmount();
    }
    for overlay in &overlays {
        fs::remove_dir_all(&overlay.dir).unwrap();
    }
    let wall = start.elapsed();
    fs::remove_dir_all(&dir).unwrap();
    wall
}

/// Runs `work` on every item: a thread each (`at_once`), or one after another.
fn each<T: Sync>(items: &[T], at_once: bool, work: impl Fn(&T) + Sync) {
    if at_once {
        std::thread::scope(|s| {
            for item in items {
                s.spawn(|| work(item));
            }
        });
    } else {
        items.iter().for_each(work);
    }
}

/// A plain read-write overlay in `dir` (`upper`, `work`, `merged`), mounted with the
/// rig's mounter, unmounted on drop if a panic comes first.
struct Overlay<'a> {
    rig: &'a Rig,
    dir: std::path::PathBuf,
    merged: std::path::PathBuf,
    mounted: bool,
}

impl<'a> Overlay<'a> {
    fn mount(rig: &'a Rig, dir: &Path, lower: &Path) -> Overlay<'a> {
        use lamina_sys::{Mounter, OverlaySpec};
        let [upper, work, merged] = ["upper", "work", "merged"].map(|d| dir.join(d));
        for d in [&upper, &work, &merged] {
            fs::create_dir_all(d).unwrap();
        }
        let spec = OverlaySpec {
            lowers: vec![lower.to_path_buf()],
            upper: Some(upper),
            work: Some(work),
            ..OverlaySpec::default()
        };
        rig.mounter.mount_overlay(&spec, &merged).unwrap();
        Overlay {
            rig,
            dir: dir.to_path_buf(),
            merged,
            mounted: true,
        }
    }

    /// Unmounts it: the sync of the upper filesystem a container's unmount makes.
    fn unmount(&mut self) {
        use lamina_sys::Mounter;
        self.rig.mounter.unmount(&self.merged).unwrap();
        self.mounted = false;
    }
}

impl Drop for Overlay<'_> {
    fn drop(&mut self) {
        if self.mounted {
            use lamina_sys::Mounter;
            // Detached if still busy: a failing bench must not leave its overlay behind.
            if self.rig.mounter.unmount(&self.merged).is_err() {
                let _ = rustix::mount::unmount(&self.merged, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// One round: `n` containers write `load`, then all are deleted (in parallel or one by
/// one). Returns each caller's delete latency and the time until no trace is left.
fn storm(
    rig: &Rig,
    image: &Image,
    strategy: &str,
    load: Load,
    n: usize,
    parallel: bool,
    round: usize,
) -> (Samples, Duration) {
    // Start every round from a clean page cache so rounds do not inherit writeback.
    rustix::fs::sync();
    let ids: Vec<String> = (0..n).map(|i| format!("s1-{round}-{i}")).collect();
    for id in &ids {
        let created = rig.create(image, id, strategy, false);
        load.write(&created.rootfs);
    }
    let start = Instant::now();
    let deletes: Samples = if parallel {
        std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| s.spawn(move || rig.timed_delete(id)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    } else {
        ids.iter().map(|id| rig.timed_delete(id)).collect()
    };
    // A deferred delete hands the work to the reaper (in production a detached
    // `lamina reap` the first delete starts); the storm ends when it is done.
    rig.reap_all();
    let wall = start.elapsed();
    assert!(rig.no_trace(), "S1 left containers behind ({strategy})");
    (deletes, wall)
}
