//! lamina as containerd's snapshotter against containerd's built-in overlayfs
//! snapshotter, in the same run, on the same loop-backed ext4:
//!
//! - `containerd-snapshot-cycle`: what a container start and stop costs the snapshotter —
//!   Prepare on the image's top layer, Mounts, mount what it answered, unmount, Remove —
//!   through containerd's snapshots API for both, and on lamina's own socket (no proxy
//!   hop). A deferred Remove is timed as containerd sees it; the reaper runs after.
//! - `containerd-ctr-run`: `ctr run --rm IMAGE true`, end to end.
//!
//! Needs root and Debian's containerd.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use lamina_benches::containerd_rig::{self, IMAGE, mount_all, top_layer};
use lamina_integration::snapshotter::{Api, Daemon, labels};
use lamina_integration::{ScratchFs, require_root};
use rustix::mount::UnmountFlags;

const NAMESPACE: &str = "bench";

static NEXT: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Commits two layers, `base` and `top`, each with a file of its own, as the parent of
/// the cycles on a snapshotter no containerd uses.
fn commit_layers(api: &Api, target: &Path) {
    for (key, parent) in [("base", ""), ("top", "base")] {
        let active = format!("{key}-active");
        let mounts = api.prepare(&active, parent, labels(&[])).unwrap();
        mount_all(&mounts, target);
        std::fs::write(target.join(key), key).unwrap();
        rustix::mount::unmount(target, UnmountFlags::empty()).unwrap();
        api.commit(key, &active, labels(&[])).unwrap();
    }
}

fn containerd(c: &mut Criterion) {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let (daemon, ctd) = containerd_rig::start(&fs, NAMESPACE);
    let target = fs.path().join("rootfs");
    std::fs::create_dir(&target).unwrap();
    // Talked to directly, lamina gets a daemon and store of its own: containerd's
    // garbage collector removes snapshots of its snapshotter that its metadata does not
    // know, and would take this case's snapshots between Prepare and Mounts.
    let alone = Daemon::start(
        &fs.path().join("alone-store"),
        &fs.path().join("alone.sock"),
        &[],
    );
    commit_layers(&Api::connect(&alone.socket), &target);
    // Snapshots made through containerd's API outside a lease would be containerd's
    // garbage: each carries a GC root label for its short life.
    let gc_root = labels(&[("containerd.io/gc.root", "bench")]);

    let cases = [
        (
            "overlayfs via containerd",
            Api::via_containerd(&ctd.socket, "overlayfs", NAMESPACE),
        ),
        (
            "lamina via containerd",
            Api::via_containerd(&ctd.socket, "lamina", NAMESPACE),
        ),
        ("lamina on its own socket", Api::connect(&alone.socket)),
    ];
    let mut group = c.benchmark_group("containerd-snapshot-cycle");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));
    for (name, api) in &cases {
        let parent = top_layer(api);
        group.bench_function(*name, |b| {
            b.iter(|| {
                let key = unique("cycle");
                api.prepare(&key, &parent, gc_root.clone()).unwrap();
                let mounts = api.mounts(&key).unwrap();
                mount_all(&mounts, &target);
                rustix::mount::unmount(&target, UnmountFlags::empty()).unwrap();
                api.remove(&key).unwrap();
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("containerd-ctr-run");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    for snapshotter in ["overlayfs", "lamina"] {
        group.bench_function(snapshotter, |b| {
            b.iter(|| {
                let id = unique("run");
                ctd.ctr_ok(&[
                    "--namespace",
                    NAMESPACE,
                    "run",
                    "--rm",
                    "--snapshotter",
                    snapshotter,
                    IMAGE,
                    &id,
                    "true",
                ]);
            })
        });
    }
    group.finish();
    drop(cases);
    drop(ctd);
    drop(daemon);
}

criterion_group!(benches, containerd);
criterion_main!(benches);
