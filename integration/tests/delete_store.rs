//! `lamina delete-store`: everything lamina mounted goes, then the directory; a directory
//! that is not a store is refused untouched; a busy rootfs fails it and a retry finishes.

use std::path::PathBuf;
use std::process::Command;

use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

/// A store and the sample image's reference, both on `fs`.
fn store_with_sample(fs: &ScratchFs) -> (Lamina, PathBuf, String) {
    let image = sample_image(&fs.path().join("image")).references()[0].clone();
    let store = fs.path().join("store");
    (Lamina::init(&store), store, image)
}

#[test]
fn delete_store_unmounts_every_kind_of_mount_and_removes_the_store() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, store, image) = store_with_sample(&fs);
    let rw = lamina.create_with(&["--strategy", "classic"], &image, "rw");
    std::fs::write(rw.join("written"), b"data").unwrap();
    lamina.create_with(
        &["--read-only", "--strategy", "shared-ro"],
        &image,
        "shared",
    );
    lamina.create_with(&["--read-only", "--strategy", "direct"], &image, "direct");
    let filled = lamina.run(&["pool", "fill", "--size", "2", &image]);
    assert_eq!(filled.code, 0, "{filled:?}");
    assert!(
        mounts_under(&store).len() >= 6,
        "{:?}",
        mounts_under(&store)
    );

    let out = lamina.run(&["delete-store"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("deleted store"), "{out:?}");
    assert!(!store.exists(), "store directory left behind");
    assert!(mounts_under(&store).is_empty());

    // Deleting it again is not an error: Garden calls delete-store on every teardown.
    let again = lamina.run(&["delete-store"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("does not exist"), "{again:?}");
}

#[test]
fn delete_store_refuses_a_directory_that_is_not_a_store() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let dir = fs.path().join("precious");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep-me"), b"operator data").unwrap();
    let out = Lamina::new(&dir).run(&["delete-store"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(
        out.stdout.contains("not a lamina store") && out.stdout.contains("precious"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read(dir.join("keep-me")).unwrap(),
        b"operator data"
    );
}

#[test]
fn delete_store_with_a_busy_rootfs_fails_and_a_retry_finishes() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, store, image) = store_with_sample(&fs);
    let rootfs = lamina.create_with(&["--strategy", "classic"], &image, "busy");
    let mut squatter = Command::new("sleep")
        .arg("60")
        .current_dir(&rootfs)
        .spawn()
        .unwrap();

    let out = lamina.run(&["delete-store"]);
    let _ = squatter.kill();
    let _ = squatter.wait();
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("busy"), "{out:?}");
    assert!(
        lamina_integration::records::record_exists(&store.join("images/busy/container.json")),
        "the record must survive a failed delete-store"
    );

    let retry = lamina.run(&["delete-store"]);
    assert_eq!(retry.code, 0, "{retry:?}");
    assert!(!store.exists());
    assert!(mounts_under(&store).is_empty());
}
