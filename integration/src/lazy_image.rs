//! Images whose layers carry an index (eStargz, zstd:chunked), made in code and pushed to
//! the tests' registry: busybox's sample layer under a layer of data files.

use std::path::Path;

use lamina_sample::estargz::estargz;
use lamina_sample::zstd_chunked::zstd_chunked;
use lamina_sample::{LayerBuilder, StoredLayer};

use crate::registry::Registry;

/// 300 KiB of data no two chunks of which are alike.
pub fn big() -> Vec<u8> {
    (0..300 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// `n` KiB no two chunks of which are alike, different from [`big`]'s and from each
/// other `seed`'s.
pub fn data(seed: u32, kib: u32) -> Vec<u8> {
    (0..kib * 1024)
        .map(|i| ((i ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(2_246_822_519) >> 11) as u8)
        .collect()
}

/// Which index the layers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Estargz,
    ZstdChunked,
}

/// busybox's sample layer, and a layer holding `/data/big` (300 KiB), `/data/small`, four
/// more 128 KiB files `/data/f0`…`/data/f3` (so reads spread across the image) and a
/// whiteout of `/etc/hosts`: uncompressed tars.
pub fn tars() -> [Vec<u8>; 2] {
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX).expect("reading busybox");
    let base = lamina_sample::base_layer(&busybox).expect("busybox layer");
    let mut top = LayerBuilder::new()
        .dir("data", 0o755)
        .and_then(|b| b.file("data/big", 0o644, &big()))
        .and_then(|b| b.file("data/small", 0o600, b"small\n"))
        .and_then(|b| b.whiteout("etc/hosts"))
        .expect("data layer");
    for n in 0..4 {
        top = top
            .file(&format!("data/f{n}"), 0o644, &data(n, 128))
            .expect("data layer");
    }
    [base, top.finish().expect("data layer")]
}

/// Pushes [`tars`] as `repo_tag`, both layers in `format` with 64 KiB chunks.
pub fn push_image(registry: &Registry, dir: &Path, format: Format, repo_tag: &str) {
    push_image_with(registry, dir, format, repo_tag, |_| {});
}

/// [`push_image`], each stored layer changed by `change` first (an annotation that lies,
/// say).
pub fn push_image_with(
    registry: &Registry,
    dir: &Path,
    format: Format,
    repo_tag: &str,
    change: impl Fn(&mut StoredLayer),
) {
    push_tars(registry, dir, format, repo_tag, &tars(), change);
}

/// Pushes `tars` as `repo_tag` in `format` with 64 KiB chunks, each stored layer changed
/// by `change` first.
pub fn push_tars(
    registry: &Registry,
    dir: &Path,
    format: Format,
    repo_tag: &str,
    tars: &[Vec<u8>],
    change: impl Fn(&mut StoredLayer),
) {
    let layers = tars
        .iter()
        .map(|tar| match format {
            Format::Estargz => estargz(tar, 64 * 1024).expect("eStargz").stored(tar),
            Format::ZstdChunked => zstd_chunked(tar, 64 * 1024)
                .expect("zstd:chunked")
                .stored(tar),
        })
        .map(|mut layer| {
            change(&mut layer);
            layer
        })
        .collect();
    push_layers(registry, dir, repo_tag, layers);
}

/// Pushes [`tars`] in eStargz as `repo_tag`, the data layer's TOC lying: `/data/f1` is
/// setuid root (`04755`) where the tar says `0644`. Its annotation, diffID and blob digest
/// match the lie, so only a comparison of the index with the tar finds it.
pub fn push_lying_estargz(registry: &Registry, dir: &Path, repo_tag: &str) {
    let [base, top] = tars();
    let honest = estargz(&top, 64 * 1024).expect("eStargz");
    let mut toc = honest.toc.clone();
    for entry in toc
        .entries
        .iter_mut()
        .filter(|e| e.name == "data/f1" && e.kind == "reg")
    {
        entry.mode = 0o4755;
    }
    let lying = honest.with_toc(toc).expect("a TOC that lies");
    let layers = vec![
        estargz(&base, 64 * 1024).expect("eStargz").stored(&base),
        lying.stored(&top),
    ];
    push_layers(registry, dir, repo_tag, layers);
}

fn push_layers(registry: &Registry, dir: &Path, repo_tag: &str, layers: Vec<StoredLayer>) {
    let image = lamina_sample::build_image_from(
        layers,
        &["PATH=/bin"],
        &["/bin/sh"],
        &lamina_image::Platform::host(),
    )
    .expect("building the image");
    let layout = dir.join(format!("layout-{}", repo_tag.replace(['/', ':'], "-")));
    lamina_sample::write_oci_layout(&layout, &[&image], &[(image.manifest.clone(), Some("v1"))])
        .expect("writing the layout");
    registry.push(&layout, "v1", repo_tag);
}

/// The `lamina daemon` processes serving `store` (found by their command line).
pub fn daemons_of(store: &Path) -> Vec<i32> {
    let store = store.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.iter().any(|a| a == "daemon") && args.contains(&store)
        })
        .collect()
}

/// Kills (SIGKILL) the daemons serving `store` and waits until they are gone.
pub fn kill_daemons(store: &Path) {
    for pid in daemons_of(store) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    crate::wait_until("the daemon to exit", || daemons_of(store).is_empty());
}
