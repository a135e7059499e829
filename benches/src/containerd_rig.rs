//! What the containerd benchmarks share: one containerd serving its built-in `overlayfs`
//! snapshotter and lamina (a `lamina daemon` as proxy snapshotter) on one scratch
//! filesystem, the sample image imported into both, and the shim's way of mounting what a
//! snapshotter answers.

use std::path::Path;

use crate::overlay_proxy::OverlayProxy;
use lamina_integration::containerd::Containerd;
use lamina_integration::snapshotter::{Api, Daemon};
use lamina_integration::{ScratchFs, sample_image};
use lamina_snapshotter::proto::containerd::types::Mount;
use rustix::mount::MountFlags;

/// The image both snapshotters have.
pub const IMAGE: &str = "docker.io/lamina/sample:latest";

/// A lamina daemon and a containerd using it, on `fs`, with the sample image imported
/// into both snapshotters under `namespace`.
pub fn start(fs: &ScratchFs, namespace: &str) -> (Daemon, Containerd) {
    let daemon = start_daemon(fs);
    let ctd = Containerd::start(&fs.path().join("containerd"), &daemon.socket);
    import_sample(fs, &ctd, namespace, &["overlayfs", "lamina"]);
    (daemon, ctd)
}

/// The name containerd knows [`OverlayProxy`] by.
pub const OVERLAY_PROXY: &str = "overlayfs-proxy";

/// As [`start`], and containerd's overlayfs snapshotter also served as a proxy plugin
/// ([`OVERLAY_PROXY`]) with the sample image imported into it, when `bin_dir` can hold
/// a build of it (see [`OverlayProxy::start`]).
pub fn start_with_overlay_proxy(
    fs: &ScratchFs,
    namespace: &str,
    bin_dir: &Path,
) -> (Daemon, Option<OverlayProxy>, Containerd) {
    let daemon = start_daemon(fs);
    let proxy = OverlayProxy::start(
        bin_dir,
        &fs.path().join("overlay-proxy"),
        &fs.path().join("overlay-proxy.sock"),
    );
    let mut proxies = vec![("lamina", daemon.socket.as_path())];
    let mut snapshotters = vec!["overlayfs", "lamina"];
    if let Some(proxy) = &proxy {
        proxies.push((OVERLAY_PROXY, proxy.socket.as_path()));
        snapshotters.push(OVERLAY_PROXY);
    }
    let ctd = Containerd::start_with(&fs.path().join("containerd"), &proxies);
    import_sample(fs, &ctd, namespace, &snapshotters);
    (daemon, proxy, ctd)
}

/// What a benchmark measures against: on a full run (`--bench`) [`start_with_overlay_proxy`]
/// with the bench executable's directory for the proxy's build; under `cargo test`
/// [`start`], so that the smoke pass needs neither Go nor containerd's module.
pub fn start_for_run(
    full: bool,
    fs: &ScratchFs,
    namespace: &str,
) -> (Daemon, Option<OverlayProxy>, Containerd) {
    if full {
        let exe = std::env::current_exe().expect("the bench executable's path");
        let bin_dir = exe.parent().expect("the bench executable's directory");
        start_with_overlay_proxy(fs, namespace, bin_dir)
    } else {
        let (daemon, ctd) = start(fs, namespace);
        (daemon, None, ctd)
    }
}

/// The daemon, its log beside the bench executable as the proxied overlayfs's is: on
/// the scratch filesystem, every unmount's sync would write the log's new lines back with
/// the snapshot's metadata, which a node's daemon logging to its journal does not pay.
/// One log per bench executable, begun again by each run.
fn start_daemon(fs: &ScratchFs) -> Daemon {
    let exe = std::env::current_exe().expect("the bench executable's path");
    let log = exe.with_extension("lamina-daemon.log");
    let _ = std::fs::remove_file(&log);
    Daemon::start_logging_to(
        &fs.path().join("store"),
        &fs.path().join("lamina.sock"),
        &[],
        &log,
    )
}

fn import_sample(fs: &ScratchFs, ctd: &Containerd, namespace: &str, snapshotters: &[&str]) {
    let files = sample_image(&fs.path().join("image"));
    let archive = files.oci_archive.to_str().unwrap();
    for snapshotter in snapshotters {
        ctd.ctr_ok(&[
            "--namespace",
            namespace,
            "images",
            "import",
            "--snapshotter",
            snapshotter,
            "--base-name",
            "docker.io/lamina/sample",
            archive,
        ]);
    }
}

/// Mounts what a snapshotter answered on `target`, as containerd's shim does: a bind, or
/// an overlay with the options as its data.
pub fn mount_all(mounts: &[Mount], target: &Path) {
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    let m = &mounts[0];
    if m.r#type == "bind" {
        rustix::mount::mount_bind_recursive(m.source.as_str(), target).unwrap();
        return;
    }
    let data: Vec<&str> = m
        .options
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "rw" | "ro" | "bind" | "rbind"))
        .collect();
    let data = std::ffi::CString::new(data.join(",")).unwrap();
    rustix::mount::mount(
        m.source.as_str(),
        target,
        m.r#type.as_str(),
        MountFlags::empty(),
        data.as_c_str(),
    )
    .unwrap();
}

/// The key of the image's top layer in `api`'s snapshotter: the committed snapshot no
/// other snapshot has as parent.
pub fn top_layer(api: &Api) -> String {
    let committed = api.list(&["kind==committed"]).unwrap();
    let parents: Vec<String> = committed
        .iter()
        .map(|key| api.stat(key).unwrap().parent)
        .collect();
    let top: Vec<&String> = committed.iter().filter(|k| !parents.contains(k)).collect();
    assert_eq!(top.len(), 1, "one image imported: {committed:?}");
    top[0].clone()
}
