//! Hostile layers through the real CLI: a clear one-line error naming the layer and the
//! entry, exit 1, nothing written outside, and the store left without a trace of them.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use lamina_image::{Compression, Platform};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, ScratchFs, require_root};
use lamina_sample::{EntryType, Layer, LayerBuilder, build_image, write_oci_layout};

/// An OCI layout with a good base layer and `top` above it.
fn image_with_top(dir: &Path, top: Vec<u8>) -> String {
    let base = LayerBuilder::new()
        .dir("etc", 0o755)
        .unwrap()
        .file("etc/hostname", 0o644, b"base\n")
        .unwrap()
        .finish()
        .unwrap();
    let layers = [
        Layer {
            tar: base,
            compression: Compression::Gzip,
        },
        Layer {
            tar: top,
            compression: Compression::Gzip,
        },
    ];
    let image = build_image(&layers, &[], &Platform::host()).unwrap();
    write_oci_layout(dir, &[&image], &[(image.manifest.clone(), Some("evil"))]).unwrap();
    format!("oci://{}:evil", dir.display())
}

fn entries(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn assert_refused(lamina: &Lamina, image: &str, id: &str, expect: &[&str]) {
    let out = lamina.run(&["create", image, id]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(
        out.stdout.contains("layer 1 (sha256:"),
        "names the layer: {out:?}"
    );
    for e in expect {
        assert!(out.stdout.contains(e), "expected `{e}`: {out:?}");
    }
    // No container, no half-imported layer, no temp dir, no mount.
    assert!(entries(&lamina.store.join("images")).is_empty());
    assert!(entries(&lamina.store.join("tmp")).is_empty());
    assert!(
        entries(&lamina.store.join("layers")).len() <= 1,
        "only the good base layer may stay"
    );
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn dot_dot_entries_fail_and_write_nothing_outside() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let top = LayerBuilder::new()
        .file("fine.txt", 0o644, b"ok")
        .unwrap()
        .raw(
            EntryType::Regular,
            "../../../escaped-by-dotdot",
            None,
            b"pwned",
        )
        .unwrap()
        .finish()
        .unwrap();
    let image = image_with_top(&fs.path().join("img"), top);
    assert_refused(
        &lamina,
        &image,
        "dotdot",
        &["`../../../escaped-by-dotdot`", "`..`"],
    );
    assert_eq!(entries(fs.path()), ["img", "store"]);
    assert!(!Path::new("/escaped-by-dotdot").exists());
}

#[test]
fn writing_through_a_planted_symlink_fails_and_writes_nothing_outside() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let victim = fs.path().join("victim");
    fs::create_dir(&victim).unwrap();
    let top = LayerBuilder::new()
        .symlink("escape", victim.to_str().unwrap())
        .unwrap()
        .raw(EntryType::Regular, "escape/planted.txt", None, b"pwned")
        .unwrap()
        .finish()
        .unwrap();
    let image = image_with_top(&fs.path().join("img"), top);
    assert_refused(
        &lamina,
        &image,
        "symlink",
        &["`escape/planted.txt`", "symlink"],
    );
    assert!(
        entries(&victim).is_empty(),
        "nothing was written through the symlink"
    );

    // The same image without the escape imports fine afterwards: the store is usable.
    let good = LayerBuilder::new()
        .file("fine.txt", 0o644, b"ok")
        .unwrap()
        .finish()
        .unwrap();
    let image = image_with_top(&fs.path().join("good"), good);
    let rootfs = lamina.create(&image, "good");
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/hostname")).unwrap(),
        "base\n"
    );
    lamina.delete_and_assert_gone("good", "good");
}
