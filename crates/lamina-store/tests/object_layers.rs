//! Layers that keep their data in `objects/` (`lamina_store::object_layers`): each
//! content once, and each layer file a stub of its own — what is moved, what is kept,
//! and what a stub carries. (Mounting them is `integration/tests/object_layers.rs`.)

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use composefs::fsverity::{FsVerityHasher, Sha256HashValue};
use lamina_image::Digest;
use lamina_sample::LayerBuilder;
use lamina_store::object_layers::{REDIRECT_XATTR, short_name, stub_object};
use lamina_store::{LayerRecord, Store, StoreProperties};

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
    /// `None` without root: stubs carry `trusted.*` xattrs.
    fn new() -> Option<Rig> {
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let properties = StoreProperties {
            layer_data_in_objects: true,
            ..StoreProperties::default()
        };
        let store = Store::init_with(&tmp.path().join("store"), &properties).unwrap();
        Some(Rig {
            tmp,
            store,
            images: 0,
        })
    }

    fn import(&mut self, layers: Vec<LayerBuilder>) -> Vec<Digest> {
        self.images += 1;
        let dir = self.tmp.path().join(format!("image-{}", self.images));
        common::import_layers(&self.store, &dir, layers)
    }

    fn file(&self, chain_id: &Digest, rel: &str) -> PathBuf {
        self.store.layout().layer_diff(chain_id).join(rel)
    }

    fn object_of(&self, path: &Path) -> Option<PathBuf> {
        stub_object(&lamina_sys::RealHost, lamina_sys::At::Path(path))
            .unwrap()
            .map(|short| self.store.layout().objects().join(short))
    }

    fn objects(&self) -> usize {
        let mut n = 0;
        for fan_out in fs::read_dir(self.store.layout().objects()).unwrap() {
            n += fs::read_dir(fan_out.unwrap().path()).unwrap().count();
        }
        n
    }
}

fn digest(bytes: &[u8]) -> Sha256HashValue {
    FsVerityHasher::<Sha256HashValue, 12>::hash(bytes)
}

fn layer() -> LayerBuilder {
    LayerBuilder::new()
}

#[test]
fn a_content_two_images_hold_is_one_object_and_each_layer_keeps_a_stub_of_its_own() {
    let Some(mut rig) = Rig::new() else { return };
    let a = rig.import(vec![
        layer()
            .file_with_xattrs(
                "usr/lib/shared.so",
                0o4755,
                &content(3),
                &[("user.note", b"a")],
            )
            .unwrap(),
    ]);
    let b = rig.import(vec![
        layer()
            .dir("opt", 0o755)
            .unwrap()
            .file("opt/copy.so", 0o600, &content(3))
            .unwrap(),
    ]);
    let first = rig.file(&a[0], "usr/lib/shared.so");
    let second = rig.file(&b[0], "opt/copy.so");
    let object = rig.object_of(&first).expect("a stub");
    assert_eq!(rig.object_of(&second), Some(object.clone()));
    assert_eq!(
        object,
        rig.store
            .layout()
            .objects()
            .join(short_name(&digest(&content(3))))
    );
    assert_eq!(fs::read(&object).unwrap(), content(3));
    assert_eq!(rig.objects(), 1, "one object per content");
    // Each stub is its own inode, with its own metadata, its size and no data.
    let (one, two) = (
        fs::metadata(&first).unwrap(),
        fs::metadata(&second).unwrap(),
    );
    assert_ne!(one.ino(), two.ino());
    assert_eq!((one.nlink(), two.nlink()), (1, 1));
    assert_eq!(one.mode() & 0o7777, 0o4755);
    assert_eq!(two.mode() & 0o7777, 0o600);
    assert_eq!(one.len(), content(3).len() as u64);
    // No data blocks (an xattr block, where the inode cannot hold them, at most).
    assert!(
        one.blocks() * 512 <= 4096,
        "a stub holds data: {}",
        one.blocks()
    );
    assert_eq!(one.mtime() as u64, lamina_sample::SAMPLE_MTIME);
    let mut note = [0u8; 8];
    let n = rustix::fs::lgetxattr(&first, "user.note", &mut note).unwrap();
    assert_eq!(&note[..n], b"a");
    // The directory the stub went into keeps the time the image gave it.
    let dir = fs::metadata(rig.file(&b[0], "opt")).unwrap();
    assert_eq!(dir.mtime() as u64, lamina_sample::SAMPLE_MTIME);
    assert_eq!(fs::read_dir(rig.file(&b[0], "opt")).unwrap().count(), 1);
    for chain_id in a.iter().chain(&b) {
        assert!(rig.store.layer_record(chain_id).unwrap().objects);
        let staging_left = fs::read_dir(rig.store.layout().tmp()).unwrap().count();
        assert_eq!(staging_left, 0);
    }
}

#[test]
fn small_files_hardlink_sets_and_names_like_the_stubs_own_stay_as_they_are() {
    let Some(mut rig) = Rig::new() else { return };
    let chain = rig.import(vec![
        layer()
            .file("small", 0o644, b"tiny")
            .unwrap()
            .file("big", 0o644, &content(7))
            .unwrap()
            .hardlink("big-too", "big")
            .unwrap()
            .file("stub", 0o644, &content(9))
            .unwrap()
            .dir("stubs", 0o755)
            .unwrap()
            .file("stubs/stub", 0o644, &content(11))
            .unwrap()
            .file(".lamina-stub", 0o644, &content(13))
            .unwrap()
            .file("stubs/.lamina-stub", 0o644, b"small beside a moved file")
            .unwrap(),
    ]);
    let file = |rel| rig.file(&chain[0], rel);
    assert_eq!(rig.object_of(&file("small")), None);
    assert_eq!(fs::read(file("small")).unwrap(), b"tiny");
    assert_eq!(
        rig.object_of(&file("big")),
        None,
        "a hardlink set keeps its inode"
    );
    assert_eq!(inode(&file("big")), inode(&file("big-too")));
    assert_eq!(fs::read(file("big")).unwrap(), content(7));
    assert_eq!(
        fs::read(file("stubs/.lamina-stub")).unwrap(),
        b"small beside a moved file"
    );
    for (name, seed) in [("stub", 9), ("stubs/stub", 11), (".lamina-stub", 13)] {
        let object = rig.object_of(&file(name)).expect(name);
        assert_eq!(fs::read(object).unwrap(), content(seed), "{name}");
    }
}

#[test]
fn a_file_whose_short_name_holds_other_bytes_keeps_its_own_data() {
    let Some(mut rig) = Rig::new() else { return };
    // Another content under the name this file's content would get (a collision, or
    // a damaged object): never taken for this file's.
    let name = rig
        .store
        .layout()
        .objects()
        .join(short_name(&digest(&content(5))));
    fs::create_dir_all(name.parent().unwrap()).unwrap();
    fs::write(&name, content(6)).unwrap();
    let chain = rig.import(vec![layer().file("f", 0o644, &content(5)).unwrap()]);
    let file = rig.file(&chain[0], "f");
    assert_eq!(rig.object_of(&file), None);
    assert_eq!(fs::read(&file).unwrap(), content(5));
    assert_eq!(
        fs::read(&name).unwrap(),
        content(6),
        "the object is left alone"
    );
}

/// Overlay looks a stub's redirect up in the layers below it before `objects/`: above a
/// layer with an objects-like directory at its root (`ab/`), a layer keeps its files'
/// data, so nothing below can stand in for its content.
#[test]
fn a_layer_above_one_that_could_hide_objects_keeps_its_data() {
    let Some(mut rig) = Rig::new() else { return };
    let chain = rig.import(vec![
        layer()
            .dir("ab", 0o755)
            .unwrap()
            .file("ab/whatever", 0o644, &content(1))
            .unwrap(),
        layer().file("app", 0o755, &content(4)).unwrap(),
    ]);
    assert!(rig.object_of(&rig.file(&chain[0], "ab/whatever")).is_some());
    let app = rig.file(&chain[1], "app");
    assert_eq!(rig.object_of(&app), None, "stubbed above `ab/`");
    assert_eq!(fs::read(&app).unwrap(), content(4));
    assert!(!rig.store.layer_record(&chain[1]).unwrap().objects);
    // A layer above one without it is stubbed, whatever lies further up.
    let other = rig.import(vec![
        layer().file("app", 0o755, &content(4)).unwrap(),
        layer().file("more", 0o644, &content(8)).unwrap(),
    ]);
    assert!(rig.object_of(&rig.file(&other[1], "more")).is_some());
}

#[test]
fn a_redirect_lamina_did_not_write_is_refused_not_followed() {
    let Some(rig) = Rig::new() else { return };
    let path = rig.tmp.path().join("forged");
    fs::write(&path, b"").unwrap();
    for value in [&b"/../../etc/shadow"[..], b"/ab/../../../../etc/pass", b""] {
        rustix::fs::setxattr(
            &path,
            "trusted.overlay.metacopy",
            b"",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        rustix::fs::setxattr(
            &path,
            REDIRECT_XATTR,
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let err = stub_object(&lamina_sys::RealHost, lamina_sys::At::Path(&path)).unwrap_err();
        assert!(err.to_string().contains("names no object"), "{err}");
    }
}

#[test]
fn an_older_lamina_refuses_the_store_and_a_layer_record_says_it_holds_stubs() {
    let Some(mut rig) = Rig::new() else { return };
    let marker: serde_json::Value =
        serde_json::from_slice(&fs::read(rig.store.layout().marker()).unwrap()).unwrap();
    assert_eq!(marker["version"], 5, "{marker}");
    let chain = rig.import(vec![layer().file("f", 0o644, &content(2)).unwrap()]);
    let record = LayerRecord::read(&rig.store.layout().layer(&chain[0])).unwrap();
    assert!(record.objects);
    // The same store cannot be opened as one that keeps files.
    let err = Store::init_with(rig.store.root(), &StoreProperties::default()).unwrap_err();
    assert!(err.to_string().contains("layer data in objects"), "{err}");
}

fn inode(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap().ino()
}
