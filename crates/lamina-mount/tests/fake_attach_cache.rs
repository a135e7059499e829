//! `AttachCache`: containerd's Mounts answered from what Prepare worked out, while the
//! container's record is the one it came from, and worked out again whenever it is not.
//! Against the fake kernel: no root.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, without_mount};

use lamina_mount::{
    Attach, AttachCache, CreateOptions, RootfsError, create, delete, mount, unmount,
};
use lamina_sys::{FakeCall, FakeMounter, Mounter};

/// A store with classic container `c`, which the caller mounts (as containerd does).
fn caller_mounted(
    tmp: &std::path::Path,
) -> (lamina_store::Store, lamina_image::Image, FakeMounter) {
    let (store, image) = setup(tmp);
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "c", &without_mount("classic")).unwrap();
    (store, image, fake)
}

#[test]
fn a_kept_answer_stands_while_the_record_is_unchanged_and_no_longer_once_it_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _, fake) = caller_mounted(tmp.path());
    let cache = AttachCache::default();

    let first = cache.attach(&store, &fake, "c").unwrap();
    assert!(matches!(first, Attach::Overlay { .. }), "{first:?}");
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
    assert_eq!(cache.hits(), 1, "the second answer was the kept one");

    // lamina mounts it now (Garden's `mount`): the record says so, and the answer is the
    // rootfs lamina mounted, never the overlay kept from before.
    mount(&store, &fake, "c").unwrap();
    let rootfs = store.rootfs_path("c");
    assert_eq!(
        cache.attach(&store, &fake, "c").unwrap(),
        Attach::Bind {
            source: rootfs.clone(),
            read_only: false
        }
    );
    assert_eq!(cache.hits(), 1);

    // Unmounted by lamina, it is the caller's overlay again.
    unmount(&store, &fake, "c").unwrap();
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
}

#[test]
fn an_answer_that_depends_on_what_is_mounted_is_never_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "v", &without_mount("volatile")).unwrap();
    let cache = AttachCache::default();
    let rootfs = store.rootfs_path("v");
    let bind = Attach::Bind {
        source: rootfs.clone(),
        read_only: false,
    };
    assert_eq!(cache.attach(&store, &fake, "v").unwrap(), bind);

    // Only lamina mounts a volatile overlay: unmounted behind the answer's back (the
    // record unchanged), the next answer mounts it again rather than bind the empty
    // directory beneath.
    fake.unmount(&rootfs).unwrap();
    let mounts = |fake: &FakeMounter| {
        let calls = fake.calls();
        calls
            .iter()
            .filter(|c| matches!(c, FakeCall::Mount(..)))
            .count()
    };
    let before = mounts(&fake);
    assert_eq!(cache.attach(&store, &fake, "v").unwrap(), bind);
    assert_eq!(mounts(&fake), before + 1, "attach mounted it again");
    assert!(fake.is_mountpoint(&rootfs).unwrap());
    assert_eq!(cache.hits(), 0);
}

#[test]
fn a_removed_container_is_not_answered_from_what_was_kept_nor_one_made_again_under_its_id() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = caller_mounted(tmp.path());
    let cache = AttachCache::default();
    let first = cache.attach(&store, &fake, "c").unwrap();

    delete(&store, &fake, "c").unwrap();
    let err = cache.attach(&store, &fake, "c").unwrap_err();
    assert!(
        matches!(
            err,
            RootfsError::Store(lamina_store::StoreError::NotFound(_))
        ),
        "{err}"
    );

    // The same ID again, read-only: another record, another answer.
    let read_only = CreateOptions {
        read_only: true,
        ..without_mount("classic")
    };
    create(&store, &fake, &image, "c", &read_only).unwrap();
    let again = cache.attach(&store, &fake, "c").unwrap();
    assert_ne!(again, first);
    let Attach::Overlay { options } = &again else {
        panic!("a classic container the caller mounts is an overlay: {again:?}");
    };
    assert!(options.iter().any(|o| o == "ro"), "{options:?}");
    assert_eq!(cache.hits(), 0);
}

#[test]
fn whose_the_container_is_is_asked_of_the_kept_record_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _, fake) = caller_mounted(tmp.path());
    let cache = AttachCache::default();
    let image_of = store.record("c").unwrap().image;

    let ours = cache
        .attach_if(&store, &fake, "c", |r| r.image == image_of)
        .unwrap();
    assert!(ours.is_some());
    let theirs = cache
        .attach_if(&store, &fake, "c", |r| r.image == "another")
        .unwrap();
    assert_eq!(
        theirs, None,
        "a kept answer is still refused to another owner"
    );
    assert_eq!(cache.hits(), 1);
    let ours_again = cache
        .attach_if(&store, &fake, "c", |r| r.image == image_of)
        .unwrap();
    assert_eq!(ours_again, ours);
}

#[test]
fn a_step_holding_the_id_is_waited_for_not_answered_past() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let store = store.with_lock_timeout(std::time::Duration::from_millis(50));
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "c", &without_mount("classic")).unwrap();
    let cache = AttachCache::default();
    let first = cache.attach(&store, &fake, "c").unwrap();

    // A commit or delete of it in flight holds the ID: the answer waits for it (here
    // past the store's lock timeout), as it did before anything was kept.
    assert!(
        !store.id_held("never-made"),
        "no lock file: nobody holds it"
    );
    let held = store.lock_id("c").unwrap();
    assert!(store.id_held("c"));
    let err = cache.attach(&store, &fake, "c").unwrap_err();
    assert!(
        matches!(
            err,
            RootfsError::Store(lamina_store::StoreError::LockTimeout { .. })
        ),
        "{err}"
    );
    drop(held);
    assert!(!store.id_held("c"));
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
    assert_eq!(cache.hits(), 0, "worked out again, under the ID");
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
    assert_eq!(cache.hits(), 1, "and kept again");
}

#[test]
fn a_layer_link_changed_behind_laminas_back_is_answered_as_it_is_now() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image, fake) = caller_mounted(tmp.path());
    let cache = AttachCache::default();
    let first = cache.attach(&store, &fake, "c").unwrap();
    let top = image.chain_ids().last().unwrap().clone();
    let link = store.layer_link(&top).unwrap();

    // Removed: made again under its name, holding the ID, and the same answer kept.
    std::fs::remove_file(&link).unwrap();
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
    assert_eq!(cache.hits(), 0);
    assert_eq!(cache.attach(&store, &fake, "c").unwrap(), first);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        std::path::Path::new("../layers")
            .join(top.hex())
            .join("diff")
    );
    assert_eq!(cache.hits(), 1);

    // Taken by something else meanwhile: the layer gets a longer name, which the answer
    // now names, never the name that points elsewhere.
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("/nowhere", &link).unwrap();
    let now = cache.attach(&store, &fake, "c").unwrap();
    assert_ne!(now, first);
    let Attach::Overlay { options } = &now else {
        panic!("{now:?}");
    };
    let lowers = options
        .iter()
        .find_map(|o| o.strip_prefix("lowerdir="))
        .unwrap();
    assert!(
        !lowers.split(':').any(|l| l == link.to_str().unwrap()),
        "{lowers}"
    );
    let longer = store.layer_link(&top).unwrap();
    assert_ne!(longer, link);
    assert!(
        lowers.split(':').any(|l| l == longer.to_str().unwrap()),
        "{lowers}"
    );
    assert_eq!(
        std::fs::read_link(&longer).unwrap(),
        std::path::Path::new("../layers")
            .join(top.hex())
            .join("diff")
    );
    assert_eq!(cache.hits(), 1);
}
