//! A committed containerd snapshot's files change under a composefs build, as its
//! container can make them: one swapped for a symlink to a host file, one written
//! through a descriptor the container kept. The build pauses between its merge and its
//! reads of the files (`LAMINA_PAUSE_AT=composefs-merged`) while this test does what the
//! container would. The build runs in a child: this test binary run again, for
//! [`build_in_child`] alone, with the pause in its environment.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::{Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, Sha256HashValue};
use lamina_image::Digest;
use lamina_store::Store;
use lamina_sys::FakeMounter;

/// Every object in the store, with its bytes.
fn objects(store: &Store) -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    for fan_out in fs::read_dir(store.layout().objects()).unwrap() {
        let fan_out = fan_out.unwrap().path();
        for object in fs::read_dir(&fan_out).unwrap() {
            let path = object.unwrap().path();
            let name = path.strip_prefix(store.layout().objects()).unwrap();
            all.push((name.display().to_string(), fs::read(&path).unwrap()));
        }
    }
    all
}

fn object_name(bytes: &[u8]) -> String {
    let mut hasher = FsVerityHasher::<Sha256HashValue, 12>::new();
    hasher.write_all(bytes).unwrap();
    hasher.digest().to_object_pathname()
}

/// Waits for the build to reach its pause at `point` (its marker in `run/`).
fn wait_for_pause(store: &Store, point: &str) {
    let started = Instant::now();
    loop {
        let paused = fs::read_dir(store.layout().run()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("paused-{point}."))
        });
        if paused {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the build never paused"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The build, when run by [`a_snapshot_changed_under_the_build_puts_neither_a_host_file_nor_a_misnamed_object_in_the_store`]
/// (which passes the store and the layer in the environment); nothing otherwise.
#[test]
#[ignore = "run by the swap test as its child"]
fn build_in_child() {
    let (Ok(root), Ok(layer)) = (std::env::var("SWAP_STORE"), std::env::var("SWAP_LAYER")) else {
        return;
    };
    let store = Store::open(Path::new(&root)).unwrap();
    let layer = Digest::parse(&layer).unwrap();
    let built = lamina_mount::composefs::ensure(&store, &FakeMounter::new(), &[layer]);
    println!("built: {:?}", built.map(|_| ()));
}

/// Runs the build of `layer` in a child paused between its merge and its reads, calls
/// `during` at the pause, and returns what the child printed.
fn paused_build(store: &Store, layer: &Digest, during: impl FnOnce()) -> String {
    paused_build_at("composefs-merged", store, layer, during)
}

/// [`paused_build`], paused at `point`.
fn paused_build_at(point: &str, store: &Store, layer: &Digest, during: impl FnOnce()) -> String {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "build_in_child", "--ignored", "--nocapture"])
        .env("SWAP_STORE", store.root())
        .env("SWAP_LAYER", layer.to_string())
        .env("LAMINA_PAUSE_AT", point)
        .env("LAMINA_PAUSE_SECS", "2")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_pause(store, point);
    during();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}");
    said
}

/// A committed snapshot whose upper holds `files`.
fn committed(store: &Store, files: &[(&str, Vec<u8>)]) -> Digest {
    let upper = store.layout().tmp().join("upper");
    for (path, bytes) in files {
        let path = upper.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }
    let committed = Digest::of(b"a committed snapshot");
    assert!(store.publish_layer_dir(&committed, &upper).unwrap());
    committed
}

#[test]
fn a_snapshot_changed_under_the_build_puts_neither_a_host_file_nor_a_misnamed_object_in_the_store()
{
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("store")).unwrap();
    let secret = tmp.path().join("host-secret");
    fs::write(
        &secret,
        "a host file the container must not read\n".repeat(10),
    )
    .unwrap();
    let layer = committed(
        &store,
        &[
            ("bin/tool", vec![7u8; 100_000]),
            ("bin/sh", vec![9u8; 5000]),
        ],
    );
    let diff = store.layout().layer_diff(&layer);
    let mut held = fs::OpenOptions::new()
        .write(true)
        .open(diff.join("bin/tool"))
        .unwrap();
    let said = paused_build(&store, &layer, || {
        // What the snapshot's container does meanwhile.
        let swapped = diff.join("bin/sh.new");
        std::os::unix::fs::symlink(&secret, &swapped).unwrap();
        fs::rename(&swapped, diff.join("bin/sh")).unwrap();
        held.seek(std::io::SeekFrom::Start(0)).unwrap();
        held.write_all(b"#!/bin/evil\n").unwrap();
    });
    // The build refused the swapped file: it does not follow a symlink beneath a layer.
    assert!(said.contains("built: Err"), "{said}");
    let secret_bytes = fs::read(&secret).unwrap();
    for (name, bytes) in objects(&store) {
        assert_ne!(bytes, secret_bytes, "a host file became object {name}");
        assert_eq!(name, object_name(&bytes), "object {name} holds other bytes");
    }
}

#[test]
fn a_snapshot_file_grown_under_the_build_is_refused_and_leaves_no_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("store")).unwrap();
    let layer = committed(&store, &[("bin/grow", vec![5u8; 10_000])]);
    let diff = store.layout().layer_diff(&layer);
    let said = paused_build(&store, &layer, || {
        // Free for the container: a sparse file of 300 MB.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(diff.join("bin/grow"))
            .unwrap();
        file.set_len(300 << 20).unwrap();
    });
    assert!(
        said.contains("built: Err") && said.contains("changed since"),
        "{said}"
    );
    assert!(objects(&store).is_empty(), "a grown file became an object");
    let left: Vec<_> = fs::read_dir(store.layout().tmp())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?} left in tmp/");
}

#[test]
fn a_snapshot_directory_swapped_for_a_host_directory_under_the_merge_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("store")).unwrap();
    // A host directory holding what the layer's `d/` lists (`e/`), read by name if the
    // merge resolved paths: no regular file in either, so the build has nothing to open
    // that would fail it.
    let host_dir = tmp.path().join("host");
    fs::create_dir_all(host_dir.join("e/a-host-directory-name")).unwrap();
    let upper = store.layout().tmp().join("upper");
    fs::create_dir_all(upper.join("d/e")).unwrap();
    std::os::unix::fs::symlink("elsewhere", upper.join("d/e/link")).unwrap();
    let layer = Digest::of(b"a committed snapshot of directories");
    assert!(store.publish_layer_dir(&layer, &upper).unwrap());
    let diff = store.layout().layer_diff(&layer);
    // Paused once `d/` is listed: `d` is swapped for a symlink to the host directory.
    let said = paused_build_at("composefs-listed", &store, &layer, || {
        fs::rename(diff.join("d"), diff.join("d.old")).unwrap();
        std::os::unix::fs::symlink(&host_dir, diff.join("d")).unwrap();
    });
    assert!(said.contains("built: Ok"), "{said}");
    let image = lamina_mount::composefs::image_path(&store, &layer);
    let bytes = fs::read(&image).unwrap();
    assert!(
        !bytes.windows(21).any(|w| w == b"a-host-directory-name"),
        "the image holds a host directory's name"
    );
    assert!(
        bytes.windows(9).any(|w| w == b"elsewhere"),
        "the layer's own link is missing"
    );
}
