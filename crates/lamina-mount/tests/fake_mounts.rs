//! Create/delete logic against the fake mounter: no root, no kernel overlay.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use lamina_mount::{CreateOptions, Deleted, RootfsError, create, delete};
use lamina_sys::{Errno, FakeCall, FakeMounter};

#[test]
fn create_mounts_layers_top_first_and_delete_unmounts() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let created = create(&store, &fake, &image, "web-1", &CreateOptions::default()).unwrap();

    let chain = image.chain_ids();
    let FakeCall::Mount(target, spec) = &fake.calls()[0] else {
        panic!("expected a mount")
    };
    assert_eq!(target, &created.rootfs);
    assert_eq!(
        spec.lowers,
        vec![
            store.layout().layer_diff(&chain[1]),
            store.layout().layer_diff(&chain[0])
        ]
    );
    assert_eq!(
        spec.upper.as_deref(),
        Some(store.container_dirs("web-1").upper.as_path())
    );
    assert_eq!(
        lamina_mount::record::read(&store, "web-1")
            .unwrap()
            .rootfs
            .mount_options,
        spec.option_strings()
    );

    assert_eq!(delete(&store, &fake, "web-1").unwrap(), Deleted::Removed);
    assert!(fake.mounted().is_empty());
    assert!(!store.container_exists("web-1"));
    assert_eq!(delete(&store, &fake, "web-1").unwrap(), Deleted::NotFound);
}

#[test]
fn a_refused_mount_leaves_no_container_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    fake.fail_next_mount(Errno::INVAL);
    let err = create(&store, &fake, &image, "web-1", &CreateOptions::default()).unwrap_err();
    assert!(matches!(err, RootfsError::Mount(_)), "{err}");
    assert!(!store.container_exists("web-1"));
    assert!(store.containers().unwrap().is_empty());
    // The layers stay: they are verified and other containers may use them.
    assert!(store.has_layer(&image.chain_ids()[1]));
    create(&store, &fake, &image, "web-1", &CreateOptions::default()).unwrap();
}

#[test]
fn duplicates_fail_before_import_and_without_mount_mounts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    let created = create(
        &store,
        &fake,
        &image,
        "a",
        &CreateOptions {
            without_mount: true,
            ..CreateOptions::default()
        },
    )
    .unwrap();
    assert!(fake.calls().is_empty());
    assert!(!created.container.rootfs.mounted);
    let err = create(&store, &fake, &image, "a", &CreateOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(err, "image for id `a` already exists");
    assert_eq!(delete(&store, &fake, "a").unwrap(), Deleted::Removed);
}

#[test]
fn a_strategy_the_probe_cannot_confirm_is_refused_before_import() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    // The fake mounts nothing, so the metacopy probe sees no metadata-only copy-up.
    let fake = FakeMounter::new();
    let err = create(&store, &fake, &image, "m", &with("metacopy")).unwrap_err();
    assert!(
        matches!(
            err,
            RootfsError::Unsupported {
                strategy: "metacopy",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("lamina probe"), "{err}");
    assert!(!store.container_exists("m"));
    assert!(
        !store.has_layer(&image.chain_ids()[0]),
        "refused before importing"
    );
    assert!(
        fake.mounted().is_empty(),
        "probe scratch mounts were unmounted"
    );
}
