//! A committed containerd snapshot's files never lend their inodes to objects: its
//! container may still write its upper through containerd's mount, and an object is read
//! by other images' composefs containers and, in a store that shares file content,
//! linked into other images' verified layers.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
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
/// its objects are the snapshot files' own inodes. The next build replaces each by a copy,
/// or, where the snapshot's container has written it already, removes its name.
#[test]
fn objects_an_older_build_made_of_snapshot_files_are_replaced_or_removed() {
    use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, Sha256HashValue};
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("store")).unwrap();
    let mounter = Arc::new(FakeMounter::new());
    let intact: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    let written: Vec<u8> = (0..5000u32).map(|i| (i % 239) as u8).collect();
    let upper = store.layout().tmp().join("upper");
    fs::create_dir_all(upper.join("bin")).unwrap();
    fs::write(upper.join("bin/sh"), &intact).unwrap();
    fs::write(upper.join("bin/tool"), &written).unwrap();
    let committed = Digest::of(b"a snapshot an older build used");
    assert!(store.publish_layer_dir(&committed, &upper).unwrap());
    let diff = store.layout().layer_diff(&committed);
    // What the older build did: the snapshot's inodes as the objects.
    let object_of = |file: &std::path::Path| {
        let mut hasher = FsVerityHasher::<Sha256HashValue, 12>::new();
        hasher.write_all(&fs::read(file).unwrap()).unwrap();
        let object = store
            .layout()
            .objects()
            .join(hasher.digest().to_object_pathname());
        fs::create_dir_all(object.parent().unwrap()).unwrap();
        fs::hard_link(file, &object).unwrap();
        object
    };
    let sh = object_of(&diff.join("bin/sh"));
    let tool = object_of(&diff.join("bin/tool"));
    // The container has written one of them since.
    fs::OpenOptions::new()
        .write(true)
        .open(diff.join("bin/tool"))
        .unwrap()
        .write_all(b"#!/bin/evil\n")
        .unwrap();

    // Any build repairs the store first.
    let other = Digest::of(b"another snapshot");
    let upper = store.layout().tmp().join("other");
    fs::create_dir_all(&upper).unwrap();
    fs::write(upper.join("f"), vec![1u8; 100]).unwrap();
    assert!(store.publish_layer_dir(&other, &upper).unwrap());
    lamina_mount::composefs::ensure(&store, &*mounter, std::slice::from_ref(&other)).unwrap();
    let ino = |p: &std::path::Path| fs::metadata(p).unwrap().ino();
    assert_ne!(
        ino(&sh),
        ino(&diff.join("bin/sh")),
        "an object is still the snapshot's inode"
    );
    assert_eq!(fs::read(&sh).unwrap(), intact);
    assert_eq!(fs::metadata(diff.join("bin/sh")).unwrap().nlink(), 1);
    assert!(
        !tool.exists(),
        "an object whose bytes the container wrote is still named"
    );
    assert!(
        store
            .layout()
            .composefs()
            .join("snapshot-objects-copied")
            .is_file()
    );
    assert!(
        !fs::read_dir(store.layout().tmp()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("composefs-repair")),
        "a repair copy left in tmp/"
    );
}
