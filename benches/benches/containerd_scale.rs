//! lamina as containerd's snapshotter at node scale, against containerd's built-in
//! overlayfs snapshotter and against containerd's overlayfs snapshotter served as a proxy
//! plugin like lamina (`overlayfs-proxy`: the same gRPC hop, issue 23's baseline; full runs
//! only, where a Go toolchain can build it), in the same run, on the same loop-backed
//! ext4, all through containerd 1.6's snapshots API (issue 23):
//!
//! - committing N layers, each a Prepare with no parent and a Commit (what an image
//!   unpack does per layer), from an empty snapshotter to 1000 and to 5000;
//! - the container snapshot cycle — Prepare on the image's top layer, Mounts, mount the
//!   answer as the shim does, unmount, Remove — with 10, 1000 and 5000 committed
//!   snapshots in the snapshotter, once lamina's reaper has removed what the fill's
//!   commits left it; lamina's also with its snapshots marked ephemeral (a volatile
//!   upper); every snapshotter's cycles alternate in a sequence where each follows every
//!   other equally often (`lamina_benches::order`);
//! - the resident memory of the process serving each (containerd itself for overlayfs,
//!   the proxy's own process for the others) with 5000 committed;
//! - `ctr images import` of a 100-layer image into each, its content already in
//!   containerd's store (ingested once with `--no-unpack`), so the unpack is what is timed.
//!
//! Prints its tables as markdown (docs/benchmarks.md, "containerd at node scale").
//! `cargo bench -p lamina-benches --bench containerd_scale`; under `cargo test` it runs
//! at tiny sizes, to prove it still runs. Needs root and Debian's containerd.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use lamina_benches::containerd_rig::{self, OVERLAY_PROXY, mount_all, top_layer};
use lamina_benches::order::{balanced_count, balanced_sequence};
use lamina_integration::containerd::Containerd;
use lamina_integration::snapshotter::{Api, Labels, labels};
use lamina_integration::{ScratchFs, require_root};
use rustix::mount::UnmountFlags;

const NAMESPACE: &str = "scale";

/// One snapshotter under test, through containerd: its top layer of the sample image, and
/// the committed layers it was filled with so far and the time they took.
struct Subject<'a> {
    name: &'a str,
    api: Api,
    parent: String,
    committed: usize,
    committing: Duration,
}

/// Sizes of one run: committed snapshots to measure the cycle at, cycles per size, and
/// the layers of the deep image imported last.
struct Sizes {
    committed: Vec<usize>,
    cycles: usize,
    deep_layers: usize,
}

fn main() {
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            committed: vec![10, 1000, 5000],
            cycles: 200,
            deep_layers: 100,
        }
    } else {
        Sizes {
            committed: vec![2, 4],
            cycles: 3,
            deep_layers: 5,
        }
    };
    let fs = ScratchFs::ext4(4096);
    let (daemon, proxy, ctd) = containerd_rig::start_for_run(full, &fs, NAMESPACE);
    // lamina last: at each size it is filled after the others, so its fill's commits go
    // through containerd metadata that already holds theirs, not the reverse.
    let snapshotters: Vec<&str> = match proxy {
        Some(_) => vec!["overlayfs", OVERLAY_PROXY, "lamina"],
        None => vec!["overlayfs", "lamina"],
    };
    let target = fs.path().join("rootfs");
    std::fs::create_dir(&target).unwrap();

    let mut subjects: Vec<Subject> = snapshotters
        .iter()
        .map(|&name| {
            let api = Api::via_containerd(&ctd.socket, name, NAMESPACE);
            let parent = top_layer(&api);
            Subject {
                name,
                api,
                parent,
                committed: 0,
                committing: Duration::ZERO,
            }
        })
        .collect();
    // Each cycle variant: who it is reported as, the snapshotter it runs on, its labels.
    // lamina's cycle is also measured as an operator gets it who marks containers
    // ephemeral (a volatile upper: no sync at unmount, writes lost on a crash).
    let variants: Vec<(&str, usize, Labels)> = subjects
        .iter()
        .enumerate()
        .flat_map(|(i, s)| match s.name {
            "lamina" => vec![("lamina", i, gc_root()), (LAMINA_EPHEMERAL, i, ephemeral())],
            name => vec![(name, i, gc_root())],
        })
        .collect();
    let trash = fs.path().join("store").join("trash");

    let mut cycles = Vec::new();
    let mut commits = Vec::new();
    let mut breakdown = Vec::new();
    let mut direct_stats = Vec::new();
    for &size in &sizes.committed {
        for s in &mut subjects {
            while s.committed < size {
                s.committing += commit_empty_layer(&s.api, s.committed);
                s.committed += 1;
            }
            eprintln!(
                "{}: {} committed in {:?}",
                s.name, s.committed, s.committing
            );
            commits.push((s.name, size, s.committing));
        }
        // A lamina commit leaves the active snapshot's container to the daemon's reaper
        // (deferred delete): the cycles are measured once it has caught up, not while it
        // works through the fill's backlog beside them.
        wait_for_reaper(&trash);
        // Every variant's cycles alternate in a sequence where each follows every other
        // equally often, so all see the same host and share alike what a neighbour left
        // unsynced (an unmount's sync commits it).
        let mut samples = vec![Vec::new(); variants.len()];
        let mut steps: Vec<[Vec<Duration>; STEPS.len()]> = vec![Default::default(); variants.len()];
        let sequence = balanced_sequence(variants.len());
        let per_variant = balanced_count(variants.len(), sizes.cycles);
        for (i, &v) in sequence
            .iter()
            .cycle()
            .take(per_variant * variants.len())
            .enumerate()
        {
            let (_, subject, labels) = &variants[v];
            let subject = &subjects[*subject];
            let key = format!("cycle-{size}-{i}-{v}");
            let (total, each) = cycle(&subject.api, &subject.parent, &key, &target, labels);
            samples[v].push(total);
            for (step, took) in steps[v].iter_mut().zip(each) {
                step.push(took);
            }
        }
        for ((who, _, _), (mut samples, steps)) in
            variants.iter().zip(samples.into_iter().zip(steps))
        {
            samples.sort();
            cycles.push((*who, size, samples));
            breakdown.push((
                *who,
                size,
                steps.map(|mut s| {
                    s.sort();
                    nearest_rank(&s, 0.5)
                }),
            ));
        }
        // The same cycle straight on each proxy's socket, containerd left out: what the
        // snapshotter's own call costs as its store grows. containerd's collector removes
        // snapshots its metadata does not hold, such as the direct cycles': it is run to
        // the end first, while nothing in containerd's metadata changes during the direct
        // calls. Its Removes hand lamina's reaper the cycles' containers: those go first
        // too.
        ctd.collect_garbage(NAMESPACE);
        wait_for_reaper(&trash);
        for s in &subjects {
            let socket = match (s.name, &proxy) {
                ("lamina", _) => daemon.socket.clone(),
                (OVERLAY_PROXY, Some(proxy)) => proxy.socket.clone(),
                _ => continue,
            };
            direct_stats.push((
                s.name,
                size,
                direct_stat_p50(&socket, sizes.cycles),
                direct_cycle_p50(&socket, &s.parent, &target, size, sizes.cycles),
            ));
        }
    }
    let memory: Vec<(&str, usize, u64)> = subjects
        .iter()
        .map(|s| {
            let pid = match (s.name, &proxy) {
                ("lamina", _) => daemon.pid().unwrap(),
                (OVERLAY_PROXY, Some(proxy)) => proxy.pid(),
                _ => ctd.pid(),
            };
            (s.name, s.committed, resident_kib(pid))
        })
        .collect();
    // Tables list each snapshotter's rows together, in the order measured.
    let rank = |who: &str| variants.iter().position(|(w, _, _)| *w == who).unwrap();
    cycles.sort_by_key(|(who, _, _)| rank(who));
    commits.sort_by_key(|(who, _, _)| rank(who));
    breakdown.sort_by_key(|(who, _, _)| rank(who));
    direct_stats.sort_by_key(|(who, _, _, _)| rank(who));
    let imports = import_deep(&ctd, &fs, sizes.deep_layers, &snapshotters);
    let baselines = &snapshotters[..snapshotters.len() - 1];
    print_tables(&cycles, &commits, &memory, &sizes, baselines);
    print_breakdown(&breakdown, baselines);
    println!();
    println!(
        "| snapshotter | committed snapshots | Stat p50 on its own socket (no containerd) | cycle p50 on its own socket | vs `{OVERLAY_PROXY}` |"
    );
    println!("|---|---|---|---|---|");
    for (who, size, stat, cycle) in &direct_stats {
        let base = direct_stats
            .iter()
            .find(|(w, s, _, _)| *w == OVERLAY_PROXY && s == size)
            .map(|d| d.3);
        let vs = base.map_or("–".into(), |b| lamina_benches::stats::ratio(*cycle, b));
        println!(
            "| `{who}` | {size} | {} | {} | {vs} |",
            ms(*stat),
            ms(*cycle)
        );
    }
    println!();
    println!(
        "| snapshotter | `ctr images import`, {} layers | {} |",
        sizes.deep_layers,
        vs_headers(baselines)
    );
    println!("|---|---|{}", "---|".repeat(baselines.len()));
    for (who, took) in &imports {
        let base = |b: &str| imports.iter().find(|(s, _)| *s == b).unwrap().1;
        println!(
            "| `{who}` | {} | {} |",
            ms(*took),
            ratios(*took, baselines, base)
        );
    }
    drop(ctd);
    drop(proxy);
    drop(daemon);
}

/// Waits (up to ten minutes) until `trash` is empty.
fn wait_for_reaper(trash: &Path) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while std::fs::read_dir(trash).is_ok_and(|mut d| d.next().is_some()) {
        assert!(
            Instant::now() < deadline,
            "the reaper did not empty {trash:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ctr images import` of an image of `layers` layers into each snapshotter, timed, its
/// content ingested beforehand so both time the unpack alone.
fn import_deep<'a>(
    ctd: &Containerd,
    fs: &ScratchFs,
    layers: usize,
    snapshotters: &[&'a str],
) -> Vec<(&'a str, Duration)> {
    let files = lamina_integration::deep_image(&fs.path().join("deep"), layers);
    let archive = files.oci_archive.to_str().unwrap();
    let import = |extra: &[&str]| {
        let mut args = vec!["--namespace", NAMESPACE, "images", "import"];
        args.extend(extra);
        args.extend(["--base-name", "docker.io/lamina/deep", archive]);
        ctd.ctr_ok(&args);
    };
    import(&["--no-unpack"]);
    snapshotters
        .iter()
        .map(|&snapshotter| {
            let t = Instant::now();
            import(&["--snapshotter", snapshotter]);
            (snapshotter, t.elapsed())
        })
        .collect()
}

/// Snapshots made through containerd's API outside a lease are containerd's garbage:
/// each carries a GC root label.
fn gc_root() -> Labels {
    labels(&[("containerd.io/gc.root", "bench")])
}

/// lamina's cycle with its snapshots marked ephemeral.
const LAMINA_EPHEMERAL: &str = "lamina, ephemeral";

/// [`gc_root`] and lamina's ephemeral label: a volatile upper.
fn ephemeral() -> Labels {
    labels(&[
        ("containerd.io/gc.root", "bench"),
        (lamina_snapshotter::EPHEMERAL_LABEL, "true"),
    ])
}

/// One layer of an unpack: Prepare with no parent, Commit; timed together.
fn commit_empty_layer(api: &Api, n: usize) -> Duration {
    let key = format!("fill-{n}");
    let t = Instant::now();
    api.prepare(&key, "", gc_root()).unwrap();
    api.commit(&format!("layer-{n}"), &key, gc_root()).unwrap();
    t.elapsed()
}

/// The steps of a cycle, timed one by one as well: `Stat` of the parent first, a call
/// that only reads a row, shows what one call through containerd to each costs.
const STEPS: [&str; 5] = ["Stat", "Prepare", "Mounts", "mount + unmount", "Remove"];

/// A container start and stop as the snapshotter sees it: the cycle's time (the `Stat`
/// before it not counted), and each of [`STEPS`].
fn cycle(
    api: &Api,
    parent: &str,
    key: &str,
    target: &Path,
    labels: &Labels,
) -> (Duration, [Duration; STEPS.len()]) {
    let mut steps = [Duration::ZERO; STEPS.len()];
    let mut timed = |step: usize, work: &mut dyn FnMut()| {
        let t = Instant::now();
        work();
        steps[step] = t.elapsed();
    };
    timed(0, &mut || {
        api.stat(parent).unwrap();
    });
    let mut mounts = Vec::new();
    timed(1, &mut || {
        api.prepare(key, parent, labels.clone()).unwrap();
    });
    timed(2, &mut || mounts = api.mounts(key).unwrap());
    timed(3, &mut || {
        mount_all(&mounts, target);
        rustix::mount::unmount(target, UnmountFlags::empty()).unwrap();
    });
    timed(4, &mut || api.remove(key).unwrap());
    (steps[1..].iter().sum(), steps)
}

/// p50 of `n` container cycles ([`cycle`]) straight to the snapshotter at `socket`,
/// containerd left out: the snapshotter's own share of the cycle. The parent is the
/// image's top layer (containerd's key for it ends with `parent`, its name there).
fn direct_cycle_p50(socket: &Path, parent: &str, target: &Path, size: usize, n: usize) -> Duration {
    let api = Api::connect(socket);
    let parent = api
        .list(&["kind==committed"])
        .unwrap()
        .into_iter()
        .find(|key| key.ends_with(&format!("/{parent}")))
        .expect("the image's top layer on the snapshotter's own socket");
    let mut samples: Vec<Duration> = (0..n)
        .map(|i| {
            let key = format!("direct-cycle-{size}-{i}");
            cycle(&api, &parent, &key, target, &Labels::new()).0
        })
        .collect();
    samples.sort();
    nearest_rank(&samples, 0.5)
}

/// p50 of `n` Stat calls of one committed snapshot, straight to the snapshotter at
/// `socket` (keys there are containerd's internal ones: the first listed is used).
fn direct_stat_p50(socket: &Path, n: usize) -> Duration {
    let api = Api::connect(socket);
    let key = api.list(&["kind==committed"]).unwrap().swap_remove(0);
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            api.stat(&key).unwrap();
            t.elapsed()
        })
        .collect();
    samples.sort();
    nearest_rank(&samples, 0.5)
}

/// `VmRSS` of process `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn nearest_rank(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

type Cycles<'a> = [(&'a str, usize, Vec<Duration>)];

/// "vs X" column headers, one per baseline.
fn vs_headers(baselines: &[&str]) -> String {
    baselines
        .iter()
        .map(|b| format!("vs `{b}`"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `took` against each baseline's time, as "1.23×" cells.
fn ratios(took: Duration, baselines: &[&str], base: impl Fn(&str) -> Duration) -> String {
    baselines
        .iter()
        .map(|b| format!("{:.2}×", took.as_secs_f64() / base(b).as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn print_tables(
    cycles: &Cycles<'_>,
    commits: &[(&str, usize, Duration)],
    memory: &[(&str, usize, u64)],
    sizes: &Sizes,
    baselines: &[&str],
) {
    let p50 = |who: &str, size: usize| {
        cycles
            .iter()
            .find(|(s, n, _)| *s == who && *n == size)
            .map(|(_, _, samples)| nearest_rank(samples, 0.5))
            .unwrap()
    };
    let vs = vs_headers(baselines);
    let dashes = "---|".repeat(baselines.len());
    println!(
        "| snapshotter | committed snapshots | cycles | cycle p50 | cycle p99 | {vs} | vs fewest committed |"
    );
    println!("|---|---|---|---|---|{dashes}---|");
    for (who, size, samples) in cycles {
        let median = nearest_rank(samples, 0.5);
        println!(
            "| `{who}` | {size} | {} | {} | {} | {} | {:.2}× |",
            samples.len(),
            ms(median),
            ms(nearest_rank(samples, 0.99)),
            ratios(median, baselines, |b| p50(b, *size)),
            median.as_secs_f64() / p50(who, sizes.committed[0]).as_secs_f64(),
        );
    }
    println!();
    println!("| snapshotter | layers committed | total | per layer | {vs} |");
    println!("|---|---|---|---|{dashes}");
    for (who, n, total) in commits {
        let base = |b: &str| {
            commits
                .iter()
                .find(|(s, m, _)| *s == b && m == n)
                .map(|(_, _, t)| *t)
                .unwrap()
        };
        println!(
            "| `{who}` | {n} | {:.2} s | {} | {} |",
            total.as_secs_f64(),
            ms(*total / (*n).max(1) as u32),
            ratios(*total, baselines, base),
        );
    }
    println!();
    println!("| snapshotter | process measured | committed snapshots | resident memory |");
    println!("|---|---|---|---|");
    for (who, n, kib) in memory {
        let process = match *who {
            "lamina" => "`lamina daemon`",
            OVERLAY_PROXY => "`overlay-proxy` (containerd v2.4.2's overlayfs, alone)",
            _ => "`containerd` (the snapshotter is built in)",
        };
        println!(
            "| `{who}` | {process} | {n} | {:.1} MiB |",
            *kib as f64 / 1024.0
        );
    }
}

/// Each step's p50, per snapshotter and size, and the others' against the last baseline
/// (the same-hop one when there is one).
fn print_breakdown(breakdown: &[(&str, usize, [Duration; STEPS.len()])], baselines: &[&str]) {
    let reference = baselines[baselines.len() - 1];
    println!();
    println!(
        "| snapshotter | committed snapshots | {} |",
        STEPS.map(|s| format!("{s} p50")).join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(STEPS.len()));
    for (who, size, steps) in breakdown {
        let baseline = breakdown
            .iter()
            .find(|(s, n, _)| *s == reference && n == size)
            .map(|(_, _, b)| *b)
            .unwrap();
        let cells: Vec<String> = steps
            .iter()
            .zip(baseline)
            .map(|(took, base)| {
                if *who == reference {
                    ms(*took)
                } else {
                    format!(
                        "{} ({:.2}×)",
                        ms(*took),
                        took.as_secs_f64() / base.as_secs_f64()
                    )
                }
            })
            .collect();
        println!("| `{who}` | {size} | {} |", cells.join(" | "));
    }
}
