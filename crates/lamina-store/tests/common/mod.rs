//! What the store's tests share: an image of built layers, imported.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use lamina_image::{Compression, Digest, ImageRef, Platform, resolve};
use lamina_sample::{Layer, LayerBuilder, build_image, write_oci_layout};
use lamina_store::Store;

/// Imports into `store` an image of `layers` (bottom first), written as an OCI layout at
/// `dir`; its chain IDs.
pub fn import_layers(store: &Store, dir: &Path, layers: Vec<LayerBuilder>) -> Vec<Digest> {
    let layers: Vec<Layer> = layers
        .into_iter()
        .map(|l| Layer {
            tar: l.finish().unwrap(),
            compression: Compression::None,
        })
        .collect();
    let built = build_image(&layers, &["PATH=/bin"], &Platform::host()).unwrap();
    write_oci_layout(dir, &[&built], &[(built.manifest.clone(), Some("t"))]).unwrap();
    let reference = format!("oci://{}:t", dir.display());
    let image = resolve(&ImageRef::parse(&reference).unwrap(), &Platform::host()).unwrap();
    store.import(&image).unwrap()
}
