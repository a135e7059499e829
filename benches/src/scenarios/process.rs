//! Process per call: `lamina create` and `lamina delete` as separate processes, the way
//! Garden calls an image plugin, on a warm image. Includes process start, store open,
//! (for `auto`) reading the cached probe, and printing the runtime spec.
//!
//! Two baselines are measured in the same loop, interleaved with the calls so a busy
//! moment costs every column alike:
//! - `/bin/true` spawned and waited for the same way (stdout and stderr captured, as
//!   Garden does): what any process per call costs here;
//! - the kernel floor: what the operation needs the kernel to do, in this process —
//!   create: the container's three directories and the classic overlay mount; delete:
//!   its unmount (which syncs the upper filesystem, stall S1) and removing them.
//!
//! The auto rows run again with 300 other containers mounted, as on a busy Garden cell:
//! a call that reads the mount table pays for every one of them.
//!
//! The binary is the release build beside the bench executable: static and non-PIE, as
//! every build is (`.cargo/config.toml`), which is most of what a process pays here.
//!
//! With `LAMINA_BASELINE_BIN=/path/to/another/lamina` (an older build), that binary's
//! create and delete are timed in the same loop too, interleaved with this build's, on a
//! store of its own on the same filesystem (a build from before symlink records refuses
//! this build's stores), and a second table compares the two: on this VM a run's absolute times move
//! by a fifth from one hour to the next, so a change is measured against its baseline in
//! one run, never against an earlier table.
//!
//! With `GROOTFS_BIN`, a third table times GrootFS on the same rootfs tar
//! (`process_grootfs.rs`).

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use lamina_integration::{Lamina, wait_until};
use lamina_sys::Mounter;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human};

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let calls = ctx.mode.pick(200, 3);
    let live_count = ctx.mode.pick(300, 2);
    let mut table = Table::new(
        "process",
        &[
            "fs",
            "strategy",
            "live containers",
            "calls",
            "`/bin/true` p50",
            "create p50",
            "create p99",
            "delete p50",
            "delete p99",
            "kernel floor create / delete p50",
            "create+delete p50 vs classic",
        ],
    );
    let baseline_bin = std::env::var_os("LAMINA_BASELINE_BIN").map(std::path::PathBuf::from);
    let mut compared = Table::new(
        "process-baseline",
        &[
            "fs",
            "strategy",
            "live containers",
            "calls",
            "create p50: this build / baseline",
            "delete p50: this build / baseline",
            "create / delete vs baseline",
            "page faults create / delete p50: this build / baseline",
            "binary bytes: this build / baseline",
        ],
    );
    let mut grootfs = None;
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 512);
        let reference = crate::images::sample(&rig.scratch("image"));
        let image = rig.warm(&reference);
        let floor = Floor::new(&rig, &image);
        let lamina = Lamina::new(rig.store.root());
        // The timed calls run copies, made the same way: an earlier run timed the build
        // where the linker wrote it and found it 15% slower than the very same bytes
        // copied, which a comparison between two builds must not inherit.
        let bins = rig.scratch("bin");
        let this_bin = installed(&lamina_integration::lamina::binary(), &bins.join("this"));
        let baseline_bin = baseline_bin
            .as_deref()
            .map(|bin| installed(bin, &bins.join("baseline")));
        // A store of the baseline's own on the same filesystem: a build from before
        // symlink records refuses a store this build made (docs/store.md).
        let baseline_store = rig.scratch("baseline-store").join("store");
        if let Some(bin) = &baseline_bin {
            timed(bin, &baseline_store, "init-store", &[]);
        }
        let mut classic = None;
        for (strategy, live) in [("classic", 0), ("auto", 0), ("auto", live_count)] {
            progress(&format!(
                "process {} {strategy} × {calls}, {live} live",
                rig.fs_name()
            ));
            // Other containers mounted meanwhile, as on a busy Garden cell: what a call
            // reads in proportion to the mount table shows here.
            for n in 0..live {
                lamina.create_with(&["--strategy", "classic"], &reference, &format!("live-{n}"));
            }
            // The first auto create probes the store's filesystem; that is a one-off
            // per boot, not a per-call cost.
            lamina.create_with(&["--strategy", strategy], &reference, "warmup");
            lamina.run(&["delete", "warmup"]);
            if let Some(bin) = &baseline_bin {
                let create = ["--strategy", strategy, &reference, "warmup"];
                timed(bin, &baseline_store, "create", &create);
                timed(bin, &baseline_store, "delete", &["warmup"]);
            }
            let mut spawns = Samples::new();
            let mut creates = Samples::new();
            let mut deletes = Samples::new();
            let mut floor_creates = Samples::new();
            let mut floor_deletes = Samples::new();
            let mut baseline_creates = Samples::new();
            let mut baseline_deletes = Samples::new();
            // Minor page faults per call: what a process touches of its binary and heap.
            let mut faults: [Vec<u64>; 4] = Default::default();
            for i in 0..calls {
                spawns.push(spawn_true());
                // With a baseline, every other round runs it first: what one call leaves
                // behind (a reaper, a journal commit) then weighs on both builds alike.
                let round = |bin: Option<&std::path::Path>, store: &std::path::Path, id: String| {
                    bin.map(|bin| {
                        let create = ["--strategy", strategy, &reference, &id];
                        let c = timed(bin, store, "create", &create);
                        (c, timed(bin, store, "delete", &[&id]))
                    })
                };
                let this = || round(Some(&this_bin), rig.store.root(), format!("p-{i}"));
                let baseline = || round(baseline_bin.as_deref(), &baseline_store, format!("b-{i}"));
                let (this_times, baseline_times) = if i % 2 == 1 {
                    let b = baseline();
                    (this(), b)
                } else {
                    (this(), baseline())
                };
                let (c, d) = this_times.expect("this build's round");
                creates.push(c.time);
                deletes.push(d.time);
                faults[0].push(c.faults);
                faults[1].push(d.faults);
                if let Some((c, d)) = baseline_times {
                    baseline_creates.push(c.time);
                    baseline_deletes.push(d.time);
                    faults[2].push(c.faults);
                    faults[3].push(d.faults);
                }
                let (create, delete) = floor.once();
                floor_creates.push(create);
                floor_deletes.push(delete);
            }
            for n in 0..live {
                lamina.run(&["delete", &format!("live-{n}")]);
            }
            // `auto` deletes are deferred to a detached `lamina reap`.
            wait_until("background reaper", || rig.no_trace());
            let (c, d) = (creates.summary(), deletes.summary());
            let both = c.p50 + d.p50;
            let base = *classic.get_or_insert(both);
            table.row(vec![
                rig.fs_name().into(),
                format!("`{strategy}`"),
                live.to_string(),
                calls.to_string(),
                human(spawns.summary().p50),
                human(c.p50),
                human(c.p99),
                human(d.p50),
                human(d.p99),
                format!(
                    "{} / {}",
                    human(floor_creates.summary().p50),
                    human(floor_deletes.summary().p50)
                ),
                crate::stats::ratio(both, base),
            ]);
            if baseline_bin.is_some() {
                let (bc, bd) = (baseline_creates.summary(), baseline_deletes.summary());
                compared.row(vec![
                    rig.fs_name().into(),
                    format!("`{strategy}`"),
                    live.to_string(),
                    calls.to_string(),
                    format!("{} / {}", human(c.p50), human(bc.p50)),
                    format!("{} / {}", human(d.p50), human(bd.p50)),
                    format!(
                        "{} / {}",
                        crate::stats::ratio(c.p50, bc.p50),
                        crate::stats::ratio(d.p50, bd.p50)
                    ),
                    format!(
                        "{} / {} — {} / {}",
                        median(&mut faults[0]),
                        median(&mut faults[1]),
                        median(&mut faults[2]),
                        median(&mut faults[3])
                    ),
                    format!(
                        "{} / {}",
                        file_bytes(&this_bin),
                        baseline_bin.as_deref().map_or(0, file_bytes)
                    ),
                ]);
            }
        }
        if grootfs.is_none() && std::env::var_os("GROOTFS_BIN").is_some() {
            progress(&format!("process {} against GrootFS", rig.fs_name()));
            grootfs = super::process_grootfs::table(&rig, &this_bin, calls);
        }
    }
    let mut tables = vec![table];
    tables.extend(baseline_bin.is_some().then_some(compared));
    tables.extend(grootfs);
    tables
}

/// A copy of the binary at `from`, at `to`, executable.
fn installed(from: &std::path::Path, to: &std::path::Path) -> std::path::PathBuf {
    fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    to.to_path_buf()
}

/// One call's wall time and the minor page faults its process took.
struct Call {
    time: Duration,
    faults: u64,
}

/// One call of the binary at `bin` on `store`, spawned and timed as [`Lamina::run`]'s
/// are (stdout and stderr captured); it must succeed.
fn timed(bin: &std::path::Path, store: &std::path::Path, command: &str, args: &[&str]) -> Call {
    use std::process::Stdio;
    let t = Instant::now();
    let mut child = Command::new(bin)
        .arg("--store")
        .arg(store)
        .arg(command)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    // Read as it comes, however much a call writes (`--log-level debug`), so the call
    // never waits on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = std::io::Read::read_to_end(&mut pipe, &mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    // Waited for but not reaped, so its /proc entry still holds its counts.
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::waitid(
        rustix::process::WaitId::Pid(pid),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
    )
    .expect("waitid");
    let time = t.elapsed();
    let faults = minor_faults(child.id());
    let status = child.wait().expect("reaping the call");
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    assert!(
        status.success(),
        "{} {command} {args:?}: {status}\n{}\n{}",
        bin.display(),
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    Call { time, faults }
}

/// `minflt` of an exited, unreaped process (proc(5): the 10th field of its stat).
fn minor_faults(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the call's stat");
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_name
        .split_whitespace()
        .nth(7)
        .and_then(|field| field.parse().ok())
        .expect("minflt in stat")
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

fn file_bytes(path: &std::path::Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// `/bin/true`, spawned as [`Lamina::run`] spawns lamina.
fn spawn_true() -> Duration {
    let t = Instant::now();
    let out = Command::new("/bin/true").output().expect("/bin/true");
    let elapsed = t.elapsed();
    assert!(out.status.success());
    elapsed
}

/// The kernel work of a classic create and an inline delete, without lamina.
struct Floor<'a> {
    rig: &'a Rig,
    chain: Vec<lamina_image::Digest>,
    base: std::path::PathBuf,
}

impl<'a> Floor<'a> {
    fn new(rig: &'a Rig, image: &lamina_image::Image) -> Self {
        Self {
            rig,
            chain: image.chain_ids(),
            base: rig.scratch("floor"),
        }
    }

    /// One create's and one delete's kernel work, each timed.
    fn once(&self) -> (Duration, Duration) {
        let dir = self.base.join("c");
        let dirs = lamina_store::ContainerDirs::under(dir.clone());
        let spec = lamina_mount::plan::classic(&self.rig.store, &self.chain, &dirs);
        let t = Instant::now();
        fs::create_dir(&dir).expect("floor dir");
        for d in [&dirs.rootfs, &dirs.upper, &dirs.work] {
            fs::create_dir(d).expect("floor dirs");
        }
        self.rig
            .mounter
            .mount_overlay(&spec, &dirs.rootfs)
            .expect("floor mount");
        let create = t.elapsed();
        let t = Instant::now();
        self.rig
            .mounter
            .unmount(&dirs.rootfs)
            .expect("floor unmount");
        fs::remove_dir_all(&dir).expect("floor removal");
        (create, t.elapsed())
    }
}
