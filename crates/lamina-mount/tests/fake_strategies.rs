//! Strategy logic against the fake mounter: which mount calls each strategy makes (and
//! does not make), lease counting for shared mounts, deferred deletes, crash recovery
//! and volatile remounts. No root needed; the real-kernel side is in integration/.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use std::fs;

use lamina_mount::pool::PoolKind;
use lamina_mount::{Deleted, RootfsError, clean, create, delete, reap};
use lamina_sys::{Errno, FakeCall, FakeMounter, Mounter};

/// Mounts and binds made for containers, shared images and pools (not the probe's).
fn mounts_made(fake: &FakeMounter) -> Vec<FakeCall> {
    fake.calls()
        .into_iter()
        .filter(|c| match c {
            FakeCall::Mount(target, _) => !target.to_string_lossy().contains("/tmp/probe-"),
            FakeCall::BindReadOnly { .. } => true,
            _ => false,
        })
        .collect()
}

#[test]
fn a_pooled_create_claims_a_premounted_overlay_without_mounting() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let chain_ids = store.import(&image).unwrap();
    let kind = PoolKind::overlays(&chain_ids, lamina_mount::Flavour::PLAIN, None);
    let filled = lamina_mount::pool::fill(&store, &fake, &kind, Some(2)).unwrap();
    assert_eq!((filled.added, filled.ready), (2, 2));
    let before = mounts_made(&fake).len();

    let created = create(&store, &fake, &image, "p", &with("pooled")).unwrap();
    assert_eq!(
        mounts_made(&fake).len(),
        before,
        "a claim makes no mount call"
    );
    assert_eq!(created.container.model().to_string(), "pooled");
    assert!(
        fake.is_mountpoint(&created.rootfs).unwrap(),
        "the slot's mount moved with it"
    );
    let spec = fake.spec_at(&created.rootfs).unwrap();
    assert_eq!(spec.lowers.len(), 2);

    // One slot left; the refill restores the remembered size.
    let refill = lamina_mount::pool::fill(&store, &fake, &kind, None).unwrap();
    assert_eq!((refill.added, refill.ready), (1, 2));

    // A named `pooled` whose pool (of the volatile flavour here) is empty is refused, not
    // silently replaced by a fresh mount; nothing of it is left.
    let err = create(&store, &fake, &image, "q", &with("pooled,volatile")).unwrap_err();
    assert!(
        matches!(err, lamina_mount::RootfsError::PoolEmpty { ref flavour } if flavour == "volatile"),
        "{err}"
    );
    assert!(!store.container_exists("q"));

    assert_eq!(delete(&store, &fake, "p").unwrap(), Deleted::Removed);
    assert_eq!(delete(&store, &fake, "q").unwrap(), Deleted::NotFound);
    assert_eq!(lamina_mount::pool::drain(&store, &fake).unwrap(), 2);
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
    assert_eq!(fs::read_dir(store.layout().pool()).unwrap().count(), 0);
}

#[test]
fn shared_ro_mounts_once_and_releases_after_the_last_container() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let options = with("shared-ro");
    let a = create(&store, &fake, &image, "a", &options).unwrap();
    let b = create(&store, &fake, &image, "b", &options).unwrap();
    assert!(a.container.model().read_only() && a.container.rootfs.lease.is_some());
    let made = mounts_made(&fake);
    let overlays = made
        .iter()
        .filter(|c| matches!(c, FakeCall::Mount(..)))
        .count();
    assert_eq!(
        (overlays, made.len()),
        (1, 3),
        "one shared overlay, two binds"
    );
    assert_eq!(
        a.container.rootfs.bind_source,
        b.container.rootfs.bind_source
    );
    let shared = a.container.rootfs.bind_source.clone().unwrap();
    // A read-only bind writes nothing: its container has no upper or work to make.
    let dirs = store.container_dirs("a");
    assert!(dirs.rootfs.is_dir() && !dirs.upper.exists() && !dirs.work.exists());

    // Deferred (shared-ro always is): gone from images/ at once, torn down by the reaper.
    assert_eq!(delete(&store, &fake, "a").unwrap(), Deleted::Deferred);
    assert!(!store.container_exists("a"));
    assert_eq!(reap(&store, &fake).unwrap().removed, 1);
    assert!(fake.is_mountpoint(&shared).unwrap(), "b still uses it");

    assert_eq!(delete(&store, &fake, "b").unwrap(), Deleted::Deferred);
    reap(&store, &fake).unwrap();
    assert!(!shared.exists(), "released after the last container");
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
}

#[test]
fn direct_binds_a_flattened_tree_with_whiteouts_applied() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let created = create(&store, &fake, &image, "d", &with("direct")).unwrap();
    let flat = created.container.rootfs.bind_source.clone().unwrap();
    let dirs = store.container_dirs("d");
    assert!(dirs.rootfs.is_dir() && !dirs.upper.exists() && !dirs.work.exists());
    assert!(
        flat.starts_with(store.layout().flat()),
        "{}",
        flat.display()
    );
    let made = mounts_made(&fake);
    assert!(
        made.iter()
            .all(|c| matches!(c, FakeCall::BindReadOnly { .. })),
        "no overlay: {made:?}"
    );
    // The sample's top layer whites out old/gone.txt and makes opq/ opaque.
    assert!(!fs::read_to_string(flat.join("top.txt")).unwrap().is_empty());
    assert!(!flat.join("old/gone.txt").exists());
    assert!(flat.join("opq/top-only.txt").exists());
    assert!(!flat.join("opq/base-only.txt").exists());
    use std::os::unix::fs::MetadataExt;
    let layer_top = store
        .layout()
        .layer_diff(&image.chain_ids()[1])
        .join("top.txt");
    assert_eq!(
        fs::metadata(flat.join("top.txt")).unwrap().ino(),
        fs::metadata(layer_top).unwrap().ino(),
        "files are hardlinks into the layer, not copies"
    );
    let mode = fs::metadata(flat.join("usr/local/bin/suid-tool"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o4755);
    assert_eq!(delete(&store, &fake, "d").unwrap(), Deleted::Deferred);
    reap(&store, &fake).unwrap();
    assert!(fake.mounted().is_empty());
    assert!(
        flat.is_dir(),
        "the flattened tree is kept for the next container"
    );
}

#[test]
fn clean_recovers_what_crashes_leave() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let chain_ids = store.import(&image).unwrap();

    // A deferred delete whose reaper never ran: mounted, in trash.
    create(&store, &fake, &image, "t", &with("deferred")).unwrap();
    store.trash_container("t").unwrap().unwrap();
    // A create that died after claiming its ID and mounting, before its record.
    let claim = store.create_container_dirs("half").unwrap();
    let spec = lamina_mount::plan::classic(&store, &chain_ids, &claim.dirs);
    fake.mount_overlay(&spec, &claim.dirs.rootfs).unwrap();
    drop(claim); // its process is gone: the lock is free
    // A create that died while staging, also mounted.
    let (staged, lock) = store.stage_container_dirs("new").unwrap();
    fake.mount_overlay(&spec, &staged.rootfs).unwrap();
    drop(lock);
    // A shared mount whose last container vanished without releasing it.
    create(&store, &fake, &image, "s", &with("shared-ro")).unwrap();
    fake.unmount(&store.rootfs_path("s")).unwrap();
    fs::remove_dir_all(store.layout().container("s")).unwrap();
    // A create in progress (lock held) must survive.
    let busy = store.create_container_dirs("busy").unwrap();

    let report = clean(&store, &fake, None).unwrap();
    assert_eq!(report.reaped, 1);
    assert_eq!(report.crashed_creates, 1);
    assert_eq!(report.tmp_removed, 1);
    assert_eq!(report.shared_released, 1);
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
    assert!(busy.dirs.base.is_dir(), "a live create is left alone");
    assert_eq!(fs::read_dir(store.layout().trash()).unwrap().count(), 0);
    assert!(
        fs::read_dir(store.layout().shared())
            .unwrap()
            .all(|e| e.unwrap().file_name() == "empty")
    );
}

#[test]
fn a_volatile_upper_is_remounted_only_after_a_clean_unmount() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let dirs = store.container_dirs("v");
    let marker = dirs.work.join("work/incompat/volatile");

    create(&store, &fake, &image, "v", &with("volatile")).unwrap();
    // What the kernel does on a volatile mount: a marker directory with a file in it.
    let mark_dirty = || {
        fs::create_dir_all(&marker).unwrap();
        fs::write(marker.join("dirty"), "").unwrap();
    };
    mark_dirty();
    lamina_mount::unmount(&store, &fake, "v").unwrap();
    assert!(!marker.exists(), "clean unmount: synced, marker removed");
    lamina_mount::mount(&store, &fake, "v").unwrap();
    assert!(fake.is_mountpoint(&dirs.rootfs).unwrap());

    // Writeback error reported while mounted: refuse, now and on every remount.
    mark_dirty();
    fake.fail_next_sync(Errno::IO);
    let err = lamina_mount::unmount(&store, &fake, "v").unwrap_err();
    assert!(
        matches!(err, RootfsError::VolatileWriteback { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("may be lost"), "{err}");
    assert!(!fake.is_mountpoint(&dirs.rootfs).unwrap());
    let err = lamina_mount::mount(&store, &fake, "v").unwrap_err();
    assert!(matches!(err, RootfsError::VolatileUnclean { .. }), "{err}");
    assert_eq!(delete(&store, &fake, "v").unwrap(), Deleted::Removed);
}
