//! composefs where the store's filesystem has fs-verity (issue 24), against the fake
//! kernel (this VM's kernel has no fs-verity, so nothing real can seal a file here):
//! the probe finds it, the build seals every object and the metadata image and marks the
//! image sealed, and its containers mount with `verity=require`; an image built before
//! the kernel could seal stays as it was until it is built again; a seal the kernel refuses fails
//! the create and leaves no image behind. Without fs-verity nothing is sealed and the
//! option is absent. And the build's durability: the directories it published objects
//! in are fsynced (no syncfs of the store's filesystem), and a failed fsync fails it.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::with;
use lamina_image::{Image, ImageRef, Platform, resolve};
use lamina_mount::{composefs, create, probe};
use lamina_store::{Store, StoreProperties};
use lamina_sys::{Call, Errno, FakeCall, FakeKernel, FakeMounter, When};

/// A store on `fake`, and an image whose busybox is past composefs's inline limit (so it
/// becomes an object).
fn store_and_image(tmp: &Path, fake: &Arc<FakeMounter>) -> (Store, Image) {
    let busybox = tmp.join("fake-busybox");
    std::fs::write(&busybox, [b'#'; 300]).unwrap();
    let built = lamina_sample::busybox_image(&busybox).unwrap();
    let files = lamina_sample::write_all_formats(&built, &tmp.join("image")).unwrap();
    let image = resolve(
        &ImageRef::parse(&files.references()[0]).unwrap(),
        &Platform::host(),
    )
    .unwrap();
    let store = Store::init_hosted(
        &tmp.join("store"),
        &StoreProperties::default(),
        fake.clone(),
    )
    .unwrap();
    (store, image)
}

fn kernel(fs_verity: bool) -> FakeKernel {
    FakeKernel {
        fs_verity,
        ..FakeKernel::default()
    }
}

/// A store and image on a fake kernel that has fs-verity or not, its probe taken. Bind
/// `tmp` for as long as the store is used: dropping it removes the store.
struct Fixture {
    tmp: tempfile::TempDir,
    fake: Arc<FakeMounter>,
    store: Store,
    image: Image,
}

fn fixture(fs_verity: bool) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeMounter::new());
    fake.set_kernel(kernel(fs_verity));
    let (store, image) = store_and_image(tmp.path(), &fake);
    assert_eq!(probe_afresh(&store, &fake), Some(fs_verity));
    Fixture {
        tmp,
        fake,
        store,
        image,
    }
}

/// Probes the store afresh (the fake mounts nothing, so copy-up is never observed: the
/// overlay features composefs needs are then claimed as a real 6.x kernel has them) and
/// returns what it found about fs-verity.
fn probe_afresh(store: &Store, fake: &FakeMounter) -> Option<bool> {
    let mut found = probe::probe(store, fake, true).unwrap();
    found.metacopy = true;
    found.volatile = true;
    found.redirect_dir = true;
    found.erofs_file_backed = Some(true);
    std::fs::write(
        probe::cache_path(store),
        serde_json::to_vec(&found).unwrap(),
    )
    .unwrap();
    found.fs_verity
}

fn objects(store: &Store) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for fan_out in std::fs::read_dir(store.layout().objects()).unwrap() {
        for object in std::fs::read_dir(fan_out.unwrap().path()).unwrap() {
            found.push(object.unwrap().path());
        }
    }
    found
}

fn requires_verity(fake: &FakeMounter, rootfs: &Path) -> bool {
    let spec = fake.spec_at(rootfs).unwrap();
    spec.options
        .contains(&("verity".to_string(), Some("require".to_string())))
}

fn image_of(store: &Store, image: &Image) -> PathBuf {
    let top = image.chain_ids().pop().unwrap();
    composefs::image_path(store, &top)
}

#[test]
fn a_store_with_fs_verity_seals_objects_and_images_and_mounts_with_verity_require() {
    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(true);

    let created = create(&store, &*fake, &image, "a", &with("composefs")).unwrap();
    assert!(requires_verity(&fake, &created.rootfs));
    let objects = objects(&store);
    assert!(!objects.is_empty(), "busybox is an object");
    for object in &objects {
        assert!(fake.has_verity(object), "{} sealed", object.display());
    }
    let metadata_image = image_of(&store, &image);
    assert!(
        fake.has_verity(&metadata_image),
        "the metadata image sealed"
    );
    assert!(composefs::verity_path(&metadata_image).is_file());

    // A classic container of the same store is not composefs: no verity option.
    let classic = create(&store, &*fake, &image, "c", &with("classic")).unwrap();
    assert!(!requires_verity(&fake, &classic.rootfs));
}

#[test]
fn without_fs_verity_nothing_is_sealed_and_an_image_stays_as_it_was_built() {
    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(false);

    let created = create(&store, &*fake, &image, "a", &with("composefs")).unwrap();
    assert!(!requires_verity(&fake, &created.rootfs));
    let metadata_image = image_of(&store, &image);
    assert!(!composefs::verity_path(&metadata_image).exists());
    // The probe's own scratch file aside.
    let sealed_any = |fake: &FakeMounter| {
        fake.calls().iter().any(
            |c| matches!(c, FakeCall::EnableVerity(p) if !p.to_string_lossy().contains("/probe-")),
        )
    };
    assert!(!sealed_any(&fake), "nothing sealed");

    // The kernel (or the store's filesystem) gains fs-verity: the image built before
    // stays unsealed, so containers made on it (whose metacopy copy-ups carry no
    // digest) mount as before; sealed in place, `verity=require` would refuse them.
    fake.set_kernel(kernel(true));
    assert_eq!(probe_afresh(&store, &fake), Some(true));
    let unsealed = create(&store, &*fake, &image, "b", &with("composefs")).unwrap();
    assert!(!requires_verity(&fake, &unsealed.rootfs));
    assert!(!sealed_any(&fake));
    let remounted = lamina_mount::unmount(&store, &*fake, "a")
        .and_then(|_| lamina_mount::mount(&store, &*fake, "a"));
    remounted.unwrap();
    assert!(!requires_verity(&fake, &created.rootfs));

    // Once nothing is made of it, `clean` removes it; built again, it is sealed.
    for id in ["a", "b"] {
        lamina_mount::delete(&store, &*fake, id).unwrap();
    }
    lamina_mount::clean(&store, &*fake, Some(0)).unwrap();
    assert!(!metadata_image.exists());
    let sealed = create(&store, &*fake, &image, "c", &with("composefs")).unwrap();
    assert!(requires_verity(&fake, &sealed.rootfs));
    assert!(fake.has_verity(&metadata_image));
    for object in objects(&store) {
        assert!(fake.has_verity(&object), "{} sealed", object.display());
    }
}

#[test]
fn a_seal_the_kernel_refuses_fails_the_create_and_leaves_no_image() {
    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(true);

    fake.fail(Call::EnableVerity, When::Always, Errno::TXTBSY);
    let err = create(&store, &*fake, &image, "a", &with("composefs")).unwrap_err();
    assert!(err.to_string().contains("fs-verity"), "{err}");
    let metadata_image = image_of(&store, &image);
    assert!(!metadata_image.exists(), "no image without its seals");
    assert!(!composefs::verity_path(&metadata_image).exists());
    assert!(!store.container_exists("a"));
    assert!(fake.mounted().is_empty(), "{:?}", fake.mounted());
}

/// The build makes its objects' names durable with an fsync of each directory it linked
/// into, not a syncfs of the store's filesystem (every container's dirty upper with it):
/// one that fails fails the build, and no image names objects that may not survive.
#[test]
fn the_build_syncs_the_directories_it_published_objects_in_and_fails_without_them() {
    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(false);
    let objects_dir = store.layout().objects();
    fake.fail(
        Call::Fsync,
        When::path_contains(&format!("{}/", objects_dir.display())),
        Errno::IO,
    );
    let err = create(&store, &*fake, &image, "a", &with("composefs")).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    assert!(
        !image_of(&store, &image).exists(),
        "no image naming unsynced objects"
    );
    assert!(!store.container_exists("a"));

    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(false);
    create(&store, &*fake, &image, "a", &with("composefs")).unwrap();
    let calls = fake.calls();
    let synced_fan_outs = calls
        .iter()
        .filter(|c| matches!(c, FakeCall::Fsync(p) if p.parent() == Some(store.layout().objects().as_path())))
        .count();
    assert!(synced_fan_outs >= 1, "{calls:?}");
    let objects = store.layout().objects();
    assert!(
        !calls
            .iter()
            .any(|c| matches!(c, FakeCall::Syncfs(p) if p.starts_with(&objects))),
        "no syncfs of the store's filesystem for the objects: {calls:?}"
    );
}

/// `auto`'s background build records only what the image makes fail: an I/O error is
/// not the image's and must not turn composefs off for good; a build that died once in
/// this boot is tried again, twice is refused; a mark from another boot counts nothing.
#[test]
fn background_builds_refuse_only_what_would_fail_again() {
    use lamina_mount::composefs_auto::{Built, build_for, refused_path};
    let Fixture {
        tmp: _tmp,
        fake,
        store,
        image,
    } = fixture(false);
    create(&store, &*fake, &image, "c", &with("classic")).unwrap();
    let chain = image.chain_ids();
    let metadata_image = image_of(&store, &image);
    let mut building = metadata_image.as_os_str().to_os_string();
    building.push(".building");
    let building = PathBuf::from(building);
    let refused = refused_path(&metadata_image);

    // The first fsync of an objects directory fails, once.
    let objects_dir = store.layout().objects();
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = fired.clone();
    fake.fail(
        Call::Fsync,
        When::Path(Arc::new(move |p: &Path| {
            p.starts_with(&objects_dir) && !once.swap(true, std::sync::atomic::Ordering::SeqCst)
        })),
        Errno::IO,
    );
    let failed = build_for(&store, &*fake, &chain).unwrap();
    assert!(fired.load(std::sync::atomic::Ordering::SeqCst));
    assert!(matches!(failed, Built::Failed(_)), "{failed:?}");
    assert!(!refused.exists() && !building.exists() && !metadata_image.exists());

    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    std::fs::write(&building, "another-boot 7").unwrap();
    assert_eq!(build_for(&store, &*fake, &chain).unwrap(), Built::Built);
    assert!(!building.exists() && !refused.exists());

    std::fs::remove_file(&metadata_image).unwrap();
    std::fs::write(&building, format!("{} 2", this_boot.trim())).unwrap();
    let refusal = build_for(&store, &*fake, &chain).unwrap();
    assert!(matches!(refusal, Built::Refused(_)), "{refusal:?}");
    assert!(refused.is_file() && !building.exists() && !metadata_image.exists());
    assert_eq!(
        lamina_mount::composefs_auto::state(&store, &chain),
        lamina_mount::MetadataImage::Refused
    );

    // The operator's composefs builds and mounts it: the refusal goes.
    create(&store, &*fake, &image, "n", &with("composefs")).unwrap();
    assert!(!refused.exists());
    assert_eq!(
        lamina_mount::composefs_auto::state(&store, &chain),
        lamina_mount::MetadataImage::Built
    );
}

/// The file bytes a build may hash are counted on the merged tree: a file a later layer
/// replaces is never hashed, so it does not count (guards against counting every layer's
/// copy, which refuses images that hash far less).
#[test]
fn the_file_bytes_bound_counts_what_the_merged_tree_holds() {
    use lamina_mount::composefs::{Limits, ensure_within};
    let Fixture {
        tmp, fake, store, ..
    } = fixture(false);
    let layer = |size: usize| lamina_sample::Layer {
        tar: lamina_sample::LayerBuilder::new()
            .file("f", 0o644, &vec![b'x'; size])
            .unwrap()
            .finish()
            .unwrap(),
        compression: lamina_image::Compression::None,
    };
    let built = lamina_sample::build_image(
        &[layer(3000), layer(2999)],
        &["PATH=/bin"],
        &Platform::host(),
    )
    .unwrap();
    let dir = tmp.path().join("two");
    lamina_sample::write_oci_layout(&dir, &[&built], &[(built.manifest.clone(), Some("x"))])
        .unwrap();
    let image = resolve(
        &ImageRef::parse(&format!("oci://{}:x", dir.display())).unwrap(),
        &Platform::host(),
    )
    .unwrap();
    create(&store, &*fake, &image, "c", &with("classic")).unwrap();
    let chain = image.chain_ids();
    let limits = |file_bytes| Limits {
        file_bytes,
        ..Limits::NAMED
    };
    let err = ensure_within(&store, &*fake, &chain, limits(2998)).unwrap_err();
    assert!(err.to_string().contains("2998 bytes"), "{err}");
    ensure_within(&store, &*fake, &chain, limits(2999)).unwrap();
}
