//! Kernel calls failing on purpose: each seam call the fake can fail, failed with the
//! errno the kernel would give, and the step that made it failing cleanly. No root.

#![allow(clippy::unwrap_used)]

mod common;

use common::setup_fake;

use lamina_mount::{CreateOptions, RootfsError, create, delete};
use lamina_sys::{Call, Errno, FakeCall, When};

fn no_mounts_and_no_container(store: &lamina_store::Store, fake: &lamina_sys::FakeMounter) {
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
    assert!(!store.container_exists("c"));
    assert!(store.containers().unwrap().is_empty());
    assert!(!store.layout().container("c").exists());
}

#[test]
fn ebusy_on_unmount_makes_delete_report_busy_and_keeps_the_container() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    let created = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap();
    fake.fail(Call::Unmount, When::Nth(1), Errno::BUSY);
    let err = delete(&store, &*fake, "c").unwrap_err();
    assert!(matches!(err, RootfsError::Busy { .. }), "{err}");
    assert!(store.container_exists("c"));
    assert!(fake.spec_at(&created.rootfs).is_some(), "still mounted");
    // The fault was one call: the next delete goes through.
    delete(&store, &*fake, "c").unwrap();
    assert!(fake.mounted().is_empty());
}

#[test]
fn enospc_writing_the_record_fails_create_and_leaves_no_container_and_no_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    fake.fail(
        Call::Write,
        When::path_contains("container.json"),
        Errno::NOSPC,
    );
    let err = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    no_mounts_and_no_container(&store, &fake);
    assert!(fake.calls().iter().any(
        |c| matches!(c, FakeCall::Write(p) if p.to_string_lossy().contains("container.json"))
    ));
}

#[test]
fn eio_on_fsync_of_the_record_fails_create_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    fake.fail(
        Call::Fsync,
        When::path_contains("container.json"),
        Errno::IO,
    );
    let err = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    no_mounts_and_no_container(&store, &fake);
}

#[test]
fn eio_on_syncfs_of_an_imported_layer_publishes_no_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    fake.fail(Call::Syncfs, When::Always, Errno::IO);
    let err = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    no_mounts_and_no_container(&store, &fake);
    for chain_id in image.chain_ids() {
        assert!(!store.has_layer(&chain_id));
    }
}

/// Where the journal orders direct writes, an imported layer with data has its own files
/// written back (started, then waited for) and the filesystem is not synced.
#[test]
fn a_layer_with_data_is_written_back_not_synced_where_the_journal_orders_direct_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    orders_direct_writes(&fake);
    create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap();
    let calls = fake.calls();
    let written = |wait: bool| {
        calls
            .iter()
            .filter(|c| matches!(c, FakeCall::WriteBack(_, w) if *w == wait))
            .count()
    };
    assert!(written(false) > 0, "{calls:?}");
    assert_eq!(
        written(false),
        written(true),
        "each file started and waited for"
    );
    assert!(
        !calls.iter().any(|c| matches!(c, FakeCall::Syncfs(_))),
        "{calls:?}"
    );
}

/// A write the device refused fails the import, and publishes nothing: a `syncfs` after
/// it would not be told of the error (it is reported once, to the write-back), so
/// syncing instead would publish a layer missing what the device never took.
#[test]
fn a_refused_write_back_publishes_no_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    orders_direct_writes(&fake);
    fake.fail(Call::WriteBack, When::Always, Errno::IO);
    let err = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("writing to the device")
            && err.to_string().contains("Input/output error"),
        "{err}"
    );
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, FakeCall::Syncfs(_))),
        "synced instead"
    );
    no_mounts_and_no_container(&store, &fake);
    for chain_id in image.chain_ids() {
        assert!(!store.has_layer(&chain_id));
    }
}

/// Makes `fake`'s filesystem one whose journal orders direct writes (journaled ext4 or
/// xfs, for the store).
fn orders_direct_writes(fake: &lamina_sys::FakeMounter) {
    fake.set_kernel(lamina_sys::FakeKernel {
        ordered_direct_writes: true,
        ..Default::default()
    });
}

#[test]
fn eio_on_syncfs_of_a_volatile_upper_is_a_writeback_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    create(&store, &*fake, &image, "c", &common::with("volatile")).unwrap();
    fake.fail(Call::Sync, When::Always, Errno::IO);
    let err = lamina_mount::unmount(&store, &*fake, "c").unwrap_err();
    assert!(
        matches!(err, RootfsError::VolatileWriteback { .. }),
        "{err}"
    );
}

#[test]
fn eperm_on_chown_fails_the_import_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    fake.fail(Call::Chown, When::Nth(3), Errno::PERM);
    let err = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("Operation not permitted"), "{err}");
    no_mounts_and_no_container(&store, &fake);
    assert!(
        std::fs::read_dir(store.layout().tmp())
            .unwrap()
            .next()
            .is_none()
    );
}

#[test]
fn enoent_on_mounting_the_upper_filesystem_fails_an_isolated_create_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    fake.fail(Call::MountUpperFs, When::Always, Errno::NOENT);
    let err = create(
        &store,
        &*fake,
        &image,
        "c",
        &common::with("isolated-memory"),
    )
    .unwrap_err();
    assert!(matches!(err, RootfsError::Mount(_)), "{err}");
    no_mounts_and_no_container(&store, &fake);
}

#[test]
fn the_import_records_owners_and_device_nodes_instead_of_making_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    let created = create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap();
    let calls = fake.calls();
    assert!(
        calls
            .iter()
            .any(|c| matches!(c, FakeCall::Chown { uid: 0, gid: 0, .. }))
    );
    let busybox = store
        .layout()
        .layer_diff(&created.container.record.layers[0])
        .join("bin/busybox");
    assert_eq!(fake.owner_of(&busybox), Some((0, 0)));
}

/// A container deleted while `check` runs (its rootfs renamed into trash/ after the
/// scan read its record) is skipped, not an error: the kernel's statx of the rootfs
/// answers ENOENT then. Guards against `check` failing beside a delete.
#[test]
fn check_skips_a_container_whose_rootfs_went_since_the_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    create(&store, &*fake, &image, "c", &CreateOptions::default()).unwrap();
    fake.fail(
        Call::IsMountpoint,
        When::path_contains("/images/c/"),
        Errno::NOENT,
    );
    let report = lamina_mount::check(&store, &*fake, false).unwrap();
    assert!(
        report
            .problems
            .iter()
            .all(|p| p.kind != "rootfs_not_mounted"),
        "{report:?}"
    );
}

/// The reaper unmounts every container of a pass on the store's filesystem before it
/// removes anything there — their directories, or an isolated container's (each unmount
/// syncs that filesystem, which a removal before it would give a journal commit to wait
/// for); one whose unmount fails busy stays in `trash/`, and the others go.
#[test]
fn the_reaper_unmounts_a_whole_pass_before_removing_and_keeps_one_busy_at_unmount() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = setup_fake(tmp.path());
    for (id, strategy) in [
        ("a", "deferred"),
        ("b", "deferred"),
        ("c", "deferred"),
        ("d", "isolated"),
    ] {
        create(&store, &*fake, &image, id, &common::with(strategy)).unwrap();
        assert_eq!(
            delete(&store, &*fake, id).unwrap(),
            lamina_mount::Deleted::Deferred
        );
    }
    let trash = store.layout().trash();
    // Asked at every unmount (and never failing one): how many containers are still in
    // `trash/` at that moment.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen_at, trash_at) = (seen.clone(), trash.clone());
    fake.fail(
        Call::Unmount,
        When::Path(std::sync::Arc::new(move |_| {
            let left = std::fs::read_dir(&trash_at).unwrap().count();
            seen_at.lock().unwrap().push(left);
            false
        })),
        Errno::IO,
    );
    let trash_b = trash.clone();
    let b = move |p: &std::path::Path| {
        p.strip_prefix(&trash_b)
            .is_ok_and(|rel| rel.to_string_lossy().starts_with("b."))
    };
    fake.fail(
        Call::Unmount,
        When::Path(std::sync::Arc::new(b)),
        Errno::BUSY,
    );

    let reaped = lamina_mount::reap(&store, &*fake).unwrap();
    assert_eq!((reaped.removed, reaped.failed), (3, 1), "{reaped:?}");
    let seen = seen.lock().unwrap().clone();
    // a, b and c's rootfs, then d's rootfs and own upper filesystem: all before the
    // first removal.
    assert_eq!(
        seen,
        vec![4; 5],
        "every unmount came before the first removal"
    );
    let left: Vec<String> = std::fs::read_dir(&trash)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.len() == 1 && left[0].starts_with("b."), "{left:?}");
    assert_eq!(fake.mounted().len(), 1, "b is still mounted");
}
