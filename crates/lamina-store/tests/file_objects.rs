//! Each file's content stored once across layers and images (issue 24,
//! `lamina_store::file_objects`): what is linked, and what must never be.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_sample::LayerBuilder;
use lamina_store::file_objects::MANIFEST;
use lamina_store::{Store, StoreProperties};

/// Content shared by the images below: more than composefs keeps inline.
fn content(seed: u8) -> Vec<u8> {
    (0..20_000u32)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect()
}

struct Rig {
    tmp: tempfile::TempDir,
    store: Store,
    images: usize,
}

impl Rig {
    fn new() -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let properties = StoreProperties {
            shared_file_content: true,
            ..StoreProperties::default()
        };
        let store = Store::init_with(&tmp.path().join("store"), &properties).unwrap();
        Rig {
            tmp,
            store,
            images: 0,
        }
    }

    /// Imports an image of `layers` (bottom first); its chain IDs.
    fn import(&mut self, layers: Vec<LayerBuilder>) -> Vec<Digest> {
        self.images += 1;
        let dir = self.tmp.path().join(format!("image-{}", self.images));
        common::import_layers(&self.store, &dir, layers)
    }

    fn file(&self, chain_id: &Digest, rel: &str) -> PathBuf {
        self.store.layout().layer_diff(chain_id).join(rel)
    }

    fn objects(&self) -> usize {
        let mut n = 0;
        for fan_out in fs::read_dir(self.store.layout().objects()).unwrap() {
            n += fs::read_dir(fan_out.unwrap().path()).unwrap().count();
        }
        n
    }
}

fn inode(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap().ino()
}

fn layer() -> LayerBuilder {
    LayerBuilder::new()
}

#[test]
fn a_file_two_images_share_is_stored_once_and_reads_back_whole() {
    let mut rig = Rig::new();
    let a = rig.import(vec![
        layer()
            .file("usr/lib/shared.so", 0o755, &content(3))
            .unwrap(),
    ]);
    let b = rig.import(vec![
        layer().file("etc/other", 0o644, &content(5)).unwrap(),
        layer()
            .dir("opt", 0o755)
            .unwrap()
            .dir("opt/lib", 0o755)
            .unwrap()
            .file("opt/lib/copy.so", 0o755, &content(3))
            .unwrap(),
    ]);
    let first = rig.file(&a[0], "usr/lib/shared.so");
    let second = rig.file(&b[1], "opt/lib/copy.so");
    assert_eq!(
        inode(&first),
        inode(&second),
        "the shared content is two inodes"
    );
    assert_eq!(fs::read(&second).unwrap(), content(3));
    // Both layers' names and the object's.
    assert_eq!(fs::metadata(&second).unwrap().nlink(), 3);
    assert_eq!(rig.objects(), 2, "one object per content");
    // The directory the link went into keeps the time the image gave it.
    let dir = fs::metadata(rig.file(&b[1], "opt/lib")).unwrap();
    assert_eq!(dir.mtime() as u64, lamina_sample::SAMPLE_MTIME);
    assert!(fs::read_dir(rig.file(&b[1], "opt/lib")).unwrap().count() == 1);
    for chain_id in a.iter().chain(&b) {
        assert!(
            rig.store.layout().layer(chain_id).join(MANIFEST).is_file(),
            "a layer has no manifest"
        );
    }
}

#[test]
fn a_file_with_other_metadata_keeps_its_own_inode() {
    let mut rig = Rig::new();
    let a = rig.import(vec![layer().file("bin/tool", 0o755, &content(7)).unwrap()]);
    let b = rig.import(vec![layer().file("bin/tool", 0o4755, &content(7)).unwrap()]);
    let c = rig.import(vec![
        layer()
            .file_with_xattrs("bin/tool", 0o755, &content(7), &[("user.mark", b"x")])
            .unwrap(),
    ]);
    let inodes: Vec<u64> = [&a, &b, &c]
        .iter()
        .map(|chain| inode(&rig.file(&chain[0], "bin/tool")))
        .collect();
    assert_ne!(
        inodes[0], inodes[1],
        "a setuid file became a plain one's inode"
    );
    assert_ne!(inodes[0], inodes[2], "a file lost its xattrs to a link");
    assert_eq!(
        fs::metadata(rig.file(&b[0], "bin/tool")).unwrap().mode() & 0o7777,
        0o4755
    );
}

/// A container's view is a layer and the layers below it: two of its files sharing an
/// inode would be a hardlink the image does not have.
#[test]
fn no_image_shows_two_of_its_files_as_one_inode() {
    let mut rig = Rig::new();
    // The same content twice in one layer, and again in the layer above.
    let base = || {
        layer()
            .file("a", 0o644, &content(9))
            .unwrap()
            .file("b", 0o644, &content(9))
            .unwrap()
    };
    let one = rig.import(vec![base(), layer().file("c", 0o644, &content(9)).unwrap()]);
    let (a, b, c) = (
        inode(&rig.file(&one[0], "a")),
        inode(&rig.file(&one[0], "b")),
        inode(&rig.file(&one[1], "c")),
    );
    assert!(
        a != b && a != c && b != c,
        "one image's files share an inode"
    );
    // An image extending the first by a layer with that content again.
    let longer = rig.import(vec![
        base(),
        layer().file("c", 0o644, &content(9)).unwrap(),
        layer().file("d", 0o644, &content(9)).unwrap(),
    ]);
    assert_eq!(longer[..2], one[..]);
    let d = inode(&rig.file(&longer[2], "d"));
    assert!(
        ![a, b, c].contains(&d),
        "a layer's file linked to one below it"
    );
    // Another image's layer may share it: no view holds both.
    let other = rig.import(vec![layer().file("e", 0o644, &content(9)).unwrap()]);
    assert!([a, b, c, d].contains(&inode(&rig.file(&other[0], "e"))));
}

#[test]
fn two_files_of_one_layer_never_become_one_inode() {
    let mut rig = Rig::new();
    let other = rig.import(vec![layer().file("x", 0o644, &content(31)).unwrap()]);
    let layer = rig.import(vec![
        layer()
            .file("a", 0o644, &content(31))
            .unwrap()
            .file("b", 0o644, &content(31))
            .unwrap(),
    ]);
    let (a, b) = (
        inode(&rig.file(&layer[0], "a")),
        inode(&rig.file(&layer[0], "b")),
    );
    assert_ne!(a, b, "two files of one layer became one inode");
    assert!([a, b].contains(&inode(&rig.file(&other[0], "x"))));
}

#[test]
fn a_layer_whose_lower_layers_are_unknown_neither_links_nor_publishes() {
    let mut rig = Rig::new();
    let base = || layer().file("base", 0o644, &content(11)).unwrap();
    let first = rig.import(vec![base()]);
    // As a layer from before manifests (or a committed snapshot) has none.
    fs::remove_file(rig.store.layout().layer(&first[0]).join(MANIFEST)).unwrap();
    let objects = rig.objects();
    let _other = rig.import(vec![layer().file("x", 0o644, &content(13)).unwrap()]);
    assert_eq!(rig.objects(), objects + 1);
    let upper = rig.import(vec![
        base(),
        layer()
            .file("x", 0o644, &content(13))
            .unwrap()
            .file("y", 0o644, &content(17))
            .unwrap(),
    ]);
    assert_eq!(upper[0], first[0]);
    assert_ne!(
        inode(&rig.file(&upper[1], "x")),
        inode(&rig.file(&_other[0], "x")),
        "linked above a layer of unknown content"
    );
    assert_eq!(
        rig.objects(),
        objects + 1,
        "published above a layer of unknown content"
    );
    // Its manifest is written all the same (what is above it is unknown anyway).
    assert!(rig.store.layout().layer(&upper[1]).join(MANIFEST).is_file());
}

#[test]
fn a_store_that_does_not_share_file_content_links_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rig = Rig {
        store: Store::init(&tmp.path().join("store")).unwrap(),
        tmp,
        images: 0,
    };
    let a = rig.import(vec![layer().file("f", 0o644, &content(29)).unwrap()]);
    let b = rig.import(vec![layer().file("g", 0o644, &content(29)).unwrap()]);
    assert_ne!(inode(&rig.file(&a[0], "f")), inode(&rig.file(&b[0], "g")));
    assert_eq!(fs::metadata(rig.file(&b[0], "g")).unwrap().nlink(), 1);
    assert_eq!(rig.objects(), 0);
    assert!(!rig.store.layout().layer(&a[0]).join(MANIFEST).exists());
}

#[test]
fn an_object_whose_bytes_are_not_its_name_is_not_linked_to() {
    let mut rig = Rig::new();
    let a = rig.import(vec![layer().file("f", 0o644, &content(19)).unwrap()]);
    // Damage the object (a copy of its own, so the layer keeps its bytes).
    let objects = rig.store.layout().objects();
    let fan_out = fs::read_dir(&objects)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let object = fs::read_dir(&fan_out)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let meta = fs::metadata(&object).unwrap();
    let mut damaged = content(19);
    damaged[100] ^= 1;
    let copy = objects.join("copy");
    fs::write(&copy, &damaged).unwrap();
    fs::set_permissions(&copy, meta.permissions()).unwrap();
    let mtime = std::fs::FileTimes::new().set_modified(meta.modified().unwrap());
    fs::File::options()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_times(mtime)
        .unwrap();
    fs::rename(&copy, &object).unwrap();

    let b = rig.import(vec![layer().file("g", 0o644, &content(19)).unwrap()]);
    let g = rig.file(&b[0], "g");
    assert_ne!(inode(&g), inode(&object), "linked to a damaged object");
    assert_eq!(fs::read(&g).unwrap(), content(19));
    assert_eq!(fs::read(rig.file(&a[0], "f")).unwrap(), content(19));
}

#[test]
fn a_hardlink_set_of_a_layer_never_becomes_an_object() {
    let mut rig = Rig::new();
    let _set = rig.import(vec![
        layer()
            .file("g", 0o644, &content(37))
            .unwrap()
            .hardlink("h", "g")
            .unwrap(),
    ]);
    assert_eq!(
        rig.objects(),
        0,
        "a hardlink set lent its inode to other images"
    );
}

#[test]
fn a_hardlink_set_of_a_layer_stays_one() {
    let mut rig = Rig::new();
    let _a = rig.import(vec![layer().file("f", 0o644, &content(23)).unwrap()]);
    let b = rig.import(vec![
        layer()
            .file("g", 0o644, &content(23))
            .unwrap()
            .hardlink("h", "g")
            .unwrap(),
    ]);
    assert_eq!(
        inode(&rig.file(&b[0], "g")),
        inode(&rig.file(&b[0], "h")),
        "a layer's hardlink was split"
    );
}

/// A lamina from before sharing accepts only version 1: a sharing store's marker says 4
/// (2 from a lamina before symlink records), so such a lamina refuses it rather than open
/// it and link snapshots' inodes as objects.
#[test]
fn a_sharing_store_is_marked_so_that_an_older_lamina_refuses_it() {
    let rig = Rig::new();
    let marker = rig.store.layout().marker();
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&marker).unwrap()).unwrap();
    assert_eq!(json["version"], 4, "{json}");
    assert!(Store::open(rig.store.root()).is_ok());
    // A sharing store from before symlink records opens, and keeps its records files.
    let mut earlier = json.clone();
    earlier["version"] = 2.into();
    fs::write(&marker, serde_json::to_vec(&earlier).unwrap()).unwrap();
    assert!(!Store::open(rig.store.root()).unwrap().symlink_records());
    // A marker that says otherwise is no store this lamina opens either.
    for version in [1, 3] {
        let mut forged = json.clone();
        forged["version"] = version.into();
        fs::write(&marker, serde_json::to_vec(&forged).unwrap()).unwrap();
        assert!(Store::open(rig.store.root()).is_err(), "{version}");
    }
}
