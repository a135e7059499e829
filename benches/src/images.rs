//! Deterministic benchmark images, built in code: the busybox sample, a layer of many
//! small files (the copy-up storm's lower), a many-layer image, and a large mixed layer
//! for import. Same bytes every run, so runs compare.

use std::path::Path;

use lamina_image::{Compression, Platform};
use lamina_sample::{BuiltImage, Layer, LayerBuilder, build_image, write_oci_layout};

/// The tag every benchmark layout is written under.
pub const TAG: &str = "bench";

/// Resolves a benchmark image reference for this host's platform.
pub fn resolve(reference: &str) -> lamina_image::Image {
    lamina_image::resolve(
        &lamina_image::ImageRef::parse(reference).expect("image reference"),
        &Platform::host(),
    )
    .expect("resolving a benchmark image")
}

/// The busybox sample image as an `oci://` reference under `dir`.
pub fn sample(dir: &Path) -> String {
    lamina_integration::sample_image(dir).references()[0].clone()
}

/// Writes `image` as an OCI layout at `dir` and returns its `oci://` reference.
pub fn write_layout(dir: &Path, image: &BuiltImage) -> String {
    write_oci_layout(dir, &[image], &[(image.manifest.clone(), Some(TAG))])
        .expect("writing a benchmark image");
    format!("oci://{}:{TAG}", dir.display())
}

/// One uncompressed layer of `dirs` directories holding `files` files of `size` bytes
/// each, named like a Python package (`pkg3/mod17.py`).
pub fn many_files(dir: &Path, dirs: usize, files: usize, size: usize) -> String {
    let mut layer = LayerBuilder::new();
    let mut text = Text::new(7);
    for d in 0..dirs {
        layer = layer.dir(&format!("pkg{d}"), 0o755).expect("layer dir");
        for f in 0..files {
            let data = text.bytes(size);
            layer = layer
                .file(&format!("pkg{d}/mod{f}.py"), 0o644, &data)
                .expect("layer file");
        }
    }
    let image = image(vec![layer.finish().expect("layer")], Compression::None);
    write_layout(dir, &image)
}

/// An image of `count` small layers, each adding one directory with one file.
pub fn many_layers(dir: &Path, count: usize) -> String {
    let tars = (0..count)
        .map(|i| {
            LayerBuilder::new()
                .dir(&format!("layer{i}"), 0o755)
                .and_then(|l| l.file(&format!("layer{i}/file"), 0o644, format!("{i}").as_bytes()))
                .and_then(LayerBuilder::finish)
                .expect("layer")
        })
        .collect();
    write_layout(dir, &image(tars, Compression::None))
}

/// An uncompressed layer of about `total` bytes shaped like a language runtime: 70% of
/// the bytes in 4 MiB files, the rest in 4 KiB files, 200 per directory. The content is
/// text drawn from a small vocabulary, so it compresses about as well as real files.
pub fn large_layer(total: usize) -> Vec<u8> {
    large_layer_seeded(total, 42)
}

/// [`large_layer`] with its text drawn from `seed`: distinct seeds make distinct layers
/// (an image of several, none deduplicated).
pub fn large_layer_seeded(total: usize, seed: u64) -> Vec<u8> {
    const LARGE: usize = 4 << 20;
    const SMALL: usize = 4 << 10;
    let mut text = Text::new(seed);
    let mut layer = LayerBuilder::new();
    let large_count = (total * 7 / 10) / LARGE;
    let small_count = (total - large_count * LARGE) / SMALL;
    layer = layer.dir("lib", 0o755).expect("layer dir");
    for i in 0..large_count {
        let data = text.bytes(LARGE);
        layer = layer
            .file(&format!("lib/big{i}.so"), 0o755, &data)
            .expect("layer file");
    }
    for i in 0..small_count {
        if i % 200 == 0 {
            layer = layer
                .dir(&format!("d{}", i / 200), 0o755)
                .expect("layer dir");
        }
        let data = text.bytes(SMALL);
        layer = layer
            .file(&format!("d{}/f{i}", i / 200), 0o644, &data)
            .expect("layer file");
    }
    layer.finish().expect("layer")
}

/// Two images holding the same `files` files of `size` bytes (same names, modes and
/// contents), layered differently: one layer with all of them, and `split` layers of an
/// equal share each. Returns their `oci://` references and the files' paths.
pub fn shared_files(
    dir: &Path,
    files: usize,
    size: usize,
    split: usize,
) -> ([String; 2], Vec<String>) {
    let mut text = Text::new(11);
    let contents: Vec<(String, Vec<u8>)> = (0..files)
        .map(|f| (format!("shared/file{f}"), text.bytes(size)))
        .collect();
    let layer_of = |part: &[(String, Vec<u8>)]| {
        let mut layer = LayerBuilder::new().dir("shared", 0o755).expect("layer dir");
        for (path, data) in part {
            layer = layer.file(path, 0o644, data).expect("layer file");
        }
        layer.finish().expect("layer")
    };
    let one = image(vec![layer_of(&contents)], Compression::None);
    let chunk = files.div_ceil(split.max(1));
    let many = image(
        contents.chunks(chunk).map(layer_of).collect(),
        Compression::None,
    );
    let refs = [
        write_layout(&dir.join("one-layer"), &one),
        write_layout(&dir.join("many-layers"), &many),
    ];
    (refs, contents.into_iter().map(|(p, _)| p).collect())
}

/// An image of `tars` (bottom first), every layer stored with `compression`.
pub fn image(tars: Vec<Vec<u8>>, compression: Compression) -> BuiltImage {
    let layers: Vec<Layer> = tars
        .into_iter()
        .map(|tar| Layer { tar, compression })
        .collect();
    build_image(&layers, &["PATH=/bin"], &Platform::host()).expect("building an image")
}

/// Deterministic, compressible text (xorshift over a fixed vocabulary).
struct Text {
    state: u64,
}

const WORDS: &[&str] = &[
    "import ",
    "def ",
    "return ",
    "self",
    ".value",
    " = ",
    "None",
    "\n    ",
    "if ",
    "for ",
    " in ",
    "range(",
    ")",
    ":\n",
    "class ",
    "lamina",
    "layer",
    "mount",
    "overlay",
    "0x",
    "error",
    "path",
    "#include ",
    "static ",
    "int ",
    "{\n",
    "}\n",
    ";\n",
    "const ",
    "char",
];

impl Text {
    fn new(seed: u64) -> Self {
        Self { state: seed | 1 }
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            let r = self.next();
            out.extend_from_slice(WORDS[(r % WORDS.len() as u64) as usize].as_bytes());
            // Some entropy, as in real binaries and identifiers.
            out.extend_from_slice(&(r >> 40).to_le_bytes()[..2]);
        }
        out.truncate(len);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_deterministic_and_sized() {
        assert_eq!(Text::new(1).bytes(1000), Text::new(1).bytes(1000));
        assert_eq!(Text::new(1).bytes(1000).len(), 1000);
    }

    #[test]
    fn large_layer_has_the_requested_size() {
        let tar = large_layer(16 << 20);
        assert!(tar.len() >= 16 << 20, "{}", tar.len());
        assert!(tar.len() < 20 << 20, "{}", tar.len());
    }
}
