//! composefs (issue 24) against `classic` on the same filesystem, in one run:
//!
//! - images of 10, 30 and 100 layers: the lowers in the mount, the first create
//!   (composefs builds its metadata image then), warm create and delete p50 — where
//!   composefs starts to win is what `auto` would go by;
//! - two images holding the same files layered differently (one layer; five): the disk
//!   bytes the store grew by from an empty store, per strategy (`classic` and
//!   `composefs` on a default store; `classic`, `shared-ro`, `direct` and `composefs` on
//!   one that shares file content), and the page cache after every shared file is read
//!   in a container of each;
//! - importing with file objects (every file hashed, shared content linked) against the
//!   unpack alone, and building the metadata image against the import, for the deep
//!   images and for one layer of real-size files (128 MiB).

use std::path::Path;
use std::time::{Duration, Instant};

use lamina_image::Image;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};
use lamina_integration::scratch::used_bytes;

const STRATEGIES: &[&str] = &["classic", "composefs"];

/// The strategies the shared-files rows compare on a store that does not share file
/// content (the default), and whether each is read-only.
const DEFAULT_STORE_STRATEGIES: &[(&str, bool)] = &[("classic", false), ("composefs", false)];

/// The strategies the shared-files rows compare on a store that shares file content,
/// and whether each is read-only.
const SHARED_STRATEGIES: &[(&str, bool)] = &[
    ("classic", false),
    ("shared-ro", true),
    ("direct", true),
    ("composefs", false),
];

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
            "store",
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
            "unpack only",
            "import (unpack + file objects)",
            "import vs unpack",
            "build metadata image",
            "build vs import",
        ],
    );
    let mut import_objects = Table::new(
        "composefs-import-objects",
        &[
            "fs",
            "layers",
            "import, default store",
            "import, layer data in objects",
            "vs default store",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 2048);
        // Imports with file objects, and the rows of a store that shares file content.
        let sharing = Rig::sharing_file_content(kind, 2048);
        // The rows of a store whose layers keep their data in objects.
        let in_objects = Rig::layer_data_in_objects(kind, 2048);
        for &layers in &layer_counts {
            progress(&format!("composefs {} {layers}-layer image", rig.fs_name()));
            let reference =
                crate::images::many_layers(&rig.scratch(&format!("deep-{layers}")), layers);
            let image = crate::images::resolve(&reference);
            import_and_build(&sharing, &image, &layers.to_string(), &mut import);
            rig.store.import(&image).unwrap();
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
        import_and_build(&sharing, &image, &label, &mut import);
        import_into_objects(&rig, &in_objects, &image, &label, &mut import_objects);

        for &size in &sizes {
            shared_files(&rig, files, size, DEFAULT_STORE_STRATEGIES, &mut shared);
            shared_files(&sharing, files, size, SHARED_STRATEGIES, &mut shared);
            shared_files(&in_objects, files, size, SHARED_STRATEGIES, &mut shared);
        }
    }
    vec![deep, shared, import, import_objects]
}

/// Imports `image` into a default store (`files`) and into one whose layers keep their
/// data in objects, [`IMPORT_ROUNDS`] times each, alternated and each from a store
/// without the image: the medians, as a row of `table` labelled `layers`.
fn import_into_objects(files: &Rig, objects: &Rig, image: &Image, layers: &str, table: &mut Table) {
    let (mut plain, mut moved) = (Samples::new(), Samples::new());
    for _ in 0..IMPORT_ROUNDS {
        for (rig, samples) in [(files, &mut plain), (objects, &mut moved)] {
            forget(rig, image);
            let t = Instant::now();
            rig.store.import(image).unwrap();
            samples.push(t.elapsed());
        }
    }
    forget(objects, image);
    let (plain, moved) = (plain.summary().p50, moved.summary().p50);
    table.row(vec![
        files.fs_name().into(),
        layers.into(),
        human(plain),
        human(moved),
        ratio(moved, plain),
    ]);
}

/// Two images holding the same `files` files of `size` bytes, one as a single layer
/// and one over five: the disk bytes the store grows by from importing both to a
/// container of each, and the page cache while every file is read in both, as rows of
/// `table`, one per strategy of `strategies` (each with whether it is read-only). Each
/// row starts from an empty
/// store (`clean` removes the last row's layers, objects and flattened trees), so each
/// counts its own import and what its strategy adds.
fn shared_files(
    rig: &Rig,
    files: usize,
    size: usize,
    strategies: &[(&str, bool)],
    table: &mut Table,
) {
    progress(&format!(
        "composefs {} {} shared files of {} KiB",
        rig.fs_name(),
        files,
        size >> 10
    ));
    let scratch = rig.scratch(&format!("shared-{size}"));
    let (refs, paths) = crate::images::shared_files(&scratch, files, size, 5);
    let images: Vec<Image> = refs.iter().map(|r| crate::images::resolve(r)).collect();
    let unique = (files * size) as u64;
    let store = if rig.store.properties().shared_file_content {
        "shares file content"
    } else if rig.store.properties().layer_data_in_objects {
        "layer data in objects"
    } else {
        "default"
    };
    for &(strategy, read_only) in strategies {
        lamina_mount::clean(&rig.store, &rig.mounter, None).expect("cleaning the store");
        // The images' layouts are on the same filesystem: written before the baseline.
        let baseline = settled_used_bytes(rig.store.root());
        let roots: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let id = format!("shared-{i}");
                rig.create(image, &id, strategy, read_only);
                rig.store.layout().container(&id).join("rootfs")
            })
            .collect();
        let store_bytes = settled_used_bytes(rig.store.root()) - baseline;
        let cached = cached_after_reading(&roots, &paths);
        table.row(vec![
            rig.fs_name().into(),
            store.into(),
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
    lamina_mount::clean(&rig.store, &rig.mounter, None).expect("cleaning the store");
}

/// [`used_bytes`] once it stops changing: xfs frees a removed file's blocks in the
/// background, after the `syncfs` (a baseline taken right after `clean` came out above
/// the bytes in use once the next row's containers were made).
fn settled_used_bytes(path: &Path) -> u64 {
    let mut last = used_bytes(path);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = used_bytes(path);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Imports `image` into a store without `objects/` (the unpack alone, as imports were
/// before issue 24) and into one with it (hashing every file, linking those whose
/// content is an object), [`IMPORT_ROUNDS`] times each, alternated and each from a store
/// without the image; then builds its metadata image. The medians, as a row of `table`
/// labelled `layers`. Returns the image's chain IDs.
fn import_and_build(
    rig: &Rig,
    image: &Image,
    layers: &str,
    table: &mut Table,
) -> Vec<lamina_image::Digest> {
    let objects = rig.store.layout().objects();
    let aside = rig.store.root().join("objects-aside");
    let (mut unpack, mut import) = (Samples::new(), Samples::new());
    let mut chain_ids = Vec::new();
    for _ in 0..IMPORT_ROUNDS {
        for with_objects in [false, true] {
            forget(rig, image);
            if !with_objects {
                std::fs::rename(&objects, &aside).unwrap();
            }
            let t = Instant::now();
            chain_ids = rig.store.import(image).unwrap();
            let took = t.elapsed();
            if with_objects {
                import.push(took);
            } else {
                std::fs::rename(&aside, &objects).unwrap();
                unpack.push(took);
            }
        }
    }
    let (unpacked, imported) = (unpack.summary().p50, import.summary().p50);
    let t = Instant::now();
    lamina_mount::composefs::ensure(&rig.store, &rig.mounter, &chain_ids).unwrap();
    let built = t.elapsed();
    table.row(vec![
        rig.fs_name().into(),
        layers.into(),
        human(unpacked),
        human(imported),
        ratio(imported, unpacked),
        human(built),
        ratio(built, imported),
    ]);
    chain_ids
}

/// Imports timed per form of import: each alternated, the medians kept.
const IMPORT_ROUNDS: usize = 3;

/// Removes `image`'s layers from the store, with the objects their manifests name and
/// its metadata image: the next import of it starts from nothing.
fn forget(rig: &Rig, image: &Image) {
    for chain_id in image.chain_ids() {
        let layer = rig.store.layout().layer(&chain_id);
        if let Some(digests) = lamina_store::file_objects::read_manifest(&layer) {
            for id in digests {
                let objects = rig.store.layout().objects();
                let _ =
                    std::fs::remove_file(lamina_store::file_objects::object_path(&objects, &id));
                let short = lamina_store::object_layers::short_name(&id);
                let _ = std::fs::remove_file(objects.join(short));
            }
        }
        if layer.exists() {
            lamina_store::remove_tree(&layer).unwrap();
        }
    }
    if let Some(top) = image.chain_ids().last() {
        let _ = std::fs::remove_file(lamina_mount::composefs::image_path(&rig.store, top));
    }
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
