//! The operations a caller that mounts for itself (containerd, through the snapshotter)
//! calls — attach, create_empty, upper_to_commit, commit_upper — and the repair of a
//! crashed create, against the fake kernel with faults injected: no root.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, setup_fake, with, without_mount};

use lamina_mount::{
    Attach, CreateOptions, RootfsError, attach, commit_upper, create, create_empty,
    remove_crashed_create, unmount, upper_to_commit,
};
use lamina_sys::{Call, Errno, FakeMounter, Mounter, When};

#[test]
fn a_classic_container_the_caller_mounts_attaches_as_its_overlay_and_mounts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "c", &without_mount("classic")).unwrap();
    let before = fake.calls().len();

    let Attach::Overlay { options } = attach(&store, &fake, "c").unwrap() else {
        panic!("a classic container the caller mounts is an overlay");
    };
    let upper = store.container_dirs("c").upper;
    assert!(
        options.contains(&format!("upperdir={}", upper.display())),
        "{options:?}"
    );
    let lowers = options.iter().find(|o| o.starts_with("lowerdir=")).unwrap();
    assert_eq!(
        lowers.split(':').count(),
        image.chain_ids().len(),
        "{lowers}"
    );
    assert!(
        !fake.is_mountpoint(&store.rootfs_path("c")).unwrap(),
        "attach mounts nothing lamina does not mount"
    );
    assert!(fake.calls()[before..].iter().all(|c| !matches!(
        c,
        lamina_sys::FakeCall::Mount(..) | lamina_sys::FakeCall::BindReadOnly { .. }
    )));
}

#[test]
fn a_volatile_container_is_mounted_again_by_attach_and_a_failed_mount_fails_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "v", &without_mount("volatile")).unwrap();
    let rootfs = store.rootfs_path("v");
    assert!(
        fake.is_mountpoint(&rootfs).unwrap(),
        "lamina mounts a volatile overlay"
    );
    unmount(&store, &fake, "v").unwrap();

    // Only lamina may mount it again (the kernel's volatile mark): a failed mount is the
    // caller's error, never a bind of the empty directory beneath.
    fake.fail_next_mount(Errno::NOMEM);
    let err = attach(&store, &fake, "v").unwrap_err();
    assert!(
        matches!(err, RootfsError::Mount(ref e) if e.errno == Errno::NOMEM),
        "{err}"
    );
    assert!(!fake.is_mountpoint(&rootfs).unwrap());

    let attached = attach(&store, &fake, "v").unwrap();
    assert_eq!(
        attached,
        Attach::Bind {
            source: rootfs.clone(),
            read_only: false
        }
    );
    assert!(fake.is_mountpoint(&rootfs).unwrap());
}

#[test]
fn an_empty_container_is_a_bind_of_its_upper_and_a_failed_record_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _image, fake) = setup_fake(tmp.path());
    create_empty(&store, "rw", "snapshot:rw", false).unwrap();
    create_empty(&store, "ro", "snapshot:ro", true).unwrap();
    assert_eq!(
        attach(&store, fake.as_ref(), "rw").unwrap(),
        Attach::Bind {
            source: store.container_dirs("rw").upper,
            read_only: false
        }
    );
    assert_eq!(
        attach(&store, fake.as_ref(), "ro").unwrap(),
        Attach::Bind {
            source: store.container_dirs("ro").upper,
            read_only: true
        }
    );

    // A full disk when its record is written: no directory is left to look like a
    // crashed create.
    fake.fail(Call::Write, When::Always, Errno::NOSPC);
    fake.fail(Call::Fsync, When::Always, Errno::NOSPC);
    assert!(create_empty(&store, "full", "snapshot:full", false).is_err());
    assert!(!store.container_exists("full"));
    assert!(!store.layout().container("full").exists());
}

#[test]
fn an_upper_on_its_own_filesystem_is_not_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "iso", &with("isolated-memory")).unwrap();
    let err = upper_to_commit(&store, &fake, "iso").unwrap_err();
    assert!(
        matches!(err, RootfsError::UpperNotCommittable { .. }),
        "{err}"
    );
    let published = commit_upper(&store, &fake, "iso", |_| panic!("published")).unwrap_err();
    assert!(matches!(published, RootfsError::UpperNotCommittable { .. }));
    assert!(
        fake.is_mountpoint(&store.rootfs_path("iso")).unwrap(),
        "a refused commit leaves the container as it was"
    );
}

#[test]
fn a_commit_unmounts_before_it_publishes_and_a_busy_rootfs_publishes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    // The fake's probe sees no copy-up; this kernel's does.
    lamina_conformance::adapter::assume_full_probe(&store, &fake).unwrap();
    create(&store, &fake, &image, "m", &with("metacopy")).unwrap();
    let rootfs = store.rootfs_path("m");

    // metacopy's copy-ups hold no data: the commit is told the lowers to fill them from.
    let upper = upper_to_commit(&store, &fake, "m").unwrap();
    assert_eq!(upper.upper, store.container_dirs("m").upper);
    assert_eq!(
        upper.metacopy_lowers.as_ref().map(Vec::len),
        Some(image.chain_ids().len())
    );

    fake.fail(Call::Unmount, When::Nth(1), Errno::BUSY);
    let err = commit_upper(&store, &fake, "m", |_| panic!("published while mounted")).unwrap_err();
    assert!(matches!(err, RootfsError::Busy { .. }), "{err}");
    assert!(fake.is_mountpoint(&rootfs).unwrap());

    let seen_mounted = commit_upper(&store, &fake, "m", |u| {
        (u.upper.clone(), fake.is_mountpoint(&rootfs).unwrap())
    })
    .unwrap();
    assert_eq!(seen_mounted, (store.container_dirs("m").upper, false));
    assert!(
        !lamina_mount::record::read(&store, "m")
            .unwrap()
            .rootfs
            .mounted
    );
}

#[test]
fn a_crashed_create_is_removed_unless_a_mount_in_it_cannot_be_undone() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    // A create that died after mounting and before writing its record.
    create(&store, &fake, &image, "crashed", &CreateOptions::default()).unwrap();
    std::fs::remove_file(store.layout().container("crashed").join("container.json")).unwrap();

    fake.fail(Call::Unmount, When::Nth(1), Errno::BUSY);
    assert!(remove_crashed_create(&store, &fake, "crashed").is_err());
    assert!(
        store.layout().container("crashed").exists(),
        "nothing is removed from under a mount that stayed"
    );

    assert!(remove_crashed_create(&store, &fake, "crashed").unwrap());
    assert!(!store.layout().container("crashed").exists());
    assert!(
        fake.mounts_under(&store.layout().images())
            .unwrap()
            .is_empty()
    );
    // A finished container is not a crashed create.
    create(&store, &fake, &image, "alive", &CreateOptions::default()).unwrap();
    assert!(!remove_crashed_create(&store, &fake, "alive").unwrap());
    assert!(store.container_exists("alive"));
}
