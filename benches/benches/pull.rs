//! A multi-layer image pulled from a registry into an empty store and a container created
//! from it, two ways, in the same run, both through the binaries as an operator runs them:
//!
//! - `lamina create docker://…`: manifest and config fetched, layers fetched three at a
//!   time and streamed through digest checks straight into unpack.
//! - `skopeo copy` + `lamina create oci://…`: the two-step path — every blob written to
//!   an OCI layout on disk first, then imported from there.
//!
//! The registry (Debian's docker-registry) serves from the same loop-backed ext4 as the
//! stores, on 127.0.0.1, so the network costs nothing and the difference is the pipeline.
//! Making the empty store before and removing everything after stay outside the timing.
//! `cargo bench` (cargo passes `--bench`) uses 4 × 32 MiB layers over busybox; `cargo
//! test`'s smoke pass 4 × 1 MiB. Needs root, docker-registry and skopeo.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use lamina_benches::images;
use lamina_image::Compression;
use lamina_integration::registry::Registry;
use lamina_integration::{Lamina, ScratchFs, require_root};

const REPO: &str = "bench/multi:v1";
const LAYERS: u64 = 4;

/// Bytes of each layer above busybox: full size under `cargo bench`, tiny otherwise.
fn layer_bytes() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        32 << 20
    } else {
        1 << 20
    }
}

/// Busybox plus [`LAYERS`] distinct gzip layers shaped like a language runtime, pushed to
/// `registry` as [`REPO`].
fn push_image(registry: &Registry, dir: &Path) {
    let busybox = lamina_sample::busybox_image(Path::new(lamina_sample::DEFAULT_BUSYBOX))
        .expect("the busybox sample (busybox-static)");
    let tars = busybox
        .layers
        .into_iter()
        .map(|(_, tar)| tar)
        .chain((0..LAYERS).map(|seed| images::large_layer_seeded(layer_bytes(), 1000 + seed)))
        .collect();
    let image = images::image(tars, Compression::Gzip);
    let layout = dir.join("layout");
    images::write_layout(&layout, &image);
    registry.push(&layout, images::TAG, REPO);
}

/// Runs `lamina create` on `image` into the fresh store `store`, asserting it worked.
fn create(lamina: &Lamina, flags: &[&str], image: &str) {
    let mut args = flags.to_vec();
    args.extend_from_slice(&["create", image, "bench"]);
    let out = lamina.run(&args);
    assert_eq!(out.code, 0, "{out:?}");
}

fn skopeo_copy(from: &str, layout: &Path) {
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false", from])
        .arg(format!("oci:{}:v1", layout.display()))
        .output()
        .expect("skopeo");
    assert!(out.status.success(), "skopeo copy: {out:?}");
}

/// Removes the container and the store (and the layout, if any) made by one iteration.
fn clean_up(lamina: &Lamina, layout: &Path) {
    let out = lamina.run(&["delete", "bench"]);
    assert_eq!(out.code, 0, "{out:?}");
    let out = lamina.run(&["delete-store"]);
    assert_eq!(out.code, 0, "{out:?}");
    let _ = std::fs::remove_dir_all(layout);
}

/// Runs `op` `n` times, each on a fresh store and layout path from `fresh`, and returns
/// the time `op` alone took; the store and layout are removed after each, untimed.
fn timed(
    n: u64,
    fresh: &mut impl FnMut() -> (Lamina, PathBuf),
    op: impl Fn(&Lamina, &Path),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..n {
        let (lamina, layout) = fresh();
        let started = Instant::now();
        op(&lamina, &layout);
        total += started.elapsed();
        clean_up(&lamina, &layout);
    }
    total
}

fn pull(c: &mut Criterion) {
    require_root();
    let fs = ScratchFs::ext4(4096);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, &fs.path().join("image"));
    let remote = registry.reference(REPO);
    let insecure = ["--insecure-registry", registry.host.as_str()];
    let mut round = 0u64;
    let mut fresh = || {
        round += 1;
        let lamina = Lamina::init(&fs.path().join(format!("store-{round}")));
        (lamina, fs.path().join(format!("layout-{round}")))
    };

    let mut group = c.benchmark_group("pull-create");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(30));
    group.bench_function("lamina create docker://", |b| {
        b.iter_custom(|n| {
            timed(n, &mut fresh, |lamina, _| {
                create(lamina, &insecure, &remote)
            })
        })
    });
    group.bench_function("skopeo copy + lamina create oci://", |b| {
        b.iter_custom(|n| {
            timed(n, &mut fresh, |lamina, layout| {
                skopeo_copy(&remote, layout);
                create(lamina, &[], &format!("oci://{}:v1", layout.display()));
            })
        })
    });
    group.finish();
    drop(registry);
}

criterion_group!(benches, pull);
criterion_main!(benches);
