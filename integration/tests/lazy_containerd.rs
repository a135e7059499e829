//! containerd's remote-snapshot protocol against a real registry and containerd 2.4: with
//! `lamina daemon --remote-snapshots` and containerd passing the remote-snapshot labels,
//! `ctr image pull` (2.4) and a CRI pull (2.4, 1.6) commit each indexed layer as a lazy snapshot without
//! downloading it — containerd's content store never holds a layer blob — and `ctr run`
//! and a CRI pod boot from it, reading files spread across both layers.

#![allow(clippy::unwrap_used)]

use lamina_image::Digest;
use lamina_integration::containerd::{Containerd, Proxy, Release};
use lamina_integration::cri::{self, Node, NodeSnapshotter, Pulls, container_config, pod_config};
use lamina_integration::lazy_image::{Format, big, data, push_image, push_tars, tars};
use lamina_integration::registry::Registry;
use lamina_integration::snapshotter::Daemon;
use lamina_integration::{ScratchFs, require_root};

/// What the container prints: files of the data layer, read through busybox's.
const SCRIPT: &str = "cat /data/small && sha256sum /data/big /data/f3";
/// The data layer's whiteout of `/etc/hosts`, honoured (CRI binds a hosts file of its
/// own there, so only `ctr run` shows it).
const WHITEOUT: &str = "test ! -e /etc/hosts && echo whiteout";

fn expected() -> String {
    let sum = |bytes: &[u8], path: &str| format!("{}  {path}\n", Digest::of(bytes).hex());
    format!(
        "small\n{}{}",
        sum(&big(), "/data/big"),
        sum(&data(3, 128), "/data/f3")
    )
}

/// The layer blob digests of `repo_tag`'s manifest.
fn layer_digests(registry: &Registry, repo_tag: &str) -> Vec<String> {
    let manifest: serde_json::Value = serde_json::from_slice(&registry.manifest(repo_tag)).unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// `lamina daemon --remote-snapshots` on `fs`'s store for the repositories under
/// `lazy/` and `plain/` of `registry`, pulled from over HTTP.
fn remote_daemon(fs: &ScratchFs, registry: &Registry) -> Daemon {
    let sources = format!("{0}/lazy,{0}/plain", registry.host);
    Daemon::start(
        &fs.path().join("store"),
        &fs.path().join("lamina.sock"),
        &[
            "--remote-snapshots",
            &sources,
            "--insecure-registry",
            &registry.host,
            "--log-level",
            "info",
        ],
    )
}

/// What the daemon's log and containerd's content store show of a pull of `repo_tag`:
/// `lazy` layers committed lazily, and no layer blob downloaded.
fn assert_pulled_lazily(
    daemon: &Daemon,
    content: &str,
    registry: &Registry,
    repo_tag: &str,
    lazy: usize,
) {
    assert_eq!(served_lazily(daemon), lazy, "{}", daemon.log());
    let held = held(content);
    for layer in layer_digests(registry, repo_tag) {
        assert!(
            !held.contains(&layer.as_str()),
            "containerd downloaded layer {layer}:\n{content}"
        );
    }
}

/// Layers the daemon has served lazily so far, by its log.
fn served_lazily(daemon: &Daemon) -> usize {
    daemon
        .log()
        .matches("remote snapshot: layer served lazily")
        .count()
}

/// The blobs `ctr content ls` printed (`content`) says containerd holds: its first
/// column (a manifest's own labels name its layers too).
fn held(content: &str) -> Vec<&str> {
    content
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// That containerd downloaded every layer blob of `repo_tag` (it unpacked them itself).
fn assert_downloaded(ctd: &Containerd, registry: &Registry, repo_tag: &str) {
    let content = ctd.ctr_ok(&["content", "ls"]);
    let held = held(&content);
    for layer in layer_digests(registry, repo_tag) {
        assert!(
            held.contains(&layer.as_str()),
            "{layer} not downloaded: {content}"
        );
    }
}

/// [`remote_daemon`] and containerd 2.4 with it as its `lamina` proxy, passing it the
/// remote-snapshot labels.
fn ctr_node(fs: &ScratchFs, registry: &Registry) -> (Daemon, Containerd) {
    let daemon = remote_daemon(fs, registry);
    let store = fs.path().join("store");
    let proxy = Proxy {
        name: "lamina",
        socket: &daemon.socket,
        capabilities: &[],
        exports_root: Some(&store),
        remote_snapshots: true,
    };
    let ctd =
        Containerd::start_configured(Release::V2, &fs.path().join("containerd"), &[proxy], None);
    (daemon, ctd)
}

/// `ctr image pull` of `repo_tag` from `registry` into lamina; the image's name.
fn pull(ctd: &Containerd, registry: &Registry, repo_tag: &str) -> String {
    let image = format!("{}/{repo_tag}", registry.host);
    ctd.ctr_ok(&[
        "image",
        "pull",
        "--plain-http",
        "--snapshotter",
        "lamina",
        &image,
    ]);
    image
}

#[test]
fn ctr_pulls_without_downloading_layers_and_runs_from_lazy_snapshots() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/ctr:1");
    let (daemon, ctd) = ctr_node(&fs, &registry);
    let store = fs.path().join("store");
    let image = pull(&ctd, &registry, "lazy/ctr:1");
    let content = ctd.ctr_ok(&["content", "ls"]);
    assert_pulled_lazily(&daemon, &content, &registry, "lazy/ctr:1", 2);
    // Snapshots of lazy layers are the store's own.
    let check = lamina_integration::Lamina::new(&store).run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
    let snapshots = ctd.ctr_ok(&[
        "snapshot",
        "--snapshotter",
        "lamina",
        "info",
        &top_snapshot(&ctd),
    ]);
    assert!(
        snapshots.contains("containerd.io/snapshot/remote"),
        "{snapshots}"
    );
    // Usage counts what was fetched: nothing of the data layer's ~800 KiB of files yet
    // (unless background completion made it an ordinary layer meanwhile).
    let top = top_snapshot(&ctd);
    let usage = ctd.ctr_ok(&["snapshot", "--snapshotter", "lamina", "usage", &top]);
    let completed = std::fs::read_dir(store.join("layers")).unwrap().count() == 2;
    let bytes = usage_bytes(&usage);
    assert!(completed || bytes < 200.0 * 1024.0, "{usage}");

    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "lamina",
        &image,
        "lazy-ctr",
        "sh",
        "-c",
        &format!("{SCRIPT} && {WHITEOUT}"),
    ]);
    assert_eq!(out, format!("{}whiteout\n", expected()));
    ctd.ctr_ok(&["image", "rm", &image]);

    // An image without indexes is downloaded and unpacked by containerd, as always.
    let files = lamina_integration::sample_image(&fs.path().join("sample"));
    registry.push(
        &files.oci_layout,
        lamina_sample::SAMPLE_REF,
        "plain/sample:1",
    );
    let plain = pull(&ctd, &registry, "plain/sample:1");
    assert_downloaded(&ctd, &registry, "plain/sample:1");
    assert_eq!(
        served_lazily(&daemon),
        2,
        "no layer of the plain image is lazy"
    );
    let proof = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "lamina",
        &plain,
        "plain-ctr",
        "sh",
        "-c",
        lamina_integration::proof::SCRIPT,
    ]);
    assert_eq!(proof, lamina_integration::proof::EXPECTED);

    // An indexed image from a repository remote snapshots may not come from is
    // downloaded and unpacked by containerd too.
    let tar = lamina_sample::LayerBuilder::new()
        .file("other.txt", 0o644, b"other\n")
        .and_then(|l| l.finish())
        .unwrap();
    push_tars(
        &registry,
        fs.path(),
        Format::Estargz,
        "other/ctr:1",
        &[tar],
        |_| {},
    );
    pull(&ctd, &registry, "other/ctr:1");
    assert_downloaded(&ctd, &registry, "other/ctr:1");
    assert!(
        daemon
            .log()
            .contains("not from a registry remote snapshots may come from")
    );
    assert_eq!(served_lazily(&daemon), 2);
}

/// The top layer's committed snapshot (the one whose parent is a chain ID) of the only
/// image pulled.
fn top_snapshot(ctd: &Containerd) -> String {
    let out = ctd.ctr_ok(&["snapshot", "--snapshotter", "lamina", "ls"]);
    out.lines()
        .skip(1)
        .find_map(|l| {
            let mut cols = l.split_whitespace();
            let (key, parent) = (cols.next()?, cols.next()?);
            parent.starts_with("sha256:").then(|| key.to_string())
        })
        .unwrap_or_else(|| panic!("no top layer snapshot: {out}"))
}

/// The bytes `ctr snapshot usage` prints (`KEY SIZE INODES`, SIZE as `812.0 KiB`).
fn usage_bytes(usage: &str) -> f64 {
    let line = usage.lines().nth(1).unwrap_or_default();
    let cols: Vec<&str> = line.split_whitespace().collect();
    let number: f64 = cols.get(1).and_then(|n| n.parse().ok()).unwrap_or(f64::MAX);
    let unit = match cols.get(2).copied().unwrap_or_default() {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        _ => f64::MAX,
    };
    number * unit
}

#[test]
fn a_cri_pod_starts_from_an_image_whose_layers_were_never_downloaded_on_containerd_2_4() {
    cri_pod_starts_lazily(Release::V2);
}

#[test]
fn a_cri_pod_starts_from_an_image_whose_layers_were_never_downloaded_on_containerd_1_6() {
    cri_pod_starts_lazily(Release::Debian);
}

fn cri_pod_starts_lazily(release: Release) {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::ZstdChunked, "lazy/cri:1");
    let daemon = remote_daemon(&fs, &registry);
    let pause = cri::pause_image(&fs.path().join("images"));
    let node = Node::start_release(
        release,
        &fs.path().join("containerd"),
        NodeSnapshotter::LaminaRemote {
            socket: daemon.socket.clone(),
            store: fs.path().join("store"),
        },
        &pause,
        Pulls::default(),
    );
    node.trust_registry(&registry.host);
    let image = format!("{}/lazy/cri:1", registry.host);
    node.crictl_ok(&["pull", &image]);
    let content = node
        .containerd
        .ctr_ok(&["--namespace", "k8s.io", "content", "ls"]);
    // The busybox layer is the pause image's too, already unpacked: the data layer
    // alone is lazy.
    assert_pulled_lazily(&daemon, &content, &registry, "lazy/cri:1", 1);

    let pod = pod_config("lazy", &fs.path().join("pod-logs"), None);
    let pod_id = node.run_pod(&pod);
    let script = format!("{SCRIPT} && echo done; sleep 300");
    let id = node.start_container(
        &pod_id,
        &pod,
        &container_config("main", &image, &script, &pod),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut logs = node.crictl(&["logs", &id]);
    while !logs.stdout.contains("done") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        logs = node.crictl(&["logs", &id]);
    }
    assert_eq!(
        logs.stdout,
        format!("{}done\n", expected()),
        "{logs:?}\n{}",
        node.crictl(&["ps", "-a"]).stdout
    );
    node.remove_pod(&pod_id);
    node.crictl_ok(&["rmi", &image]);
}

#[test]
fn a_layer_without_an_index_unpacks_over_a_lazy_one_and_a_commit_over_it_keeps_its_data() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let registry = Registry::start(&fs.path().join("registry"), None);
    // busybox's layer lazy, the data layer without its index: containerd unpacks it onto
    // the lazy one.
    let seen = std::cell::Cell::new(0);
    push_tars(
        &registry,
        fs.path(),
        Format::Estargz,
        "lazy/mixed:1",
        &tars(),
        |layer| {
            if seen.replace(seen.get() + 1) == 1 {
                layer.annotations.clear();
            }
        },
    );
    let (daemon, ctd) = ctr_node(&fs, &registry);
    let image = pull(&ctd, &registry, "lazy/mixed:1");
    assert_eq!(served_lazily(&daemon), 1, "{}", daemon.log());
    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "lamina",
        &image,
        "lazy-mixed",
        "sh",
        "-c",
        &format!("{SCRIPT} && {WHITEOUT}"),
    ]);
    assert_eq!(out, format!("{}whiteout\n", expected()));

    // A chmod of a lazy file copies up its metadata only; the commit fills its data in
    // from the lazy layer's objects, and a view of the commit reads it whole.
    let top = top_snapshot(&ctd);
    let snapshot = |args: &[&str]| {
        let mut all = vec!["snapshot", "--snapshotter", "lamina"];
        all.extend_from_slice(args);
        ctd.ctr_ok(&all)
    };
    let rootfs = |mounts: &str| {
        let source = mounts
            .split_whitespace()
            .skip_while(|w| *w != "bind")
            .nth(1)
            .unwrap_or_else(|| panic!("a bind: {mounts}"))
            .to_string();
        std::path::PathBuf::from(source)
    };
    snapshot(&["prepare", "work", &top]);
    let work = rootfs(&snapshot(&["mounts", "/mnt", "work"]));
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let chmod = std::process::Command::new("chmod")
        .arg("0700")
        .arg(work.join("bin/busybox"))
        .status()
        .unwrap();
    assert!(chmod.success());
    snapshot(&["commit", "done", "work"]);
    // ctr labels what it prepares and commits as a collector root, not what it views:
    // containerd may collect the view (the commit's removal of `work` starts a collection)
    // until it is labelled, so a view found gone before its label is made again.
    let labelled = (0..5).any(|_| {
        snapshot(&["view", "seen", "done"]);
        let label = ["snapshot", "--snapshotter", "lamina", "label", "seen"];
        ctd.ctr(&[&label[..], &["containerd.io/gc.root=test"]].concat())
            .code
            == 0
    });
    assert!(labelled, "the view was collected five times over");
    let view = rootfs(&snapshot(&["mounts", "/mnt", "seen"]));
    let meta = std::fs::metadata(view.join("bin/busybox")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    assert!(
        std::fs::read(view.join("bin/busybox")).unwrap() == busybox,
        "the committed busybox is busybox"
    );
    for key in ["seen", "done"] {
        snapshot(&["rm", key]);
    }
    ctd.ctr_ok(&["image", "rm", &image]);
}

#[test]
fn mounts_of_a_lazy_snapshot_are_refused_once_its_server_restarted() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/restart:1");
    let (mut daemon, ctd) = ctr_node(&fs, &registry);
    pull(&ctd, &registry, "lazy/restart:1");
    let top = top_snapshot(&ctd);
    let snapshot = |args: &[&str]| {
        let mut all = vec!["snapshot", "--snapshotter", "lamina"];
        all.extend_from_slice(args);
        ctd.ctr(&all)
    };
    assert_eq!(snapshot(&["prepare", "work", &top]).code, 0);
    let before = snapshot(&["mounts", "/mnt", "work"]);
    assert_eq!(before.code, 0, "{before:?}");

    // The daemon, and with it the server of the lazy layers, dies and starts again: the
    // snapshot's overlay still holds the dead server's mount, and Mounts says so rather
    // than handing containerd a rootfs whose unfetched reads fail.
    daemon.crash_and_restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let refused = loop {
        let out = snapshot(&["mounts", "/mnt", "work"]);
        if out.code != 0 && out.stderr.contains("restarted") {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Mounts did not refuse the stale overlay: {out:?}\n{}",
            daemon.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        refused.stderr.contains("unmount and mount it again"),
        "{refused:?}"
    );
    // A new snapshot is served by the new server.
    assert_eq!(snapshot(&["prepare", "fresh", &top]).code, 0);
    let fresh = snapshot(&["mounts", "/mnt", "fresh"]);
    assert_eq!(fresh.code, 0, "{fresh:?}");
    for key in ["fresh", "work"] {
        snapshot(&["rm", key]);
    }
}
