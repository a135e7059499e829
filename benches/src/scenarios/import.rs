//! Import: one large layer, gzip and zstd, unpacked by lamina against GNU `tar -x` and
//! `umoci unpack` of the same blob, into fresh directories on the same filesystem.
//! lamina's row is its checked unpack (every entry resolved beneath the root with
//! openat2); "unpack + file list" adds listing every entry for `check --verify` (what an
//! import now does: every file read back and hashed, every xattr listed); the "store
//! import" row is the whole import: digest verification, unpack, file list, syncfs and
//! publishing.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use lamina_image::Compression;
use lamina_store::Store;

use super::{Ctx, progress};
use crate::images;
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let total = ctx.mode.pick(200usize << 20, 2 << 20);
    let rounds = ctx.mode.pick(3, 1);
    progress(&format!("import: building a {} MiB layer", total >> 20));
    let tar = images::large_layer(total);
    let mut table = Table::new(
        "import",
        &["fs", "layer", "tool", "p50", "max", "vs GNU tar"],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, (total as u64 >> 20) * 4 + 1024);
        let layout = rig.scratch("layout");
        for compression in [Compression::Gzip, Compression::Zstd] {
            let name = match compression {
                Compression::Zstd => "zstd",
                _ => "gzip",
            };
            let image = images::image(vec![tar.clone()], compression);
            let blob_digest = &image.layers[0].0;
            let reference = images::write_layout(&layout.join(name), &image);
            let blob = layout
                .join(name)
                .join("blobs/sha256")
                .join(blob_digest.hex());
            let blob_mb = fs::metadata(&blob).unwrap().len() >> 20;
            let out = rig.scratch("out");
            let tools: [(&str, Extractor); 5] = [
                (
                    "GNU tar -x",
                    Box::new(|d: &Path| gnu_tar(&blob, compression, d)),
                ),
                (
                    "lamina unpack",
                    Box::new(|d: &Path| {
                        lamina_unpack_into(&blob, compression, d);
                        true
                    }),
                ),
                (
                    "lamina unpack + file list",
                    Box::new(|d: &Path| {
                        lamina_unpack_into(&blob, compression, d);
                        let never = std::sync::atomic::AtomicBool::new(false);
                        let list = d.with_extension("file-list");
                        let listed = lamina_store::file_list::write(
                            &lamina_sys::RealHost,
                            d,
                            &list,
                            false,
                            &never,
                        )
                        .unwrap();
                        fs::remove_file(&list).unwrap();
                        listed.is_some()
                    }),
                ),
                (
                    "lamina store import",
                    Box::new(|d: &Path| store_import(&reference, d)),
                ),
                (
                    "umoci unpack",
                    Box::new(|d: &Path| umoci(&layout.join(name), d)),
                ),
            ];
            let mut tar_p50 = None;
            for (tool, extract) in &tools {
                progress(&format!("import {} {name} {tool}", rig.fs_name()));
                let mut times = Samples::new();
                let mut failed = false;
                for i in 0..rounds {
                    let dest = out.join(format!("{tool}-{i}").replace(' ', "-"));
                    fs::create_dir(&dest).unwrap();
                    let t = Instant::now();
                    let ok = extract(&dest);
                    times.push(t.elapsed());
                    fs::remove_dir_all(&dest).unwrap();
                    if !ok {
                        failed = true;
                        break;
                    }
                }
                let s = times.summary();
                let base = *tar_p50.get_or_insert(s.p50);
                let layer = format!("{} MiB tar, {blob_mb} MiB {name}", tar.len() >> 20);
                table.row(if failed {
                    vec![
                        rig.fs_name().into(),
                        layer,
                        (*tool).into(),
                        "fails: unsupported".into(),
                        "–".into(),
                        "–".into(),
                    ]
                } else {
                    vec![
                        rig.fs_name().into(),
                        layer,
                        (*tool).into(),
                        human(s.p50),
                        human(s.max),
                        ratio(s.p50, base),
                    ]
                });
            }
        }
    }
    vec![table]
}

/// Extracts into the given directory; false when the tool refuses the layer.
type Extractor<'a> = Box<dyn Fn(&Path) -> bool + 'a>;

/// lamina's checked unpack of `blob` into `dest`, decoded in process.
fn lamina_unpack_into(blob: &Path, compression: Compression, dest: &Path) {
    let file = fs::File::open(blob).unwrap();
    let decoded = lamina_image::compression::decoder(file, Some(compression), "bench").unwrap();
    lamina_unpack::unpack(decoded, dest).unwrap();
}

fn gnu_tar(blob: &Path, compression: Compression, dest: &Path) -> bool {
    let flag = match compression {
        Compression::Zstd => "--zstd",
        _ => "--gzip",
    };
    let status = Command::new("tar")
        .args([flag, "-xf"])
        .arg(blob)
        .arg("-C")
        .arg(dest)
        .status()
        .unwrap();
    assert!(status.success(), "tar {flag} failed");
    true
}

/// The whole import path into a fresh store in `dest`: resolve, verify digests while
/// unpacking, syncfs, publish.
fn store_import(reference: &str, dest: &Path) -> bool {
    let store = Store::init(&dest.join("store")).unwrap();
    let image = images::resolve(reference);
    store.import(&image).unwrap();
    true
}

/// `umoci unpack` (which also writes a runtime config and an mtree manifest, part of
/// its real cost for a caller). Returns false when umoci refuses the layer.
fn umoci(layout: &Path, dest: &Path) -> bool {
    let out = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:bench", layout.display()))
        .arg(dest.join("bundle"))
        .output()
        .unwrap();
    if !out.status.success() {
        progress(&format!(
            "umoci unpack failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    out.status.success()
}
