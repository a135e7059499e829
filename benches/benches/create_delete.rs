//! Create+delete of a warm image for every strategy, against the kernel floor: mounting
//! and unmounting the same overlay directly. The difference is lamina's own cost per
//! container (criterion's statistics suit this repeated, identical operation; the
//! storms live in `scenarios.rs`). Deferred deletes are timed as their caller sees
//! them; the reaper runs outside the timing. Needs root.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lamina_benches::criterion_table::{CASES, GROUP, KERNEL_FLOOR};
use lamina_benches::rig::Rig;
use lamina_integration::{FsKind, require_root};
use lamina_mount::pool::{self, PoolKind};
use lamina_sys::Mounter;

fn create_delete(c: &mut Criterion) {
    require_root();
    let rig = Rig::new(FsKind::Ext4, 512);
    let image = rig.warm(&lamina_benches::images::sample(&rig.scratch("image")));
    let chain = image.chain_ids();

    let mut group = c.benchmark_group(GROUP);
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));
    group.bench_function(KERNEL_FLOOR, |b| {
        let base = rig.scratch("raw");
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let dirs = lamina_store::ContainerDirs::under(base.clone());
                for d in [&dirs.rootfs, &dirs.upper, &dirs.work] {
                    fs::create_dir_all(d).unwrap();
                }
                let spec = lamina_mount::plan::classic(&rig.store, &chain, &dirs);
                let start = Instant::now();
                rig.mounter.mount_overlay(&spec, &dirs.rootfs).unwrap();
                rig.mounter.unmount(&dirs.rootfs).unwrap();
                total += start.elapsed();
                fs::remove_dir_all(&base).unwrap();
            }
            total
        })
    });
    for &(id, strategies, read_only) in CASES {
        group.bench_function(id, |b| {
            b.iter_custom(|n| {
                if strategies == "pooled" {
                    let kind = PoolKind::overlays(&chain, lamina_mount::Flavour::PLAIN, None);
                    pool::fill(&rig.store, &rig.mounter, &kind, Some(n as usize)).unwrap();
                }
                let start = Instant::now();
                for i in 0..n {
                    let id = format!("bench-{i}");
                    rig.create(&image, &id, strategies, read_only);
                    rig.delete(&id);
                }
                let elapsed = start.elapsed();
                rig.reap_all();
                elapsed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, create_delete);
criterion_main!(benches);
