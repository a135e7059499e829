//! Building hostile images: a good base layer under a bad top layer, and edits to a built
//! image's documents that keep every digest consistent but for the fault under test.

use std::path::Path;

use lamina_image::{Compression, Digest, Platform};
use lamina_sample::{BuiltImage, Layer, LayerBuilder, build_image, write_oci_layout};

/// The tag every corpus image is written under.
pub const TAG: &str = "evil";

/// A well-formed bottom layer, imported before the hostile one so that the store already
/// holds it when a case runs.
pub fn base_layer() -> Vec<u8> {
    LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|b| b.file("etc/hostname", 0o644, b"base\n"))
        .and_then(LayerBuilder::finish)
        .expect("building the base layer")
}

pub fn gzip(tar: Vec<u8>) -> Layer {
    Layer {
        tar,
        compression: Compression::Gzip,
    }
}

/// The base layer alone, and the base with `top` above it (layer 1), for this host.
pub fn base_only() -> BuiltImage {
    build(vec![gzip(base_layer())], &Platform::host())
}

pub fn with_top(top: Layer) -> BuiltImage {
    build(vec![gzip(base_layer()), top], &Platform::host())
}

/// The base with a top layer (layer 1) of one file, `name`, holding `data`.
pub fn with_top_file(name: &str, data: &[u8], compression: Compression) -> BuiltImage {
    let tar = LayerBuilder::new()
        .file(name, 0o644, data)
        .and_then(LayerBuilder::finish)
        .expect("building the top layer");
    with_top(Layer { tar, compression })
}

pub fn build(layers: Vec<Layer>, platform: &Platform) -> BuiltImage {
    build_image(&layers, &[], platform).expect("building an image")
}

/// Writes `image` as an OCI layout in `dir` and returns its `oci://` reference.
pub fn write(dir: &Path, image: &BuiltImage) -> String {
    write_oci_layout(dir, &[image], &[(image.manifest.clone(), Some(TAG))])
        .expect("writing an OCI layout");
    format!("oci://{}:{TAG}", dir.display())
}

/// Replaces a blob's bytes in a written layout, leaving every document naming it as is.
pub fn overwrite_blob(dir: &Path, digest: &Digest, bytes: &[u8]) {
    std::fs::write(dir.join("blobs/sha256").join(digest.hex()), bytes).expect("writing blob");
}

/// Replaces the config document and re-links the manifest (and so the index) to it.
pub fn set_config(image: &mut BuiltImage, bytes: Vec<u8>) {
    let old = image.config_digest.clone();
    image.blobs.remove(&old);
    let digest = Digest::of(&bytes);
    let size = bytes.len();
    image.blobs.insert(digest.clone(), bytes);
    image.config_digest = digest.clone();
    edit_manifest(image, |m| {
        m["config"]["digest"] = digest.to_string().into();
        m["config"]["size"] = size.into();
    });
}

/// Edits the config as JSON, keeping every digest consistent.
pub fn edit_config(image: &mut BuiltImage, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut config: serde_json::Value =
        serde_json::from_slice(&image.blobs[&image.config_digest]).expect("config JSON");
    edit(&mut config);
    set_config(image, serde_json::to_vec(&config).expect("encoding config"));
}

/// Replaces the manifest and points the image's root descriptor at it.
pub fn set_manifest(image: &mut BuiltImage, bytes: Vec<u8>) {
    image.blobs.remove(&image.manifest.digest);
    let digest = Digest::of(&bytes);
    image.manifest.digest = digest.clone();
    image.manifest.size = bytes.len() as u64;
    image.blobs.insert(digest, bytes);
}

pub fn edit_manifest(image: &mut BuiltImage, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&image.blobs[&image.manifest.digest]).expect("manifest JSON");
    edit(&mut manifest);
    set_manifest(
        image,
        serde_json::to_vec(&manifest).expect("encoding manifest"),
    );
}

/// Deterministic bytes that are no archive format: a xorshift stream.
pub fn noise(len: usize) -> Vec<u8> {
    let mut rng = crate::rng::Xorshift::new(0x9e37_79b9_7f4a_7c15);
    (0..len).map(|_| (rng.next_u64() >> 24) as u8).collect()
}
