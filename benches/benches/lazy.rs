//! Lazy pulling against a full pull (issue 39), in the same run, from the same registry
//! (Debian's docker-registry) on the same loop-backed ext4, through the CLI as Garden runs
//! it and runc: an eStargz image of busybox and a data layer of ~100 MB or ~1 GB of
//! incompressible files, whose container reads ~8 % of the bytes before its first line of
//! output. The registry is reached through a delay proxy adding 0 or 30 ms to every
//! round trip (`lamina_integration::delay_proxy`; this kernel has no netem).
//!
//! - **first output**: from `lamina create` (a fresh store each time) to the container's
//!   first line: `--strategy lazy` against `--strategy classic`, which pulls whole;
//! - **bytes**: fetched from the registry before that line, over the bytes the container
//!   read; and all fetched once background completion has made every layer ordinary;
//! - **first output through CRI** (containerd 2.4, crictl as the kubelet drives it): from
//!   `crictl pull` through `runp`, `create` and `start` to the container's first line, on
//!   a fresh node and store each time: lamina serving remote snapshots (`--remote-snapshots`,
//!   containerd passing the labels) against lamina with containerd downloading and
//!   unpacking every layer;
//! - **reads**: sequential (a whole unread file) and random (4 KiB at 256 offsets of
//!   another) through the rootfs of a lazy container while its data is missing, again
//!   once its chunks are present (page cache dropped), and on a container made after
//!   completion (ordinary layers) against a classic one.
//!
//! Prints markdown tables (docs/benchmarks.md, "Lazy pulling"). `cargo bench -p
//! lamina-benches --bench lazy`; under `cargo test` it runs at a tiny size to prove it
//! still runs. Needs root, docker-registry and `LAMINA_CONTAINERD2_BIN`
//! (`scripts/containerd2`).

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lamina_benches::stats::{Samples, human, ratio};
use lamina_image::lazy::estargz::PREFETCH_LANDMARK;
use lamina_integration::delay_proxy::DelayProxy;
use lamina_integration::registry::Registry;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root};
use lamina_sample::LayerBuilder;

/// One image size: `files` files of `file_bytes` each, every `read_every`-th read at start.
#[derive(Clone, Copy)]
struct Size {
    name: &'static str,
    files: usize,
    file_bytes: usize,
    read_every: usize,
    runs: usize,
}

const CHUNK: u64 = 1 << 20;
const REPO: &str = "bench/lazy";

fn main() {
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    // `--only cli|cri` runs one path's rows (and the reads with the CLI's).
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let runs = |path: &str| only.as_deref().is_none_or(|o| o == path);
    let sizes = if full {
        vec![
            Size {
                name: "~100 MB",
                files: 100,
                file_bytes: 1 << 20,
                read_every: 12,
                runs: 3,
            },
            Size {
                name: "~1 GB",
                files: 256,
                file_bytes: 4 << 20,
                read_every: 12,
                runs: 2,
            },
        ]
    } else {
        vec![Size {
            name: "tiny",
            files: 12,
            file_bytes: 64 << 10,
            read_every: 12,
            runs: 1,
        }]
    };
    let fs = ScratchFs::ext4(if full { 16 * 1024 } else { 1024 });
    let registry = Registry::start(&fs.path().join("registry"), None);
    let mut first_rows = Vec::new();
    let mut cri_rows = Vec::new();
    let mut read_rows = Vec::new();
    let pause = lamina_integration::cri::pause_image(&fs.path().join("pause"));
    for size in &sizes {
        let tag = format!("{REPO}:{}", size.files);
        let started = Instant::now();
        push(&registry, fs.path(), size, &tag);
        eprintln!(
            "lazy bench: {} image pushed in {:?}",
            size.name,
            started.elapsed()
        );
        for rtt_ms in [0u64, 30] {
            let proxy = DelayProxy::start(&registry.host, Duration::from_millis(rtt_ms));
            let reference = format!("docker://{}/{tag}", proxy.host);
            let manifest: serde_json::Value =
                serde_json::from_slice(&registry.manifest(&tag)).unwrap();
            let blob_bytes: u64 = manifest["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["size"].as_u64().unwrap())
                .sum();
            let rig = Rig {
                dir: fs.path(),
                proxy: &proxy,
                reference: &reference,
                size: *size,
            };
            if runs("cli") {
                let (mut lazy, mut whole) = (Samples::new(), Samples::new());
                let (mut fetched_first, mut fetched_total) = (0, 0);
                for run in 0..size.runs {
                    let one = rig.first_output(&format!("lazy-{rtt_ms}-{run}"), true);
                    lazy.push(one.took);
                    fetched_first = one.fetched_first;
                    fetched_total = one.fetched_total;
                    whole.push(
                        rig.first_output(&format!("whole-{rtt_ms}-{run}"), false)
                            .took,
                    );
                }
                let (lazy, whole) = (lazy.summary(), whole.summary());
                let read = size.read_bytes();
                first_rows.push(format!(
                    "| {} | {rtt_ms} ms | {} | {} | {} | {:.2}× | {} of {} |",
                    size.name,
                    human(lazy.p50),
                    human(whole.p50),
                    ratio(lazy.p50, whole.p50),
                    fetched_first as f64 / read as f64,
                    mib(fetched_total),
                    mib(blob_bytes)
                ));
            }
            if runs("cri") {
                let (mut lazy, mut whole) = (Samples::new(), Samples::new());
                let mut fetched_first = 0;
                for run in 0..size.runs {
                    let one = rig.cri_first_output(
                        &format!("cri-lazy-{rtt_ms}-{run}"),
                        &tag,
                        true,
                        &pause,
                    );
                    lazy.push(one.took);
                    fetched_first = one.fetched_first;
                    whole.push(
                        rig.cri_first_output(
                            &format!("cri-whole-{rtt_ms}-{run}"),
                            &tag,
                            false,
                            &pause,
                        )
                        .took,
                    );
                }
                let (lazy, whole) = (lazy.summary(), whole.summary());
                cri_rows.push(format!(
                    "| {} | {rtt_ms} ms | {} | {} | {} | {:.2}× |",
                    size.name,
                    human(lazy.p50),
                    human(whole.p50),
                    ratio(lazy.p50, whole.p50),
                    fetched_first as f64 / size.read_bytes() as f64,
                ));
            }
            if size.name != "~1 GB" && runs("cli") {
                read_rows.extend(rig.reads(rtt_ms));
            }
        }
    }
    println!("\n#### First output, lazy against a full pull\n");
    println!(
        "| image | added RTT | lazy p50 | full pull p50 | lazy / full | fetched before first output ÷ read | fetched in all (after completion) of the image's blobs |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &first_rows {
        println!("{row}");
    }
    println!("\n#### First output through CRI, remote snapshots against a full pull\n");
    println!(
        "| image | added RTT | lazy p50 | full pull p50 | lazy / full | fetched before first output ÷ read |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &cri_rows {
        println!("{row}");
    }
    println!("\n#### Reads through the rootfs\n");
    println!("| added RTT | what | sequential (MiB/s) | random 4 KiB (reads/s) |");
    println!("|---|---|---|---|");
    for row in &read_rows {
        println!("{row}");
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

impl Size {
    fn read_paths(&self) -> Vec<String> {
        (0..self.files)
            .step_by(self.read_every)
            .map(|n| format!("/data/f{n}"))
            .collect()
    }

    fn read_bytes(&self) -> u64 {
        (self.read_paths().len() * self.file_bytes) as u64
    }
}

/// `len` bytes no two images' files share (xorshift from `seed`): incompressible, as
/// most of a real image's bytes are once compressed.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Pushes busybox and the data layer of `size`, both eStargz, as `tag`.
fn push(registry: &Registry, dir: &Path, size: &Size, tag: &str) {
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX).unwrap();
    // As an eStargz optimizer orders them (`ctr-remote image optimize`): what the
    // container reads at start first, then the landmark, then the rest. All of
    // busybox's layer is read at start (its binary).
    let base = lamina_sample::base_layer_builder(&busybox)
        .and_then(|l| l.file(PREFETCH_LANDMARK, 0o644, &[0x0f]))
        .and_then(|l| l.finish())
        .unwrap();
    let read = size.read_paths();
    let file = |top: LayerBuilder, n: usize| {
        top.file(
            &format!("data/f{n}"),
            0o644,
            &noise(n as u64 + 1, size.file_bytes),
        )
        .unwrap()
    };
    let mut top = LayerBuilder::new().dir("data", 0o755).unwrap();
    for n in (0..size.files).filter(|n| read.contains(&format!("/data/f{n}"))) {
        top = file(top, n);
    }
    top = top.file(PREFETCH_LANDMARK, 0o644, &[0x0f]).unwrap();
    for n in (0..size.files).filter(|n| !read.contains(&format!("/data/f{n}"))) {
        top = file(top, n);
    }
    let top = top.finish().unwrap();
    let layers = [&base, &top]
        .iter()
        .map(|tar| {
            lamina_sample::estargz::estargz(tar, CHUNK)
                .unwrap()
                .stored(tar)
        })
        .collect();
    let image = lamina_sample::build_image_from(
        layers,
        &["PATH=/bin"],
        &["/bin/sh"],
        &lamina_image::Platform::host(),
    )
    .unwrap();
    let layout = dir.join(format!("layout-{}", size.files));
    lamina_sample::write_oci_layout(&layout, &[&image], &[(image.manifest.clone(), Some("v1"))])
        .unwrap();
    registry.push(&layout, "v1", tag);
    let _ = std::fs::remove_dir_all(&layout);
}

struct Rig<'a> {
    dir: &'a Path,
    proxy: &'a DelayProxy,
    reference: &'a str,
    size: Size,
}

struct FirstOutput {
    took: Duration,
    fetched_first: u64,
    fetched_total: u64,
}

impl Rig<'_> {
    fn store(&self, name: &str) -> PathBuf {
        self.dir.join(format!("store-{name}"))
    }

    /// `lamina create --strategy STRATEGY` of the image as `id` through the proxy; its
    /// rootfs.
    fn create(&self, lamina: &Lamina, strategy: &str, id: &str) -> PathBuf {
        let out = lamina.run(&[
            "--insecure-registry",
            &self.proxy.host,
            "create",
            "--strategy",
            strategy,
            self.reference,
            id,
        ]);
        assert_eq!(out.code, 0, "{out:?}");
        lamina.rootfs(id)
    }

    /// Creates from a fresh store and runs the container until its first line.
    fn first_output(&self, name: &str, lazy: bool) -> FirstOutput {
        let store = self.store(name);
        let lamina = Lamina::init(&store);
        let before = self.proxy.fetched();
        let started = Instant::now();
        let rootfs = self.create(&lamina, if lazy { "lazy" } else { "classic" }, "bench");
        let script = format!(
            "cat {} > /dev/null && echo ready",
            self.size.read_paths().join(" ")
        );
        let booted = Bundle::new(&rootfs, false).run(&format!("lazy-bench-{name}"), &script);
        let took = started.elapsed();
        assert_eq!(booted.stdout, "ready\n", "{booted:?}");
        let fetched_first = self.proxy.fetched() - before;
        if lazy {
            lamina_integration::wait_until("background completion", || {
                lamina.entries("layers") == 2
            });
        }
        let fetched_total = self.proxy.fetched() - before;
        let out = lamina.run(&["delete", "bench"]);
        assert_eq!(out.code, 0, "{out:?}");
        drop_store(&store);
        FirstOutput {
            took,
            fetched_first,
            fetched_total,
        }
    }

    /// Starts a fresh containerd 2.4 node on lamina (serving remote snapshots if `lazy`),
    /// then times `crictl pull` of `tag`, a pod and its container up to the container's
    /// first line, which it writes after reading what the CLI runs read.
    fn cri_first_output(&self, name: &str, tag: &str, lazy: bool, pause: &Path) -> FirstOutput {
        use lamina_integration::cri::{Node, NodeSnapshotter, container_config, pod_config};
        use lamina_integration::snapshotter::Daemon;
        let dir = self.dir.join(name);
        let store = dir.join("store");
        let socket = dir.join("lamina.sock");
        let host = &self.proxy.host;
        std::fs::create_dir_all(&dir).unwrap();
        let (daemon, snapshotter) = if lazy {
            let flags = ["--remote-snapshots", host, "--insecure-registry", host];
            let daemon = Daemon::start(&store, &socket, &flags);
            let snapshotter = NodeSnapshotter::LaminaRemote {
                socket: daemon.socket.clone(),
                store: store.clone(),
            };
            (daemon, snapshotter)
        } else {
            let daemon = Daemon::start(&store, &socket, &[]);
            let snapshotter = NodeSnapshotter::Lamina {
                socket: daemon.socket.clone(),
                store: store.clone(),
                capabilities: Vec::new(),
            };
            (daemon, snapshotter)
        };
        let node = Node::start(&dir.join("containerd"), snapshotter, pause);
        node.trust_registry(host);
        let image = format!("{host}/{tag}");
        let logs = dir.join("logs");
        let pod = pod_config(name, &logs, None);
        let script = format!(
            "cat {} > /dev/null && echo ready; sleep 300",
            self.size.read_paths().join(" ")
        );
        let container = container_config("main", &image, &script, &pod);
        let before = self.proxy.fetched();
        let started = Instant::now();
        node.crictl_ok(&["pull", &image]);
        let pod_id = node.run_pod(&pod);
        node.start_container(&pod_id, &pod, &container);
        let log = logs.join("main.log");
        let deadline = started + Duration::from_secs(300);
        while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("ready")) {
            assert!(Instant::now() < deadline, "no output from {name}");
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = started.elapsed();
        let fetched_first = self.proxy.fetched() - before;
        node.remove_pod(&pod_id);
        drop(node);
        drop(daemon);
        drop_store(&store);
        // containerd's content store holds the full pull's blobs.
        let _ = std::fs::remove_dir_all(&dir);
        FirstOutput {
            took,
            fetched_first,
            fetched_total: 0,
        }
    }

    /// The read rows at `rtt_ms`.
    fn reads(&self, rtt_ms: u64) -> Vec<String> {
        let store = self.store(&format!("reads-{rtt_ms}"));
        let lamina = Lamina::init(&store);
        let create = |strategy: &str, id: &str| self.create(&lamina, strategy, id);
        let (seq_file, random_file) = ("data/f1", "data/f2");
        let lazy = create("lazy", "lazy");
        // The median of five passes, the page cache dropped before each but the first
        // (while data is missing, a pass reads what the one before fetched).
        let row = |what: &str, rootfs: &Path, passes: usize| {
            let mut seq = Vec::new();
            let mut rnd = Vec::new();
            for pass in 0..passes {
                if pass > 0 || passes > 1 {
                    drop_caches();
                }
                seq.push(sequential(&rootfs.join(seq_file)));
                rnd.push(random(&rootfs.join(random_file)));
            }
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            format!(
                "| {rtt_ms} ms | {what} | {:.0} | {:.0} |",
                median(seq),
                median(rnd)
            )
        };
        let mut rows = vec![row("lazy, data missing (one pass)", &lazy, 1)];
        rows.push(row(
            "lazy, its chunks present (page cache dropped)",
            &lazy,
            5,
        ));
        lamina_integration::wait_until("background completion", || lamina.entries("layers") == 2);
        let after = create("lazy", "after");
        let classic = create("classic", "classic");
        rows.push(row(
            "lazy after completion: ordinary layers (page cache dropped)",
            &after,
            5,
        ));
        rows.push(row(
            "classic, the same layers (page cache dropped)",
            &classic,
            5,
        ));
        for id in ["lazy", "after", "classic"] {
            assert_eq!(lamina.run(&["delete", id]).code, 0);
        }
        drop_store(&store);
        rows
    }
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// MiB/s reading `path` whole.
fn sequential(path: &Path) -> f64 {
    let started = Instant::now();
    let bytes = std::fs::read(path).unwrap();
    bytes.len() as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64()
}

/// 4 KiB reads per second at 256 offsets of `path`, spread by a fixed stride.
fn random(path: &Path) -> f64 {
    let mut file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let blocks = (len / 4096).max(1);
    let mut buf = vec![0u8; 4096];
    let started = Instant::now();
    for n in 0..256u64 {
        let block = (n * 7919) % blocks;
        file.seek(SeekFrom::Start(block * 4096)).unwrap();
        let _ = file.read(&mut buf).unwrap();
    }
    256.0 / started.elapsed().as_secs_f64()
}

/// Removes a bench store: its daemon stopped, every mount under it gone.
fn drop_store(store: &Path) {
    lamina_integration::lazy_image::kill_daemons(store);
    for mount in lamina_integration::scratch::mounts_under(store) {
        let _ = rustix::mount::unmount(&mount, rustix::mount::UnmountFlags::DETACH);
    }
    let _ = std::fs::remove_dir_all(store);
}
