//! A committed containerd snapshot's files never lend their inodes to objects (review
//! finding): its container may still write its upper through containerd's mount, and an
//! object is read by other images' composefs containers and, in a store that shares file
//! content, linked into other images' verified layers.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;

use lamina_image::{Compression, Digest, ImageRef, Platform, resolve};
use lamina_sample::{Layer, LayerBuilder, SAMPLE_MTIME, build_image, write_oci_layout};
use lamina_store::{Store, StoreProperties};
use lamina_sys::FakeMounter;

fn write_through_a_committed_upper(shared_file_content: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let properties = StoreProperties {
        shared_file_content,
        ..StoreProperties::default()
    };
    let store = Store::init_with(&tmp.path().join("store"), &properties).unwrap();
    let mounter = Arc::new(FakeMounter::new());
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();

    // A container's upper holding a file of another image's content and metadata, which
    // the container keeps open for writing while it is committed.
    let upper = store.layout().tmp().join("upper");
    fs::create_dir_all(upper.join("bin")).unwrap();
    let path = upper.join("bin/sh");
    fs::write(&path, &bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(SAMPLE_MTIME);
    let mut held = fs::OpenOptions::new().write(true).open(&path).unwrap();
    held.set_times(fs::FileTimes::new().set_modified(time).set_accessed(time))
        .unwrap();
    let committed = Digest::of(b"a committed snapshot");
    assert!(store.publish_layer_dir(&committed, &upper).unwrap());
    lamina_mount::composefs::ensure(&store, &*mounter, std::slice::from_ref(&committed)).unwrap();
    let committed_file = store.layout().layer_diff(&committed).join("bin/sh");

    // Another image of that file is pulled.
    let layer = LayerBuilder::new()
        .dir("bin", 0o755)
        .unwrap()
        .file("bin/sh", 0o755, &bytes)
        .unwrap();
    let built = build_image(
        &[Layer {
            tar: layer.finish().unwrap(),
            compression: Compression::None,
        }],
        &["PATH=/bin"],
        &Platform::host(),
    )
    .unwrap();
    let dir = tmp.path().join("image");
    write_oci_layout(&dir, &[&built], &[(built.manifest.clone(), Some("t"))]).unwrap();
    let reference = format!("oci://{}:t", dir.display());
    let image = resolve(&ImageRef::parse(&reference).unwrap(), &Platform::host()).unwrap();
    let other = store.import(&image).unwrap();
    let other_file = store.layout().layer_diff(&other[0]).join("bin/sh");
    let objects_dir = store.layout().objects();
    let object = fs::read_dir(&objects_dir)
        .unwrap()
        .flat_map(|fan_out| fs::read_dir(fan_out.unwrap().path()).unwrap())
        .map(|o| o.unwrap().path())
        .next()
        .expect("the build made an object");
    let ino = |p: &std::path::Path| fs::metadata(p).unwrap().ino();
    assert_ne!(
        ino(&object),
        ino(&committed_file),
        "a snapshot's inode is an object"
    );
    assert_ne!(ino(&other_file), ino(&committed_file));

    held.write_all(b"#!/bin/evil\n").unwrap();
    drop(held);
    assert_eq!(
        fs::read(&other_file).unwrap(),
        bytes,
        "another image's layer changed"
    );
    assert_eq!(fs::read(&object).unwrap(), bytes, "the object changed");
}

#[test]
fn a_write_through_a_committed_upper_reaches_no_other_image() {
    write_through_a_committed_upper(false);
}

#[test]
fn a_write_through_a_committed_upper_reaches_no_other_image_of_a_sharing_store() {
    write_through_a_committed_upper(true);
}

/// A store whose composefs build ran before builds copied committed snapshots' files:
/// its object is the snapshot file's own inode. The next build replaces it by a copy.
#[test]
fn an_object_an_older_build_made_of_a_snapshot_file_is_replaced_by_a_copy() {
    use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, Sha256HashValue};
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("store")).unwrap();
    let mounter = Arc::new(FakeMounter::new());
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    let upper = store.layout().tmp().join("upper");
    fs::create_dir_all(upper.join("bin")).unwrap();
    fs::write(upper.join("bin/sh"), &bytes).unwrap();
    let committed = Digest::of(b"a snapshot an older build used");
    assert!(store.publish_layer_dir(&committed, &upper).unwrap());
    let file = store.layout().layer_diff(&committed).join("bin/sh");
    // What the older build did: the snapshot's inode as the object.
    let mut hasher = FsVerityHasher::<Sha256HashValue, 12>::new();
    hasher.write_all(&bytes).unwrap();
    let object = store
        .layout()
        .objects()
        .join(hasher.digest().to_object_pathname());
    fs::create_dir_all(object.parent().unwrap()).unwrap();
    fs::hard_link(&file, &object).unwrap();

    // Any build repairs the store first.
    let other = Digest::of(b"another snapshot");
    let upper = store.layout().tmp().join("other");
    fs::create_dir_all(&upper).unwrap();
    fs::write(upper.join("f"), vec![1u8; 100]).unwrap();
    assert!(store.publish_layer_dir(&other, &upper).unwrap());
    lamina_mount::composefs::ensure(&store, &*mounter, std::slice::from_ref(&other)).unwrap();
    let ino = |p: &std::path::Path| fs::metadata(p).unwrap().ino();
    assert_ne!(
        ino(&object),
        ino(&file),
        "the object is still the snapshot's inode"
    );
    assert_eq!(fs::read(&object).unwrap(), bytes);
    assert_eq!(fs::metadata(&file).unwrap().nlink(), 1);
}
