//! Faults the host throws at lamina: the store's filesystem fills up (during an import and
//! during a container's writes), and a rootfs is busy when it is deleted. Each gives a
//! clear error or the strategy's documented deferral, loses no metadata, and leaves a
//! store that works again once the cause is gone.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};

use lamina_image::Compression;
use lamina_integration::scratch::mounts_under;
use lamina_integration::tree::Tree;
use lamina_integration::{Lamina, ScratchFs, hostile, require_root, sample_image};

/// Fills the filesystem at `dir` with one file, leaving about `leave` bytes free (to
/// root: ext4 keeps its reserve for root, and lamina runs as root).
fn fill(dir: &Path, leave: u64) -> std::path::PathBuf {
    let st = rustix::fs::statvfs(dir).unwrap();
    let free = st.f_bfree * st.f_frsize;
    let filler = dir.join("filler");
    let file = fs::File::create(&filler).unwrap();
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, free - leave).unwrap();
    filler
}

/// An image whose top layer holds `bytes` of incompressible data in `payload`.
fn image_with_payload(dir: &Path, bytes: usize) -> String {
    let image = hostile::with_top_file("payload", &hostile::noise(bytes), Compression::Gzip);
    hostile::write(dir, &image)
}

const NOT_STATE: &[&str] = &["store/locks", "store/run", "filler"];

#[test]
fn a_full_store_filesystem_during_import_fails_cleanly_and_recovers() {
    require_root();
    let fs = ScratchFs::ext4(128);
    let images = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = image_with_payload(&images.path().join("big"), 24 << 20);
    // The base layer is in the store already: a verified layer imported before the
    // failing one would rightly stay, and this test is about the failing one.
    let base = hostile::write(&images.path().join("base"), &hostile::base_only());
    assert_eq!(
        lamina
            .run(&["create", "--without-mount", &base, "warm"])
            .code,
        0
    );
    let filler = fill(fs.path(), 8 << 20);

    let before = Tree::of(fs.path(), NOT_STATE);
    let out = lamina.run(&["create", &image, "big"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    for want in [
        "layer 1 (sha256:",
        "entry `payload`",
        "No space left on device",
    ] {
        assert!(
            out.stdout.contains(want),
            "expected `{want}`: {}",
            out.stdout
        );
    }
    let after = Tree::of(fs.path(), NOT_STATE);
    assert!(before == after, "store changed:\n{}", before.diff(&after));
    assert!(mounts_under(&lamina.store).is_empty());

    // Space freed: the same create now works, and the store is consistent.
    fs::remove_file(filler).unwrap();
    let rootfs = lamina.create(&image, "big");
    assert_eq!(
        fs::metadata(rootfs.join("payload")).unwrap().len(),
        24 << 20
    );
    assert_eq!(lamina.run(&["check"]).code, 0);
    lamina.delete_and_assert_gone("big", "full during import");
}

#[test]
fn a_full_store_filesystem_during_container_writes_gives_enospc_and_recovers() {
    require_root();
    let fs = ScratchFs::ext4(128);
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let rootfs = lamina.create(&image, "writer");
    let neighbour = lamina.create(&image, "neighbour");

    let mut file = fs::File::create(rootfs.join("fill")).unwrap();
    let chunk = vec![0x5a; 1 << 20];
    let err = loop {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
            break e;
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
    drop(file);
    // The neighbour still reads its image, and the store still answers.
    assert!(neighbour.join("bin/busybox").exists());
    assert_eq!(lamina.run(&["check"]).code, 0);

    // Deleting the writer frees the space; creates work again.
    lamina.delete_and_assert_gone("writer", "full during writes");
    let again = lamina.create(&image, "again");
    fs::write(again.join("small"), "fits now").unwrap();
    lamina.delete_and_assert_gone("again", "full during writes");
    lamina.delete_and_assert_gone("neighbour", "full during writes");
}

/// A process whose working directory is inside `dir`, so `dir`'s mount is busy.
fn squatter(dir: &Path) -> Child {
    Command::new("sleep")
        .arg("120")
        .current_dir(dir)
        .spawn()
        .unwrap()
}

#[test]
fn deleting_a_busy_rootfs_inline_fails_clearly_and_a_retry_succeeds() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let rootfs = lamina.create_with(&["--strategy", "classic"], &image, "busy");
    let mut squatter = squatter(&rootfs.join("etc"));

    let out = lamina.run(&["delete", "busy"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1);
    assert!(out.stdout.contains("busy"), "{}", out.stdout);
    assert!(
        out.stdout.contains(rootfs.to_str().unwrap()),
        "{}",
        out.stdout
    );
    // Nothing was lost: still listed, still mounted, still readable.
    let listed = lamina.run(&["list"]);
    assert!(
        listed
            .stdout
            .contains(rootfs.parent().unwrap().to_str().unwrap()),
        "{listed:?}"
    );
    assert!(rootfs.join("bin/busybox").exists());

    squatter.kill().unwrap();
    squatter.wait().unwrap();
    lamina.delete_and_assert_gone("busy", "busy inline delete retried");
}

#[test]
fn deleting_a_busy_rootfs_deferred_returns_and_the_reaper_finishes_later() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let rootfs = lamina.create_with(&["--strategy", "deferred"], &image, "busy");
    let mut squatter = squatter(&rootfs.join("etc"));

    let out = lamina.run(&["delete", "busy"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!lamina.run(&["list"]).stdout.contains("busy"));
    let reaped = lamina.run(&["reap"]).json();
    assert_eq!(
        reaped["failed"], 1,
        "the busy rootfs stays queued: {reaped}"
    );
    assert_eq!(lamina.entries("trash"), 1);

    squatter.kill().unwrap();
    squatter.wait().unwrap();
    // `clean` reaps it, or a background reaper that an earlier command started (every
    // command that finds trash and no reaper starts one) got there first: `clean` waits
    // for a running reaper, so either way the trash is empty once it returns.
    let report = lamina.run(&["clean"]).json();
    assert!(report["reaped"].as_u64().unwrap() <= 1, "{report}");
    assert_eq!(lamina.entries("trash"), 0, "{report}");
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.run(&["check"]).code, 0);
}
