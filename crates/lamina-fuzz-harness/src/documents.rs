//! Image documents: any index, manifest, config or docker-archive either resolves to an
//! image whose parts agree, or is refused with an error — never a panic, never a hang.

use std::fs;

use lamina_image::{Digest, ImageRef, Platform};

/// Splits `data` at NUL bytes (which JSON cannot hold) into index.json, a manifest and a config, and writes them as an
/// OCI layout with one small layer blob. So that the fuzzer can reach past digest checks,
/// `@M`, `@C` and `@L` in the documents are replaced by the manifest's, the config's and
/// the layer's digests (`@m`, `@c`, `@l` by their sizes). Returns whether it resolved.
pub fn oci_documents(data: &[u8]) -> bool {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (Some(index), Some(manifest), Some(config)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let scratch = crate::scratch::dir();
    let dir = scratch.path();
    fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir blobs");
    let put = |bytes: &[u8]| {
        let digest = Digest::of(bytes);
        fs::write(dir.join("blobs/sha256").join(digest.hex()), bytes).expect("write blob");
        (digest.to_string(), bytes.len().to_string())
    };
    let layer = put(LAYER);
    let config = put(config);
    let fill = |doc: &[u8], marks: &[(&str, &(String, String))]| {
        let mut text = String::from_utf8_lossy(doc).into_owned();
        for (mark, (digest, size)) in marks {
            text = text.replace(&format!("@{}", mark.to_uppercase()), digest);
            text = text.replace(&format!("@{mark}"), size);
        }
        text.into_bytes()
    };
    let manifest = put(&fill(manifest, &[("c", &config), ("l", &layer)]));
    fs::write(dir.join("index.json"), fill(index, &[("m", &manifest)])).expect("write index");
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("layout");

    let reference = ImageRef::parse(&format!("oci://{}", dir.display())).expect("oci ref");
    check(&reference)
}

/// Writes `data` as a `docker save` tar and resolves it. Returns whether it resolved.
pub fn docker_archive(data: &[u8]) -> bool {
    let scratch = crate::scratch::dir();
    let path = scratch.path().join("image.tar");
    fs::write(&path, data).expect("write archive");
    let reference =
        ImageRef::parse(&format!("docker-archive://{}", path.display())).expect("archive ref");
    check(&reference)
}

/// A resolved image must be self-consistent: one diffID per layer, chain IDs for each, and
/// every layer blob openable. Returns whether it resolved.
fn check(reference: &ImageRef) -> bool {
    let Ok(image) = lamina_image::resolve(reference, &Platform::host()) else {
        return false;
    };
    assert_eq!(image.chain_ids().len(), image.layers.len());
    for layer in &image.layers {
        let _ = layer.location.open();
    }
    true
}

/// An empty tar archive (two zero blocks): a valid uncompressed layer.
const LAYER: &[u8] = &[0; 1024];
