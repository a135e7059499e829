//! Layer import: lamina's safe unpack against GNU `tar -x` of the same bytes, on a
//! loop-backed ext4 the bench creates (this VM's root filesystem is ~25x slower at
//! creating files and would measure the disk, not the unpacker). Needs root.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lamina_integration::{ScratchFs, require_root};
use lamina_sample::LayerBuilder;

/// 2000 small files in 40 directories plus 8 larger ones: a typical language-runtime layer.
fn synthetic_layer() -> Vec<u8> {
    let mut layer = LayerBuilder::new();
    let small = vec![b'x'; 4096];
    let large = vec![b'y'; 2 * 1024 * 1024];
    for d in 0..40 {
        layer = layer.dir(&format!("d{d}"), 0o755).unwrap();
        for f in 0..50 {
            layer = layer.file(&format!("d{d}/f{f}"), 0o644, &small).unwrap();
        }
    }
    for f in 0..8 {
        layer = layer.file(&format!("large{f}"), 0o644, &large).unwrap();
    }
    layer.finish().unwrap()
}

/// Times `extract` into a fresh directory per iteration; creating and removing the
/// directory stay outside the measurement.
fn timed(scratch: &Path, iters: u64, mut extract: impl FnMut(&Path)) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..iters {
        let dest = scratch.join(format!("x{i}"));
        fs::create_dir(&dest).unwrap();
        let start = Instant::now();
        extract(&dest);
        total += start.elapsed();
        fs::remove_dir_all(&dest).unwrap();
    }
    total
}

fn gnu_tar(args: &[&str], archive: &Path, dest: &Path) {
    let status = Command::new("tar")
        .args(args)
        .arg(archive)
        .arg("-C")
        .arg(dest)
        .status()
        .unwrap();
    assert!(status.success());
}

fn import(c: &mut Criterion) {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let tar = synthetic_layer();
    let tar_path: PathBuf = fs.path().join("layer.tar");
    fs::write(&tar_path, &tar).unwrap();
    let gz_path = fs.path().join("layer.tar.gz");
    // GNU gzip at its default level, so both sides read the same stream.
    let gz = Command::new("gzip")
        .arg("-c")
        .arg(&tar_path)
        .output()
        .unwrap();
    assert!(gz.status.success());
    fs::write(&gz_path, &gz.stdout).unwrap();
    let gz_bytes = gz.stdout;
    let scratch = fs.path().join("out");
    fs::create_dir(&scratch).unwrap();

    let mut group = c.benchmark_group("import/2000-small-8-large");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("tar/gnu-tar", |b| {
        b.iter_custom(|n| timed(&scratch, n, |d| gnu_tar(&["-xf"], &tar_path, d)))
    });
    group.bench_function("tar/lamina", |b| {
        b.iter_custom(|n| {
            timed(&scratch, n, |d| {
                lamina_unpack::unpack(tar.as_slice(), d).unwrap();
            })
        })
    });
    group.bench_function("gzip/gnu-tar", |b| {
        b.iter_custom(|n| timed(&scratch, n, |d| gnu_tar(&["-xzf"], &gz_path, d)))
    });
    group.bench_function("gzip/lamina", |b| {
        b.iter_custom(|n| {
            timed(&scratch, n, |d| {
                let decoded =
                    lamina_image::compression::decoder(gz_bytes.as_slice(), None, "bench").unwrap();
                lamina_unpack::unpack(decoded, d).unwrap();
            })
        })
    });
    group.finish();
}

criterion_group!(benches, import);
criterion_main!(benches);
