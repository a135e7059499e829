//! Strategy `isolated-quota` against the fake mounter: the upper is a subvolume with a
//! qgroup limit (no mount), auto picks it for a disk limit on a btrfs store with quotas,
//! the record round-trips it, stats reads the qgroup, and every way a container goes
//! (inline delete, the reaper, a failed create, `clean` after a crashed create) deletes
//! its subvolume. The real btrfs and EDQUOT are in integration/tests/btrfs_quota.rs.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use lamina_mount::{
    CreateOptions, Deleted, DiskLimit, RootfsError, UpperBackend, UpperFsRecord, clean, create,
    delete, reap, record, stats,
};
use lamina_store::ContainerDirs;
use lamina_sys::{Errno, FakeCall, FakeKernel, FakeMounter};

fn quota_kernel() -> FakeMounter {
    let fake = FakeMounter::new();
    fake.set_kernel(FakeKernel {
        btrfs_quotas: true,
        ..FakeKernel::default()
    });
    fake
}

fn deletes(fake: &FakeMounter) -> usize {
    fake.calls()
        .iter()
        .filter(|c| matches!(c, FakeCall::DeleteSubvolume(..)))
        .count()
}

fn limited(bytes: u64) -> CreateOptions {
    CreateOptions {
        disk_limit: Some(DiskLimit {
            bytes,
            exclude_image: true,
        }),
        ..with("auto")
    }
}

#[test]
fn auto_with_a_disk_limit_on_a_quota_store_makes_a_limited_subvolume_and_reaps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = quota_kernel();

    let created = create(&store, &fake, &image, "c", &limited(32 << 20)).unwrap();
    assert_eq!(
        created.container.model().to_string(),
        "isolated-quota,deferred"
    );
    assert!(created.reason.contains("qgroup"), "{}", created.reason);
    let dirs = ContainerDirs::isolated(store.layout().container("c"));
    assert_eq!(fake.subvolume_limit(&dirs.upper_fs_mount()), Some(32 << 20));
    assert!(
        fake.upper_fs_at(&dirs.upper_fs_mount()).is_none(),
        "a subvolume is never mounted"
    );
    let spec = fake.spec_at(&created.rootfs).unwrap();
    assert_eq!(spec.upper.as_deref(), Some(dirs.upper.as_path()));
    assert_eq!(spec.work.as_deref(), Some(dirs.work.as_path()));

    // The record names the backend and reads back as the same model.
    let upper = created.container.rootfs.upper_fs.clone().unwrap();
    assert_eq!(
        upper,
        UpperFsRecord {
            filesystem: UpperFsRecord::SUBVOLUME.into(),
            size_bytes: 32 << 20
        }
    );
    let read = record::read(&store, "c").unwrap();
    assert_eq!(read, created.container);
    assert_eq!(
        read.model().flavour().unwrap().isolated,
        Some(UpperBackend::Quota)
    );

    // stats: what the qgroup counts (the fake counts the files in the subvolume).
    std::fs::write(dirs.upper.join("written"), vec![1u8; 1 << 20]).unwrap();
    let stats = stats(&store, &fake, "c").unwrap();
    assert!(
        stats.disk_usage.exclusive_bytes_used >= 1 << 20,
        "{stats:?}"
    );
    assert_eq!(stats.disk_usage.committed_space_bytes, 32 << 20);

    // unmount and mount again: the subvolume is not a mount, nothing to remount.
    // Quotas turned off and on drop every limit: mounting the container sets its own again.
    lamina_mount::unmount(&store, &fake, "c").unwrap();
    lamina_sys::Mounter::limit_subvolume(&fake, &dirs.upper_fs_mount(), 0).unwrap();
    lamina_mount::mount(&store, &fake, "c").unwrap();
    assert_eq!(fake.subvolume_count(), 1);
    assert_eq!(fake.subvolume_limit(&dirs.upper_fs_mount()), Some(32 << 20));

    assert_eq!(delete(&store, &fake, "c").unwrap(), Deleted::Deferred);
    assert_eq!(deletes(&fake), 0, "the reaper deletes it, not delete");
    assert_eq!(reap(&store, &fake).unwrap().removed, 1);
    assert_eq!(deletes(&fake), 1);
    assert_eq!(fake.subvolume_count(), 0);
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
    assert_eq!(store.trash_entries().unwrap().len(), 0);
}

#[test]
fn a_named_quota_upper_is_deleted_inline_unless_deferred() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = quota_kernel();

    let created = create(&store, &fake, &image, "inline", &with("isolated-quota")).unwrap();
    assert_eq!(created.container.model().to_string(), "isolated-quota");
    let dirs = ContainerDirs::isolated(store.layout().container("inline"));
    assert_eq!(
        fake.subvolume_limit(&dirs.upper_fs_mount()),
        Some(lamina_mount::isolated::DEFAULT_DISK_BYTES),
        "no limit: the default size, as for a disk upper"
    );
    assert_eq!(delete(&store, &fake, "inline").unwrap(), Deleted::Removed);
    assert_eq!(deletes(&fake), 1);
    assert_eq!(fake.subvolume_count(), 0);
    assert!(!store.container_exists("inline"));
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());

    let created = create(
        &store,
        &fake,
        &image,
        "later",
        &with("isolated-quota,deferred"),
    )
    .unwrap();
    assert_eq!(
        created.container.model().to_string(),
        "isolated-quota,deferred"
    );
    assert_eq!(delete(&store, &fake, "later").unwrap(), Deleted::Deferred);
    assert_eq!(reap(&store, &fake).unwrap().removed, 1);
    assert_eq!(fake.subvolume_count(), 0);
}

#[test]
fn a_store_without_quotas_refuses_isolated_quota_and_auto_keeps_a_loop_upper() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();

    let err = create(&store, &fake, &image, "q", &with("isolated-quota")).unwrap_err();
    assert!(matches!(err, RootfsError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("btrfs quota enable"), "{err}");
    assert!(!store.container_exists("q"));

    let created = create(&store, &fake, &image, "a", &limited(32 << 20)).unwrap();
    assert_eq!(created.container.model().to_string(), "isolated,deferred");
    assert_eq!(fake.subvolume_count(), 0);
}

#[test]
fn a_failed_create_deletes_the_subvolume_it_made() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = quota_kernel();
    lamina_mount::probe::probe(&store, &fake, false).unwrap();

    fake.fail_next_overlay_mount(Errno::INVAL);
    let err = create(&store, &fake, &image, "a", &with("isolated-quota")).unwrap_err();
    assert!(err.to_string().contains("mount overlay"), "{err}");
    assert_eq!(deletes(&fake), 1);
    assert_eq!(fake.subvolume_count(), 0);
    assert!(!store.container_exists("a"));

    fake.fail(
        lamina_sys::Call::CreateSubvolume,
        lamina_sys::When::Nth(1),
        Errno::NOSPC,
    );
    let err = create(&store, &fake, &image, "b", &with("isolated-quota")).unwrap_err();
    assert!(err.to_string().contains("create subvolume"), "{err}");
    assert_eq!(fake.subvolume_count(), 0);
    assert!(!store.container_exists("b"));
    assert_eq!(
        std::fs::read_dir(store.layout().images()).unwrap().count(),
        0
    );
}

#[test]
fn clean_deletes_the_subvolume_of_a_crashed_create() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _image) = setup(tmp.path());
    let fake = quota_kernel();

    // A create killed after making its subvolume, before its record.
    let claim = store.create_container_dirs("crashed").unwrap();
    let base = claim.dirs.base.clone();
    std::fs::remove_dir(&claim.dirs.upper).unwrap();
    std::fs::remove_dir(&claim.dirs.work).unwrap();
    let dirs = ContainerDirs::isolated(base.clone());
    lamina_sys::Mounter::create_subvolume(&fake, &dirs.upper_fs_mount(), 1 << 20).unwrap();
    std::fs::create_dir(&dirs.upper).unwrap();
    drop(claim);

    let report = lamina_mount::check(&store, &fake, false).unwrap();
    assert!(!report.problems.is_empty(), "check sees the crashed create");
    let report = clean(&store, &fake, None).unwrap();
    assert_eq!(report.crashed_creates, 1, "{report:?}");
    assert_eq!(fake.subvolume_count(), 0);
    assert!(!base.exists());
}

#[test]
fn no_pool_holds_quota_uppers_and_delete_store_deletes_live_subvolumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = quota_kernel();
    let fill = |image, strategies: &str, disk_limit| lamina_mount::pool::FillRequest {
        image,
        strategies: lamina_mount::Strategies::parse(strategies).unwrap(),
        ephemeral: false,
        disk_limit,
        disk_fs: lamina_sys::DiskFs::Ext4,
        size: Some(1),
    };
    for request in [
        fill(None, "isolated-quota", None),
        fill(
            Some(&image),
            "auto",
            Some(DiskLimit {
                bytes: 32 << 20,
                exclude_image: true,
            }),
        ),
    ] {
        let err = lamina_mount::pool::fill_for(&store, &fake, &request).unwrap_err();
        assert!(err.to_string().contains("nothing to pool"), "{err}");
    }
    assert_eq!(fake.subvolume_count(), 0);

    create(&store, &fake, &image, "live", &with("isolated-quota")).unwrap();
    create(
        &store,
        &fake,
        &image,
        "trashed",
        &with("isolated-quota,deferred"),
    )
    .unwrap();
    assert_eq!(delete(&store, &fake, "trashed").unwrap(), Deleted::Deferred);
    assert_eq!(fake.subvolume_count(), 2);
    lamina_mount::delete_store(&store, &fake).unwrap();
    assert_eq!(fake.subvolume_count(), 0);
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
}
