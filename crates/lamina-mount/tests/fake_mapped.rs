//! uid/gid-mapped stores against the fake mounter: what the plan asks the mounter for
//! (idmapped lowers, the mapped root owning the upper), and what such a store refuses.
//! The chowned case's chowns go through the fake host, which records them: no root
//! needed. runc booting these in a user namespace is in integration/tests/garden.rs.

#![allow(clippy::unwrap_used)]

mod common;

use common::{setup_fake, store_on, with};

use lamina_mount::{CreateOptions, RootfsError, create};
use lamina_store::{IdMap, IdMapping, StoreProperties};

fn mapped(chowned_layers: bool) -> StoreProperties {
    let line = IdMapping::parse("0:100000:65536").unwrap();
    StoreProperties {
        id_map: IdMap {
            uids: vec![line],
            gids: vec![line],
        },
        chowned_layers,
        ..StoreProperties::default()
    }
}

#[test]
fn an_idmapped_store_mounts_idmapped_lowers_under_an_upper_its_root_owns() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, image, fake) = setup_fake(tmp.path());
    let store = store_on(tmp.path(), "mapped", &mapped(false), &fake);
    let created = create(&store, &*fake, &image, "c", &with("classic")).unwrap();
    let spec = fake.spec_at(&created.rootfs).unwrap();
    let maps = spec.lower_idmap.expect("lowers idmapped");
    assert_eq!(maps.uid_map, "0 100000 65536\n");
    assert_eq!(spec.upper_owner, Some((100000, 100000)));

    let unmounted = CreateOptions {
        without_mount: true,
        ..with("classic")
    };
    let err = create(&store, &*fake, &image, "u", &unmounted).unwrap_err();
    assert!(matches!(err, RootfsError::WithoutMountIdmapped), "{err}");
    assert!(!store.container_exists("u"));
}

#[test]
fn a_chowned_store_mounts_plain_lowers_of_layers_owned_by_the_mapped_root() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, image, fake) = setup_fake(tmp.path());
    let store = store_on(tmp.path(), "mapped", &mapped(true), &fake);
    let created = create(&store, &*fake, &image, "c", &with("classic")).unwrap();
    let spec = fake.spec_at(&created.rootfs).unwrap();
    assert_eq!(spec.lower_idmap, None);
    assert_eq!(spec.upper_owner, Some((100000, 100000)));
    let busybox = store
        .layout()
        .layer_diff(&created.container.record.layers[0])
        .join("bin/busybox");
    assert_eq!(fake.owner_of(&busybox), Some((100000, 100000)));
    // The store's own directories were given to root (group: the mapped root's).
    assert_eq!(fake.owner_of(store.root()), Some((0, 100000)));
}
