//! S3 copy-up storm: 20 containers at once touch files of their image. `chown`/`touch`
//! of a lower file copies the whole file up unless `metacopy=on`; creating
//! `__pycache__` entries copies up the directory, and every copy-up on one upper
//! filesystem takes its single rename lock. Reports per-container time and the storm's.
//! Rows marked `fsync=strict` mount the overlay with that option, which is how 6.12–6.14
//! kernels behave (an fsync after every metadata copy-up): there the shared upper's
//! rename lock is held across those fsyncs, and an isolated upper stops the queueing.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use lamina_image::Image;
use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, UTIME_NOW};

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Rounds, Samples};

/// Strategy lists, and whether the overlay is mounted `fsync=strict`.
const STRATEGIES: &[(&str, bool)] = &[
    ("classic", false),
    ("metacopy", false),
    ("volatile", false),
    ("metacopy,volatile", false),
    ("isolated", false),
    ("isolated,metacopy", false),
    ("isolated-memory", false),
    ("classic", true),
    ("metacopy", true),
    ("isolated", true),
    ("isolated,metacopy", true),
    ("isolated-memory", true),
];

#[derive(Debug, Clone, Copy)]
enum Load {
    /// chown then touch every lower file.
    ChownTouch,
    /// Per directory: mkdir `__pycache__`, then per module a temp file renamed into
    /// place, as CPython writes bytecode.
    Pycache,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::ChownTouch => "chown + touch every file",
            Load::Pycache => "write __pycache__",
        }
    }

    fn apply(self, rootfs: &Path, dirs: usize, files: usize) {
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        };
        let times = Timestamps {
            last_access: now,
            last_modification: now,
        };
        let pyc = vec![0x42u8; 1500];
        for d in 0..dirs {
            let dir = rootfs.join(format!("pkg{d}"));
            match self {
                Load::ChownTouch => {
                    for f in 0..files {
                        let path = dir.join(format!("mod{f}.py"));
                        workload_chown(&path);
                        rustix::fs::utimensat(CWD, &path, &times, AtFlags::empty()).unwrap();
                    }
                }
                Load::Pycache => {
                    let cache = dir.join("__pycache__");
                    fs::create_dir(&cache).unwrap();
                    for f in 0..files {
                        let done = cache.join(format!("mod{f}.cpython-313.pyc"));
                        let temp = cache.join(format!("mod{f}.cpython-313.pyc.{f}"));
                        fs::write(&temp, &pyc).unwrap();
                        fs::rename(&temp, &done).unwrap();
                    }
                }
            }
        }
    }
}

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let containers = ctx.mode.pick(20, 3);
    let (dirs, files) = ctx.mode.pick((60, 50), (3, 5));
    let size = 8 << 10;
    let rounds = ctx.mode.pick(2, 1);
    let mut table = Table::new(
        "s3-copy-up",
        &[
            "fs",
            "load per container",
            "strategy",
            "per container p50",
            "p99",
            "p50 vs classic",
            "whole storm",
            "vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 4096);
        let image = rig.warm(&crate::images::many_files(
            &rig.scratch("image"),
            dirs,
            files,
            size,
        ));
        for load in [Load::ChownTouch, Load::Pycache] {
            let mut baseline = None;
            for &(strategy, strict) in STRATEGIES {
                if strict && !matches!(load, Load::Pycache) {
                    continue; // strict fsyncs after metadata copy-up: the pyc load's case
                }
                let label = if strict {
                    format!("`{strategy}` + `fsync=strict`")
                } else {
                    format!("`{strategy}`")
                };
                progress(&format!(
                    "S3 {} {} {label} ({containers} containers × {} files)",
                    rig.fs_name(),
                    load.name(),
                    dirs * files
                ));
                let mut storms = Rounds::default();
                for round in 0..rounds {
                    storms.add(storm(
                        &rig,
                        &image,
                        (strategy, strict),
                        load,
                        containers,
                        round,
                        (dirs, files),
                    ));
                }
                let result = storms.result();
                let base = *baseline.get_or_insert(result);
                let mut row = vec![
                    rig.fs_name().into(),
                    format!("{} ({} files)", load.name(), dirs * files),
                    label,
                ];
                row.extend(result.cells(&base));
                table.row(row);
            }
        }
    }
    vec![table]
}

/// One storm: `n` containers apply `load` at once. Returns each one's time and the
/// storm's wall time.
fn storm(
    rig: &Rig,
    image: &Image,
    (strategy, strict): (&str, bool),
    load: Load,
    n: usize,
    round: usize,
    (dirs, files): (usize, usize),
) -> (Samples, Duration) {
    rustix::fs::sync();
    let mut options = crate::rig::options(strategy, false);
    if strict {
        options
            .extra_overlay_options
            .push(("fsync".into(), Some("strict".into())));
    }
    let rootfs: Vec<_> = (0..n)
        .map(|i| {
            rig.create_with(image, &format!("s3-{round}-{i}"), &options)
                .rootfs
        })
        .collect();
    let barrier = std::sync::Barrier::new(n);
    let start = Instant::now();
    let each: Samples = std::thread::scope(|s| {
        let handles: Vec<_> = rootfs
            .iter()
            .map(|r| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let t = Instant::now();
                    load.apply(r, dirs, files);
                    t.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = start.elapsed();
    rig.delete_all();
    (each, wall)
}

/// The container's own chown through its rootfs: the load being measured, not a call
/// lamina makes (so not one for the kernel seam).
#[allow(clippy::disallowed_methods)]
fn workload_chown(path: &Path) {
    std::os::unix::fs::chown(path, Some(1000), Some(1000)).unwrap();
}
