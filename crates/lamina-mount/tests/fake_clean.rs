//! Layer collection by `clean`, against the fake mounter: what is unused goes, what a
//! container, a pool or a create in flight uses stays, and a threshold holds it back.

#![allow(clippy::unwrap_used)]

mod common;

use common::{setup, with};

use std::fs;
use std::time::Duration;

use lamina_image::{ImageRef, Platform, resolve};
use lamina_mount::{Deleted, clean, create, delete};
use lamina_store::Store;
use lamina_sys::FakeMounter;

fn layer_count(store: &Store) -> usize {
    fs::read_dir(store.layout().layers()).unwrap().count()
}

/// The sample's base layer alone, as a rootfs tar: it shares that layer with the image.
fn base_only(tmp: &std::path::Path) -> lamina_image::Image {
    let tar = tmp.join("image/rootfs.tar");
    resolve(
        &ImageRef::parse(&tar.display().to_string()).unwrap(),
        &Platform::host(),
    )
    .unwrap()
}

#[test]
fn clean_removes_layers_no_container_uses_and_keeps_shared_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "two", &with("classic")).unwrap();
    create(
        &store,
        &fake,
        &base_only(tmp.path()),
        "one",
        &with("classic"),
    )
    .unwrap();
    assert_eq!(layer_count(&store), 2);

    let report = clean(&store, &fake, None).unwrap();
    assert_eq!(report.layers_removed, 0, "both layers are in use");

    assert_eq!(delete(&store, &fake, "two").unwrap(), Deleted::Removed);
    let report = clean(&store, &fake, None).unwrap();
    assert_eq!(report.layers_removed, 1, "{report:?}");
    assert!(report.bytes_freed > 0);
    assert!(
        report.message.contains("removed 1 unused layers"),
        "{}",
        report.message
    );
    let record = store.record("one").unwrap();
    assert!(
        store.has_layer(&record.layers[0]),
        "the base layer `one` uses stays"
    );
    assert!(
        fs::read_dir(store.layout().tmp()).unwrap().next().is_none(),
        "nothing collected is left in tmp/"
    );

    // The image comes back by importing again.
    let again = create(&store, &fake, &image, "two", &with("classic")).unwrap();
    assert!(
        again
            .container
            .record
            .layers
            .iter()
            .all(|l| store.has_layer(l))
    );
}

#[test]
fn a_threshold_the_store_stays_under_removes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    create(&store, &fake, &image, "gone", &with("classic")).unwrap();
    delete(&store, &fake, "gone").unwrap();

    let report = clean(&store, &fake, Some(u64::MAX / 2)).unwrap();
    assert!(report.skipped);
    assert!(
        report.message.starts_with("threshold not reached"),
        "{}",
        report.message
    );
    assert!(report.store_bytes.unwrap() > 0);
    assert_eq!(layer_count(&store), 2);

    let report = clean(&store, &fake, Some(1)).unwrap();
    assert!(!report.skipped);
    assert_eq!((report.layers_removed, layer_count(&store)), (2, 0));
}

#[test]
fn clean_waits_for_a_create_in_flight_and_keeps_a_pools_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, image) = setup(tmp.path());
    let fake = FakeMounter::new();
    // A create between import and record holds the layers; clean must wait for it.
    let in_flight = store.use_layers().unwrap();
    store.import(&image).unwrap();
    std::thread::scope(|s| {
        let cleaning = s.spawn(|| clean(&store, &fake, None).unwrap());
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !cleaning.is_finished(),
            "clean collected under a create in flight"
        );
        assert_eq!(layer_count(&store), 2);
        drop(in_flight);
        assert_eq!(cleaning.join().unwrap().layers_removed, 2);
    });

    // A pool's target is an operator's standing order: its layers stay.
    let chain_ids = store.import(&image).unwrap();
    let kind =
        lamina_mount::pool::PoolKind::overlays(&chain_ids, lamina_mount::Flavour::PLAIN, None);
    lamina_mount::pool::fill(&store, &fake, &kind, Some(1)).unwrap();
    let report = clean(&store, &fake, None).unwrap();
    assert_eq!(
        (report.layers_removed, report.pool_released),
        (0, 0),
        "{report:?}"
    );
    // Drained, the pool's order is withdrawn and its layers are free to go.
    assert_eq!(lamina_mount::pool::drain(&store, &fake).unwrap(), 1);
    assert_eq!(clean(&store, &fake, None).unwrap().layers_removed, 2);
}

/// A container directory is staged under a hidden name until its lock is held: `clean`
/// leaves one whose creator lives (it used to see a `new-` directory with no lock file
/// yet and remove it from under the create), and sweeps one a dead creator left.
#[test]
fn clean_sweeps_a_half_staged_directory_only_once_its_creator_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _image, fake) = common::setup_fake(tmp.path());
    let staging = |pid: u32| {
        let dir = store
            .layout()
            .tmp()
            .join(format!("{}new-{pid}-1-0", lamina_store::STAGING_PREFIX));
        fs::create_dir(&dir).unwrap();
        dir
    };
    let live = staging(std::process::id());
    // No process has this pid: Linux's pid_max is at most 2^22.
    let dead = staging(u32::MAX);
    let report = clean(&store, fake.as_ref(), None).unwrap();
    assert_eq!(report.tmp_removed, 1, "{report:?}");
    assert!(live.exists() && !dead.exists());
}
