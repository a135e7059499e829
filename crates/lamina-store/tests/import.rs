//! Imports sample images into a real store and checks what lands on disk.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use lamina_image::{ImageRef, Platform, resolve};
use lamina_sample::{SampleFiles, busybox_image, write_all_formats};
use lamina_store::{Store, StoreError};

fn setup(tmp: &Path) -> (Store, SampleFiles) {
    let busybox = tmp.join("fake-busybox");
    fs::write(&busybox, b"#!/bin/true\n").unwrap();
    let files = write_all_formats(&busybox_image(&busybox).unwrap(), &tmp.join("image")).unwrap();
    (Store::init(&tmp.join("store")).unwrap(), files)
}

fn image(reference: &str) -> lamina_image::Image {
    resolve(&ImageRef::parse(reference).unwrap(), &Platform::host()).unwrap()
}

fn dir_names(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn import_unpacks_each_layer_once_under_its_chain_id() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, files) = setup(tmp.path());
    let [oci, oci_archive, docker, rootfs] = files.references();

    let chain = store.import(&image(&oci)).unwrap();
    assert_eq!(chain.len(), 2);
    let top = store.layout().layer_diff(&chain[1]);
    assert_eq!(
        fs::read_to_string(top.join("top.txt")).unwrap(),
        "from the top layer\n"
    );
    assert_eq!(
        fs::read_to_string(store.layout().layer_diff(&chain[0]).join("old/gone.txt")).unwrap(),
        "the top layer whites this out\n"
    );

    // The same image in other forms, and its base layer as a rootfs tar, share the layers.
    for reference in [&oci_archive, &docker] {
        assert_eq!(store.import(&image(reference)).unwrap(), chain);
    }
    assert_eq!(
        store.import(&image(&rootfs)).unwrap(),
        vec![chain[0].clone()]
    );
    assert_eq!(dir_names(&store.layout().layers()).len(), 2);
    assert!(dir_names(&store.layout().tmp()).is_empty());
}

#[test]
fn concurrent_imports_of_one_image_all_succeed() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, files) = setup(tmp.path());
    let reference = files.references()[0].clone();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| store.import(&image(&reference))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(dir_names(&store.layout().layers()).len(), 2);
}

#[test]
fn a_tampered_blob_fails_naming_both_digests_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, files) = setup(tmp.path());
    let mut resolved = image(&files.references()[0]);
    let top = resolved.layers[1].digest.clone().unwrap();
    let blob = files.oci_layout.join("blobs/sha256").join(top.hex());
    // Same content, compressed differently: it decodes fine, only the digest is wrong.
    let tar = zstd::decode_all(fs::read(&blob).unwrap().as_slice()).unwrap();
    let recompressed = zstd::encode_all(tar.as_slice(), 19).unwrap();
    let actual = lamina_image::Digest::of(&recompressed);
    assert_ne!(actual, top);
    fs::write(&blob, &recompressed).unwrap();
    resolved.layers[1].size = Some(recompressed.len() as u64);

    let err = store.import(&resolved).unwrap_err().to_string();
    assert!(
        err.contains("layer 1") && err.contains("blob digest mismatch"),
        "{err}"
    );
    assert!(
        err.contains(&top.to_string()) && err.contains(&actual.to_string()),
        "{err}"
    );
    // The bad layer is nowhere. The base layer, imported alongside, is whole or absent:
    // it stays if it finished first, and is cancelled if the failure came first.
    let base = resolved.chain_ids()[0].hex().to_string();
    let layers = dir_names(&store.layout().layers());
    assert!(layers.is_empty() || layers == vec![base], "{layers:?}");
    assert!(dir_names(&store.layout().tmp()).is_empty());
}

#[test]
fn a_diff_id_mismatch_fails_naming_both_digests() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _files) = setup(tmp.path());
    let mut resolved = image(&_files.references()[2]);
    let wrong = lamina_image::Digest::of(b"not this layer");
    resolved.layers[0].diff_id = wrong.clone();
    let err = store.import(&resolved).unwrap_err().to_string();
    assert!(
        err.contains("diffID mismatch") && err.contains(&wrong.to_string()),
        "{err}"
    );
    // The bad layer is nowhere. The layer above it, imported alongside, may stay: it was
    // verified against its own diffID (and a failure stops only imports not yet begun).
    let layers = dir_names(&store.layout().layers());
    assert!(
        !layers.contains(&resolved.chain_ids()[0].hex().to_string()),
        "{layers:?}"
    );
    assert!(layers.len() <= 1, "{layers:?}");
    assert!(dir_names(&store.layout().tmp()).is_empty());
}

#[test]
fn a_layer_over_the_size_limit_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, files) = setup(tmp.path());
    let store = store.with_max_layer_bytes(1024);
    let err = store
        .import(&image(&files.references()[0]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("limit of 1024 bytes"), "{err}");
    assert!(dir_names(&store.layout().layers()).is_empty());
}

#[test]
fn store_init_and_open_guard_against_wrong_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    assert!(matches!(
        Store::open(&missing),
        Err(StoreError::NotInitialised(_))
    ));
    let busy = tmp.path().join("data");
    fs::create_dir(&busy).unwrap();
    fs::write(busy.join("precious"), "x").unwrap();
    let err = Store::init(&busy).unwrap_err().to_string();
    assert!(err.contains("not a lamina store"), "{err}");
    let store = Store::init(&tmp.path().join("s")).unwrap();
    Store::init(store.root()).unwrap();
}

#[test]
fn container_ids_are_claimed_once_and_validated() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("s")).unwrap();
    let claim = store.create_container_dirs("web-1").unwrap();
    let dirs = &claim.dirs;
    assert!(dirs.rootfs.ends_with("images/web-1/rootfs"));
    assert!(matches!(
        store.create_container_dirs("web-1"),
        Err(StoreError::AlreadyExists(_))
    ));
    for bad in ["a/b", "..", "", ".hidden"] {
        assert!(
            matches!(
                store.create_container_dirs(bad),
                Err(StoreError::InvalidId { .. })
            ),
            "{bad}"
        );
    }
    assert_eq!(store.id_from_path(&dirs.rootfs).as_deref(), Some("web-1"));
    assert!(
        store.containers().unwrap().is_empty(),
        "no record yet, so not listed"
    );
    assert!(store.remove_container_dirs("web-1").unwrap());
    assert!(!store.remove_container_dirs("web-1").unwrap());
}
