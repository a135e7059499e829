//! uid/gid-mapped stores against the fake mounter: what the plan asks the mounter for
//! (idmapped lowers, the mapped root owning the upper), and what such a store refuses.
//! The chowned case chowns layer files, so it needs root (as scripts/test runs); runc
//! booting these in a user namespace is in integration/tests/garden.rs.

#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use lamina_mount::{CreateOptions, RootfsError, create};
use lamina_store::{IdMap, IdMapping, Store, StoreProperties};
use lamina_sys::FakeMounter;

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
    let (_, image) = setup(tmp.path());
    let store = Store::init_with(&tmp.path().join("mapped"), &mapped(false)).unwrap();
    let fake = FakeMounter::new();
    let created = create(&store, &fake, &image, "c", &with("classic")).unwrap();
    let spec = fake.spec_at(&created.rootfs).unwrap();
    let maps = spec.lower_idmap.expect("lowers idmapped");
    assert_eq!(maps.uid_map, "0 100000 65536\n");
    assert_eq!(spec.upper_owner, Some((100000, 100000)));

    let unmounted = CreateOptions {
        without_mount: true,
        ..with("classic")
    };
    let err = create(&store, &fake, &image, "u", &unmounted).unwrap_err();
    assert!(matches!(err, RootfsError::WithoutMountIdmapped), "{err}");
    assert!(!store.container_exists("u"));
}

#[test]
fn a_chowned_store_mounts_plain_lowers_of_layers_owned_by_the_mapped_root() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let (_, image) = setup(tmp.path());
    let store = Store::init_with(&tmp.path().join("mapped"), &mapped(true)).unwrap();
    let fake = FakeMounter::new();
    let created = create(&store, &fake, &image, "c", &with("classic")).unwrap();
    let spec = fake.spec_at(&created.rootfs).unwrap();
    assert_eq!(spec.lower_idmap, None);
    assert_eq!(spec.upper_owner, Some((100000, 100000)));
    let busybox = store
        .layout()
        .layer_diff(&created.container.record.layers[0])
        .join("bin/busybox");
    assert_eq!(std::fs::metadata(busybox).unwrap().uid(), 100000);
}
