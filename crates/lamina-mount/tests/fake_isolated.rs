//! Strategy `isolated` against the fake mounter: the order of mounts (own upper
//! filesystem, then the overlay on it), the pool of bare uppers, disk-limit sizing, and
//! rollback. The real filesystems, ENOSPC and runc are in integration/tests/isolated.rs.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use lamina_mount::pool::PoolKind;
use lamina_mount::{
    CreateOptions, Deleted, DiskLimit, RootfsError, UpperBackend, UpperPlan, create, delete, reap,
};
use lamina_store::ContainerDirs;
use lamina_sys::{DiskFs, Errno, FakeCall, FakeMounter, UpperFs};

fn upper_mounts(fake: &FakeMounter) -> usize {
    fake.calls()
        .iter()
        .filter(|c| matches!(c, FakeCall::MountUpperFs(..)))
        .count()
}

#[test]
fn an_isolated_overlay_sits_on_a_filesystem_of_its_own_and_goes_through_the_reaper() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();

    let created = create(&store, &fake, &image, "c", &with("isolated")).unwrap();
    assert_eq!(created.container.model().to_string(), "isolated,deferred");
    let dirs = ContainerDirs::isolated(store.layout().container("c"));
    match fake.upper_fs_at(&dirs.upper_fs_mount()).unwrap() {
        UpperFs::Disk {
            image,
            size_bytes,
            fs,
            format,
        } => {
            assert_eq!(image, dirs.upper_image());
            assert_eq!(size_bytes, lamina_mount::isolated::DEFAULT_DISK_BYTES);
            assert_eq!((fs, format), (DiskFs::Ext4, true));
        }
        other => panic!("expected a disk upper, got {other:?}"),
    }
    let spec = fake.spec_at(&created.rootfs).unwrap();
    assert_eq!(spec.upper.as_deref(), Some(dirs.upper.as_path()));
    assert_eq!(spec.work.as_deref(), Some(dirs.work.as_path()));
    assert!(!store.layout().container("c").join("upper").exists());
    let upper = created.container.rootfs.upper_fs.as_ref().unwrap();
    assert_eq!(upper.filesystem, "ext4");

    assert_eq!(delete(&store, &fake, "c").unwrap(), Deleted::Deferred);
    assert_eq!(reap(&store, &fake).unwrap().removed, 1);
    let unmounts: Vec<String> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            FakeCall::Unmount(p) => Some(p.file_name().unwrap().to_string_lossy().into_owned()),
            _ => None,
        })
        .filter(|name| name != "merged") // the probe's
        .collect();
    assert_eq!(
        unmounts,
        ["rootfs", "upperfs"],
        "the overlay goes before the filesystem under it"
    );
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
    assert_eq!(store.trash_entries().unwrap().len(), 0);
}

#[test]
fn a_create_claims_a_ready_upper_from_the_pool_instead_of_making_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let plan = UpperPlan::new(UpperBackend::Memory, None, DiskFs::Ext4);
    let filled = lamina_mount::pool::fill(&store, &fake, &PoolKind::uppers(plan), Some(2)).unwrap();
    assert_eq!((filled.added, filled.ready), (2, 2));
    assert_eq!(upper_mounts(&fake), 2);

    // auto would isolate only with metacopy, which the fake cannot show the probe (the
    // choice is unit-tested in choose.rs, and through the binary in integration/).
    let created = create(&store, &fake, &image, "e", &with("auto")).unwrap();
    assert!(
        !created.container.model().to_string().contains("isolated"),
        "no metacopy: auto leaves the pooled uppers alone: {}",
        created.container.model()
    );
    assert_eq!(delete(&store, &fake, "e").unwrap(), Deleted::Deferred);

    let created = create(&store, &fake, &image, "e", &with("isolated-memory")).unwrap();
    assert_eq!(
        created.container.model().to_string(),
        "isolated-memory,deferred"
    );
    assert!(created.claimed_from_pool);
    assert_eq!(upper_mounts(&fake), 2, "claimed, not made");
    assert!(
        fake.spec_at(&created.rootfs).is_some(),
        "overlay mounted on it"
    );

    let refill = lamina_mount::pool::refill_all(&store, &fake).unwrap();
    assert_eq!(refill, 1, "the pool's target is restored");
    assert_eq!(delete(&store, &fake, "e").unwrap(), Deleted::Deferred);
    assert_eq!(
        reap(&store, &fake).unwrap().removed,
        2,
        "both containers `e`"
    );
    assert_eq!(lamina_mount::pool::drain(&store, &fake).unwrap(), 2);
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
}

#[test]
fn a_disk_limit_sizes_the_upper_with_grootfs_meaning() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let chain_ids = store.import(&image).unwrap();
    let image_bytes: u64 = chain_ids
        .iter()
        .map(|c| store.layer_record(c).unwrap().size)
        .sum();
    let limited = |bytes, exclude_image| CreateOptions {
        disk_limit: Some(DiskLimit {
            bytes,
            exclude_image,
        }),
        ..with("auto")
    };

    let created = create(&store, &fake, &image, "in", &limited(64 << 20, false)).unwrap();
    assert_eq!(
        created.container.rootfs.upper_fs.unwrap().size_bytes,
        (64 << 20) - image_bytes,
        "inclusive: the image counts against the limit"
    );
    let created = create(&store, &fake, &image, "ex", &limited(64 << 20, true)).unwrap();
    assert_eq!(
        created.container.rootfs.upper_fs.unwrap().size_bytes,
        64 << 20
    );

    let err = create(&store, &fake, &image, "tiny", &limited(image_bytes, false)).unwrap_err();
    assert!(
        matches!(err, RootfsError::DiskLimitTooSmall { .. }),
        "{err}"
    );
    assert!(!store.container_exists("tiny"));
}

#[test]
fn a_failed_mount_leaves_no_upper_filesystem_and_no_container() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    // Warm the probe first, so the injected failures hit the container's mounts.
    lamina_mount::probe::probe(&store, &fake, false).unwrap();
    let options = with("isolated");

    fake.fail_next_mount(Errno::NOSPC);
    let err = create(&store, &fake, &image, "a", &options).unwrap_err();
    assert!(err.to_string().contains("upper filesystem"), "{err}");
    assert!(!store.container_exists("a"));

    fake.fail_next_overlay_mount(Errno::INVAL);
    let err = create(&store, &fake, &image, "b", &options).unwrap_err();
    assert!(err.to_string().contains("mount overlay"), "{err}");
    assert!(!store.container_exists("b"));
    assert_eq!(upper_mounts(&fake), 2);
    assert!(
        fake.mounted().is_empty(),
        "the upper filesystem was unmounted: {:?}",
        fake.mounted()
    );
    assert_eq!(
        std::fs::read_dir(store.layout().images()).unwrap().count(),
        0
    );
}

/// A deleted container whose rootfs is in use is left untouched by the reaper — no
/// unmount is tried, nothing of it is torn down — and waits its turn while the others
/// go; once it is free, the next reaper removes it.
#[test]
fn a_busy_container_is_left_untouched_while_the_others_go() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    for id in ["busy", "free"] {
        create(&store, &fake, &image, id, &with("isolated")).unwrap();
    }
    let in_use = Arc::new(AtomicBool::new(true));
    let busy = in_use.clone();
    let is_busy = move |p: &std::path::Path| {
        busy.load(Ordering::SeqCst) && p.to_string_lossy().contains("/busy.")
    };
    fake.fail(
        lamina_sys::Call::InUse,
        lamina_sys::When::Path(Arc::new(is_busy)),
        Errno::BUSY,
    );
    for id in ["busy", "free"] {
        assert_eq!(delete(&store, &fake, id).unwrap(), Deleted::Deferred);
    }

    let reaped = reap(&store, &fake).unwrap();
    assert_eq!((reaped.removed, reaped.failed), (1, 1));
    let touched: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| matches!(c, FakeCall::Unmount(p) if p.to_string_lossy().contains("/busy.")))
        .collect();
    assert!(touched.is_empty(), "{touched:?}");
    assert_eq!(store.trash_entries().unwrap().len(), 1);

    in_use.store(false, Ordering::SeqCst);
    let reaped = reap(&store, &fake).unwrap();
    assert_eq!((reaped.removed, reaped.failed), (1, 0));
    assert!(store.trash_entries().unwrap().is_empty());
}
