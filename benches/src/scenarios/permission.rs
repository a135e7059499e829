//! S5 permission path: threads stat and open files of one read-only rootfs. Every
//! access through overlay checks permission twice (overlay, then the layer with the
//! mounter's credentials), bumping one shared credential's refcount; the seed measured
//! that contention on many cores. `direct` has no overlay in the path at all.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human};

const STRATEGIES: &[&str] = &["classic", "shared-ro", "direct"];

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let duration = ctx
        .mode
        .pick(Duration::from_secs(3), Duration::from_millis(50));
    let rounds = ctx.mode.pick(3, 1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut table = Table::new(
        "s5-permission",
        &[
            "fs",
            "strategy (read-only)",
            "threads",
            "stat+open+close p50",
            "p99",
            "ops/s (all threads)",
            "ops/s vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 512);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        for threads in [1, cpus] {
            let mut classic_rate = None;
            for strategy in STRATEGIES {
                progress(&format!(
                    "S5 {} {strategy} {threads} threads",
                    rig.fs_name()
                ));
                let rootfs = rig.create(&image, "s5", strategy, true).rootfs;
                let files = regular_files(&rootfs);
                let mut ops = Samples::new();
                let mut rate = 0.0;
                for _ in 0..rounds {
                    let (s, r) = hammer(&files, threads, duration);
                    ops.extend(s);
                    rate += r / rounds as f64;
                }
                rig.delete_all();
                let s = ops.summary();
                let base = *classic_rate.get_or_insert(rate);
                table.row(vec![
                    rig.fs_name().into(),
                    format!("`{strategy}`"),
                    threads.to_string(),
                    human(s.p50),
                    human(s.p99),
                    format!("{rate:.0}"),
                    format!("{:.2}×", rate / base),
                ]);
            }
        }
    }
    vec![table]
}

/// Every regular file under `dir` (the busybox binary, its config files).
fn regular_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    assert!(!out.is_empty(), "no files to open in {}", dir.display());
    out
}

/// `threads` threads stat, open and close `files` round-robin for `duration`. Returns
/// every operation's latency and the operations per second of all threads together.
fn hammer(files: &[PathBuf], threads: usize, duration: Duration) -> (Samples, f64) {
    let start = Instant::now();
    let per_thread: Vec<Vec<Duration>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(1 << 20);
                    let mut i = t;
                    while start.elapsed() < duration {
                        let path = &files[i % files.len()];
                        let op = Instant::now();
                        std::fs::metadata(path).unwrap();
                        drop(std::fs::File::open(path).unwrap());
                        lat.push(op.elapsed());
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let total: usize = per_thread.iter().map(Vec::len).sum();
    (
        per_thread.into_iter().flatten().collect(),
        total as f64 / elapsed,
    )
}
