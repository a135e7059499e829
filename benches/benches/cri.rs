//! lamina as a Kubernetes node's snapshotter on containerd 2.4 (its CRI plugin, driven by
//! crictl as the kubelet drives it), against containerd's overlayfs in the same run, on
//! the same loop-backed ext4 (issue 38):
//!
//! - pod start (RunPodSandbox, CreateContainer, StartContainer) of an image of many
//!   files, with and without a user namespace of the pod's own: lamina (`remap-ids`,
//!   idmapped layers), containerd's built-in overlayfs (idmapped mounts), and that
//!   overlayfs served as a proxy listing no capabilities, whose images containerd chowns
//!   a copy of for each pod's mapping (`overlayfs-proxy`; where Go can build it);
//! - pulling and unpacking a 20-layer and a 100-layer image from a local registry through
//!   CRI, serially (`max_concurrent_unpacks` 1) and in parallel (4; lamina with
//!   `rebase`), each pull after the image and its content were removed;
//! - `Usage` of every active snapshot, as CRI's snapshot syncer asks it every 10 s, with
//!   50 and 500 active snapshots that each wrote files, through containerd's snapshots
//!   API: the first sweep and the next ones.
//!
//! Prints its tables as markdown (docs/benchmarks.md, "A Kubernetes node on containerd
//! 2.4"). `cargo bench -p lamina-benches --bench cri [-- --only pods|pulls|usage]`;
//! under `cargo test` it runs at tiny sizes, to prove it still runs. Needs root and
//! `LAMINA_CONTAINERD2_BIN` (`scripts/containerd2`).

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use lamina_benches::containerd_rig::{OVERLAY_PROXY, mount_all, top_layer};
use lamina_benches::overlay_proxy::OverlayProxy;
use lamina_benches::stats::{Samples, human, ratio};
use lamina_integration::cri::{self, Node, NodeSnapshotter, Pulls, container_config, pod_config};
use lamina_integration::registry::Registry;
use lamina_integration::snapshotter::{Api, Daemon};
use lamina_integration::{ScratchFs, require_root};
use lamina_sample::{Layer, LayerBuilder};
use rustix::mount::UnmountFlags;

struct Sizes {
    pods: usize,
    files: usize,
    layer_counts: Vec<usize>,
    pulls: usize,
    usage_snapshots: Vec<usize>,
    usage_files: usize,
    sweeps: usize,
}

fn main() {
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            pods: 15,
            files: 4000,
            layer_counts: vec![20, 100],
            pulls: 3,
            usage_snapshots: vec![50, 500],
            usage_files: 200,
            sweeps: 5,
        }
    } else {
        Sizes {
            pods: 2,
            files: 20,
            layer_counts: vec![3],
            pulls: 1,
            usage_snapshots: vec![3],
            usage_files: 5,
            sweeps: 2,
        }
    };
    // `--only pods|pulls|usage` runs one table.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let runs = |table: &str| only.as_deref().is_none_or(|o| o == table);
    let fs = ScratchFs::ext4(if full { 12 * 1024 } else { 2048 });
    if runs("pods") {
        pod_start(&fs, &sizes);
    }
    if runs("pulls") {
        pulls(&fs, &sizes);
    }
    if runs("usage") {
        usage(&fs, &sizes);
    }
}

/// A lamina daemon on `fs` (its store under `name`), for a node.
fn lamina(
    fs: &ScratchFs,
    name: &str,
    capabilities: Vec<&'static str>,
) -> (Daemon, NodeSnapshotter) {
    let store = fs.path().join(format!("store-{name}"));
    let daemon = Daemon::start(&store, &fs.path().join(format!("lamina-{name}.sock")), &[]);
    let snapshotter = NodeSnapshotter::Lamina {
        socket: daemon.socket.clone(),
        store,
        capabilities,
    };
    (daemon, snapshotter)
}

/// The sample's busybox layer and one of `files` small files, as a docker archive.
fn files_image(dir: &Path, files: usize) -> std::path::PathBuf {
    let mut layer = LayerBuilder::new();
    for d in 0..files.div_ceil(200) {
        layer = layer.dir(&format!("pkg{d}"), 0o755).unwrap();
        for f in 0..200.min(files - d * 200) {
            let data = format!("module {d}.{f}\n").repeat(40);
            layer = layer
                .file(&format!("pkg{d}/mod{f}.py"), 0o644, data.as_bytes())
                .unwrap();
        }
    }
    let image = on_busybox(vec![layer.finish().unwrap()]);
    let path = dir.join("files.docker.tar");
    lamina_sample::write_docker_archive(&image, "lamina.test/files:1", &path).unwrap();
    path
}

/// An image of the sample's busybox layer and `tars` above it, every layer gzip, its
/// command a shell.
fn on_busybox(tars: Vec<Vec<u8>>) -> lamina_sample::BuiltImage {
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX).unwrap();
    let layers: Vec<Layer> = std::iter::once(lamina_sample::base_layer(&busybox).unwrap())
        .chain(tars)
        .map(|tar| Layer {
            tar,
            compression: lamina_image::Compression::Gzip,
        })
        .collect();
    lamina_sample::build_image_with_cmd(
        &layers,
        &["PATH=/bin"],
        &["/bin/sh"],
        &lamina_image::Platform::host(),
    )
    .unwrap()
}

/// Pod start times on `node`: `n` pods, each in a user namespace of its own when
/// `userns` (a distinct host range per pod, as the kubelet gives them).
fn start_pods(node: &Node, logs: &Path, n: usize, userns: bool, first_range: u32) -> Samples {
    let mut samples = Samples::new();
    for i in 0..n {
        let host = userns.then(|| (first_range + i as u32) * 65536);
        let name = format!("p{}{i}", if userns { "u" } else { "h" });
        let pod = pod_config(&name, logs, host);
        let container = container_config("main", "lamina.test/files:1", "sleep 300", &pod);
        let started = Instant::now();
        let pod_id = node.run_pod(&pod);
        node.start_container(&pod_id, &pod, &container);
        samples.push(started.elapsed());
        node.remove_pod(&pod_id);
    }
    samples
}

fn pod_start(fs: &ScratchFs, sizes: &Sizes) {
    let images = fs.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let pause = cri::pause_image(&images);
    let image = files_image(&images, sizes.files);
    let mut rows = Vec::new();
    let mut measure = |label: &str, snapshotter: NodeSnapshotter| {
        let dir = fs.path().join(format!("node-{}", rows.len()));
        let node = Node::start(&dir, snapshotter, &pause);
        node.import(&image);
        let logs = dir.join("pod-logs");
        // One pod first, untimed: the first start pays containerd's own warm-up.
        start_pods(&node, &logs, 1, false, 0);
        let host = start_pods(&node, &logs, sizes.pods, false, 0).summary();
        let userns = start_pods(&node, &logs, sizes.pods, true, 2).summary();
        eprintln!("pod start on {label}: {host:?} / userns {userns:?}");
        rows.push((label.to_string(), host, userns));
    };
    {
        let (_daemon, lamina) = lamina(fs, "pods", vec!["remap-ids"]);
        measure("lamina (remap-ids)", lamina);
    }
    measure("overlayfs (idmapped mounts)", NodeSnapshotter::Overlayfs);
    let bin = fs.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    if let Some(proxy) = OverlayProxy::start(
        &bin,
        &fs.path().join("overlay-proxy"),
        &fs.path().join("overlay-proxy.sock"),
    ) {
        measure(
            "overlayfs-proxy (no remap-ids: chowned copies)",
            NodeSnapshotter::OtherProxy {
                name: OVERLAY_PROXY,
                socket: proxy.socket.clone(),
            },
        );
    }
    println!(
        "\n#### Pod start, image of {} files (p50 of {} pods; RunPodSandbox to StartContainer)\n",
        sizes.files, sizes.pods
    );
    println!("| snapshotter | host user namespace | pod user namespace | vs lamina (userns) |");
    println!("|---|---|---|---|");
    let lamina_userns = rows[0].2.p50;
    for (label, host, userns) in &rows {
        println!(
            "| {label} | {} | {} | {} |",
            human(host.p50),
            human(userns.p50),
            ratio(userns.p50, lamina_userns)
        );
    }
}

/// An image of `count` layers, each adding a directory of 20 files of 4 KiB, on the
/// sample's busybox layer, as an OCI layout under `dir`.
fn layered_image(dir: &Path, count: usize) -> std::path::PathBuf {
    let mut layers = Vec::new();
    for l in 1..count {
        let mut layer = LayerBuilder::new().dir(&format!("l{l}"), 0o755).unwrap();
        for f in 0..20 {
            let data = format!("layer {l} file {f}\n").repeat(400);
            layer = layer
                .file(&format!("l{l}/f{f}"), 0o644, &data.as_bytes()[..4096])
                .unwrap();
        }
        layers.push(layer.finish().unwrap());
    }
    let image = on_busybox(layers);
    let layout = dir.join(format!("layers-{count}"));
    lamina_sample::write_oci_layout(
        &layout,
        &[&image],
        &[(image.manifest.clone(), Some("latest"))],
    )
    .unwrap();
    layout
}

fn pulls(fs: &ScratchFs, sizes: &Sizes) {
    let images = fs.path().join("pull-images");
    std::fs::create_dir_all(&images).unwrap();
    let registry = Registry::start(&fs.path().join("registry"), None);
    for &count in &sizes.layer_counts {
        let layout = layered_image(&images, count);
        registry.push(&layout, "latest", &format!("lamina/layers{count}:latest"));
    }
    let pause = cri::pause_image(&fs.path().join("images"));
    let mut rows: Vec<(usize, String, Duration)> = Vec::new();
    for (mode, unpacks) in [("serial", None), ("parallel (4)", Some(4))] {
        let pulls_config = Pulls {
            downloads: 3,
            unpacks,
        };
        let contenders: Vec<(&str, Option<Vec<&'static str>>)> =
            vec![("lamina", Some(vec!["rebase"])), ("overlayfs", None)];
        for (label, lamina_caps) in contenders {
            let dir = fs
                .path()
                .join(format!("pull-{label}-{}", unpacks.unwrap_or(1)));
            let (daemon, snapshotter) = match lamina_caps {
                Some(caps) => {
                    let (daemon, snapshotter) =
                        lamina(fs, &format!("pull{}", unpacks.unwrap_or(1)), caps);
                    (Some(daemon), snapshotter)
                }
                None => (None, NodeSnapshotter::Overlayfs),
            };
            let node = Node::start_with(&dir, snapshotter, &pause, pulls_config);
            node.trust_registry(&registry.host);
            let baseline = node.snapshot_kinds().len();
            for &count in &sizes.layer_counts {
                let image = format!("{}/lamina/layers{count}:latest", registry.host);
                let mut samples = Samples::new();
                for _ in 0..sizes.pulls {
                    let started = Instant::now();
                    node.crictl_ok(&["pull", &image]);
                    samples.push(started.elapsed());
                    node.crictl_ok(&["rmi", &image]);
                    lamina_integration::wait_until("the image's snapshots to go", || {
                        node.snapshot_kinds().len() == baseline
                    });
                    if let Some(daemon) = &daemon {
                        // containerd's GC also calls Cleanup: lamina's layers go, so the
                        // next pull unpacks every layer again.
                        let layers = daemon.store.join("layers");
                        lamina_integration::wait_until("lamina's layers to go", || {
                            std::fs::read_dir(&layers).unwrap().count() <= baseline
                        });
                    }
                }
                let p50 = samples.summary().p50;
                eprintln!("pull {count} layers, {label}, {mode}: {p50:?}");
                rows.push((count, format!("{label}, {mode}"), p50));
            }
            drop(node);
            drop(daemon);
        }
    }
    println!(
        "\n#### Pull and unpack through CRI, local registry (p50 of {} pulls)\n",
        sizes.pulls
    );
    println!("| layers | snapshotter, unpack | time | vs overlayfs, same mode |");
    println!("|---|---|---|---|");
    for (count, label, p50) in &rows {
        let mode = label.split_once(", ").unwrap().1;
        let base = rows
            .iter()
            .find(|(c, l, _)| c == count && l == &format!("overlayfs, {mode}"))
            .unwrap()
            .2;
        println!(
            "| {count} | {label} | {} | {} |",
            human(*p50),
            ratio(*p50, base)
        );
    }
}

fn usage(fs: &ScratchFs, sizes: &Sizes) {
    let pause = cri::pause_image(&fs.path().join("images"));
    let sample = lamina_integration::sample_image(&fs.path().join("usage-image"));
    let mut rows = Vec::new();
    for &n in &sizes.usage_snapshots {
        for label in ["lamina", "overlayfs"] {
            let dir = fs.path().join(format!("usage-{label}-{n}"));
            let (daemon, snapshotter) = match label {
                "lamina" => {
                    let (d, s) = lamina(fs, &format!("usage{n}"), vec![]);
                    (Some(d), s)
                }
                _ => (None, NodeSnapshotter::Overlayfs),
            };
            let node = Node::start(&dir, snapshotter, &pause);
            node.containerd.ctr_ok(&[
                "-n",
                "usage",
                "images",
                "import",
                "--snapshotter",
                label,
                "--base-name",
                "docker.io/lamina/sample",
                sample.oci_archive.to_str().unwrap(),
            ]);
            let api = Api::via_containerd(&node.containerd.socket, label, "usage");
            let top = top_layer(&api);
            let target = dir.join("mnt");
            std::fs::create_dir_all(&target).unwrap();
            for i in 0..n {
                let key = format!("u{i}");
                // A root for containerd's GC: made outside a lease, it would be collected.
                let root =
                    lamina_integration::snapshotter::labels(&[("containerd.io/gc.root", "bench")]);
                let mounts = api.prepare(&key, &top, root).unwrap();
                mount_all(&mounts, &target);
                for f in 0..sizes.usage_files {
                    std::fs::write(target.join(format!("w{f}")), b"written by a container\n")
                        .unwrap();
                }
                rustix::mount::unmount(&target, UnmountFlags::empty()).unwrap();
            }
            let mut sweeps = Vec::new();
            for _ in 0..sizes.sweeps {
                let started = Instant::now();
                for i in 0..n {
                    api.usage(&format!("u{i}")).unwrap();
                }
                sweeps.push(started.elapsed());
            }
            let later: Samples = sweeps[1..].iter().copied().collect();
            eprintln!(
                "usage {label} {n}: first {:?}, then {:?}",
                sweeps[0],
                later.summary()
            );
            rows.push((n, label, sweeps[0], later.summary().p50));
            for i in 0..n {
                api.remove(&format!("u{i}")).unwrap();
            }
            drop(node);
            drop(daemon);
        }
    }
    println!(
        "\n#### Usage of every active snapshot, each having written {} files (one sweep, as CRI's syncer makes every 10 s)\n",
        sizes.usage_files
    );
    println!(
        "| active snapshots | snapshotter | first sweep | later sweeps (p50) | later vs overlayfs |"
    );
    println!("|---|---|---|---|---|");
    for (n, label, first, later) in &rows {
        let base = rows
            .iter()
            .find(|(m, l, _, _)| m == n && *l == "overlayfs")
            .unwrap()
            .3;
        println!(
            "| {n} | {label} | {} | {} | {} |",
            human(*first),
            human(*later),
            ratio(*later, base)
        );
    }
}
