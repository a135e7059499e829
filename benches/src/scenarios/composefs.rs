//! composefs (issue 24) against `classic` on the same filesystem, in one run:
//!
//! - images of 10, 30 and 100 layers: the lowers in the mount, the first create
//!   (composefs builds its metadata image then), warm create and delete p50 — where
//!   composefs starts to win is what `auto` would go by;
//! - two images holding the same files layered differently (one layer; five): the disk
//!   bytes the store grew by (classic first: composefs's build makes the second image's
//!   layer files share the first's extents where the filesystem can, and that stays),
//!   and the page cache after every shared file is read in a container of
//!   each — composefs's containers read one object where classic reads two layer files;
//! - building the metadata image against importing (unpacking) the same layers, for the
//!   deep images and for one layer of real-size files (128 MiB).

use std::path::Path;
use std::time::{Duration, Instant};

use lamina_image::Image;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};
use lamina_integration::scratch::used_bytes;

const STRATEGIES: &[&str] = &["classic", "composefs"];

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let layer_counts = ctx.mode.pick(vec![10, 20, 30, 100], vec![5]);
    let samples = ctx.mode.pick(50, 3);
    let files = ctx.mode.pick(500, 20);
    // Per-file metadata (inodes, directory entries, the images' entries) weighs more
    // against small files: two sizes show how much.
    let sizes = ctx.mode.pick(vec![16 << 10, 64 << 10], vec![4 << 10]);
    let mut deep = Table::new(
        "composefs-deep",
        &[
            "fs",
            "strategy",
            "layers",
            "lowers in the mount",
            "first create",
            "create p50",
            "delete p50",
            "create p50 vs classic",
        ],
    );
    let mut shared = Table::new(
        "composefs-shared",
        &[
            "fs",
            "strategy",
            "files",
            "unique file bytes",
            "store grew by",
            "store vs unique bytes",
            "page cache after reading both",
            "cache vs unique bytes",
        ],
    );
    let mut import = Table::new(
        "composefs-import",
        &[
            "fs",
            "layers",
            "import (unpack)",
            "build metadata image + objects",
            "build vs import",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 2048);
        for &layers in &layer_counts {
            progress(&format!("composefs {} {layers}-layer image", rig.fs_name()));
            let reference =
                crate::images::many_layers(&rig.scratch(&format!("deep-{layers}")), layers);
            let image = crate::images::resolve(&reference);
            let chain_ids = import_and_build(&rig, &image, &layers.to_string(), &mut import);
            // The first create below finds the image built: remove it so it is timed.
            std::fs::remove_file(lamina_mount::composefs::image_path(
                &rig.store,
                chain_ids.last().unwrap(),
            ))
            .unwrap();
            let mut classic = None;
            for strategy in STRATEGIES {
                let first = rig.timed_create(&image, "first", strategy, false);
                let lowers = lowers_in_mount(&rig.store.layout().container("first").join("rootfs"));
                rig.delete("first");
                let (creates, deletes) = cycles(&rig, &image, strategy, samples);
                let (c, d) = (creates.summary(), deletes.summary());
                let base = *classic.get_or_insert(c.p50);
                deep.row(vec![
                    rig.fs_name().into(),
                    format!("`{strategy}`"),
                    layers.to_string(),
                    lowers.to_string(),
                    human(first),
                    human(c.p50),
                    human(d.p50),
                    ratio(c.p50, base),
                ]);
            }
        }

        // Real-size content: the build hashes every file past the inline limit (the
        // deep images above have only inline ones).
        let total = ctx.mode.pick(128usize << 20, 2 << 20);
        progress(&format!(
            "composefs {} {} MiB layer",
            rig.fs_name(),
            total >> 20
        ));
        let reference = crate::images::write_layout(
            &rig.scratch("large"),
            &crate::images::image(
                vec![crate::images::large_layer(total)],
                lamina_image::Compression::None,
            ),
        );
        let image = crate::images::resolve(&reference);
        let label = format!("1 of {} MiB", total >> 20);
        import_and_build(&rig, &image, &label, &mut import);

        for &size in &sizes {
            shared_files(&rig, files, size, &mut shared);
        }
    }
    vec![deep, shared, import]
}

/// Two images holding the same `files` files of `size` bytes, one as a single layer
/// and one over five: the disk bytes the store grows by once each has a container of
/// each strategy (classic first: a composefs build makes the second image's layer files
/// share the first's extents where the filesystem can, and that stays), and the page
/// cache while every file is read in both, as rows of `table`.
fn shared_files(rig: &Rig, files: usize, size: usize, table: &mut Table) {
    progress(&format!(
        "composefs {} shared files of {} KiB",
        rig.fs_name(),
        size >> 10
    ));
    let scratch = rig.scratch(&format!("shared-{size}"));
    let (refs, paths) = crate::images::shared_files(&scratch, files, size, 5);
    // The images' layouts are on the same filesystem: written before the baseline.
    let baseline = used_bytes(rig.store.root());
    let images: Vec<Image> = refs.iter().map(|r| rig.warm(r)).collect();
    let unique = (files * size) as u64;
    for strategy in STRATEGIES {
        let roots: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let id = format!("shared-{i}");
                rig.create(image, &id, strategy, false);
                rig.store.layout().container(&id).join("rootfs")
            })
            .collect();
        let store_bytes = used_bytes(rig.store.root()) - baseline;
        let cached = cached_after_reading(&roots, &paths);
        table.row(vec![
            rig.fs_name().into(),
            format!("`{strategy}`"),
            format!("{files} × {} KiB", size >> 10),
            bytes(unique),
            bytes(store_bytes),
            format!("{:.2}×", store_bytes as f64 / unique as f64),
            bytes(cached),
            format!("{:.2}×", cached as f64 / unique as f64),
        ]);
        rig.delete_all();
    }
}

/// Imports `image` and builds its metadata image and objects, each timed, as a row of
/// `table` labelled `layers`. Returns the image's chain IDs.
fn import_and_build(
    rig: &Rig,
    image: &Image,
    layers: &str,
    table: &mut Table,
) -> Vec<lamina_image::Digest> {
    let t = Instant::now();
    let chain_ids = rig.store.import(image).unwrap();
    let imported = t.elapsed();
    let t = Instant::now();
    lamina_mount::composefs::ensure(&rig.store, &rig.mounter, &chain_ids).unwrap();
    let built = t.elapsed();
    table.row(vec![
        rig.fs_name().into(),
        layers.into(),
        human(imported),
        human(built),
        ratio(built, imported),
    ]);
    chain_ids
}

/// `n` creates and deletes of `strategy`, each timed.
fn cycles(rig: &Rig, image: &Image, strategy: &str, n: usize) -> (Samples, Samples) {
    let mut creates = Samples::new();
    let mut deletes = Samples::new();
    for i in 0..n {
        let id = format!("cycle-{i}");
        creates.push(rig.timed_create(image, &id, strategy, false));
        deletes.push(rig.timed_delete(&id));
    }
    rig.reap_all();
    (creates, deletes)
}

/// How many lower layers the overlay at `rootfs` was given (data-only ones not counted).
fn lowers_in_mount(rootfs: &Path) -> usize {
    let options = lamina_integration::proof::super_options(rootfs).unwrap_or_default();
    options
        .split(',')
        .filter(|o| o.starts_with("lowerdir"))
        .map(|o| o.split("::").next().unwrap_or(o).split(':').count())
        .sum()
}

/// Bytes the page cache grew by while every file in `paths` was read in each rootfs,
/// from a dropped cache.
fn cached_after_reading(roots: &[std::path::PathBuf], paths: &[String]) -> u64 {
    // Written pages first, so dropping leaves nothing of the setup behind.
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = cached_bytes();
    for root in roots {
        for path in paths {
            std::fs::read(root.join(path)).unwrap();
        }
    }
    cached_bytes().saturating_sub(before)
}

fn cached_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Cached:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

fn bytes(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
}
