//! Classic create+delete (a fresh overlay per container, GrootFS's behaviour) of a warm
//! image, against the kernel floor: mounting and unmounting the same overlay directly.
//! The difference is lamina's own cost per container. Needs root.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lamina_image::{ImageRef, Platform, resolve};
use lamina_integration::{ScratchFs, require_root, sample_image};
use lamina_mount::{CreateOptions, create, delete};
use lamina_store::Store;
use lamina_sys::{Mounter, RealMounter};

fn classic(c: &mut Criterion) {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let store = Store::init(&fs.path().join("store")).unwrap();
    let image = resolve(
        &ImageRef::parse(&files.references()[0]).unwrap(),
        &Platform::host(),
    )
    .unwrap();
    let chain = store.import(&image).unwrap();
    let mounter = RealMounter::new();

    let mut group = c.benchmark_group("create-delete/warm-sample-image");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("kernel-floor/overlay-mount-umount", |b| {
        let base = fs.path().join("raw");
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let dirs = lamina_store::ContainerDirs::under(base.clone());
                for d in [&dirs.rootfs, &dirs.upper, &dirs.work] {
                    fs::create_dir_all(d).unwrap();
                }
                let spec = lamina_mount::plan::classic(&store, &chain, &dirs);
                let start = Instant::now();
                mounter.mount_overlay(&spec, &dirs.rootfs).unwrap();
                mounter.unmount(&dirs.rootfs).unwrap();
                total += start.elapsed();
                fs::remove_dir_all(&base).unwrap();
            }
            total
        })
    });
    group.bench_function("lamina/classic", |b| {
        b.iter_custom(|n| {
            let start = Instant::now();
            for i in 0..n {
                let id = format!("bench-{i}");
                create(&store, &mounter, &image, &id, &CreateOptions::default()).unwrap();
                delete(&store, &mounter, &id).unwrap();
            }
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, classic);
criterion_main!(benches);
