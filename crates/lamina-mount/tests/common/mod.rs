//! Setup shared by the fake-mounter tests: a store and the busybox sample image, with a
//! stand-in busybox binary (nothing runs it; the fake mounts nothing). The store makes
//! its ownership, device-node, xattr and durable-write calls through a fake host too,
//! so these tests need no root and no capabilities.

#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::sync::Arc;

use lamina_image::{Image, ImageRef, Platform, resolve};
use lamina_mount::{CreateOptions, Strategies};
use lamina_sample::{busybox_image, write_all_formats};
use lamina_store::{Store, StoreProperties};
use lamina_sys::FakeMounter;

/// A store on a fake host of its own, and the image.
pub fn setup(tmp: &Path) -> (Store, Image) {
    let (store, image, _) = setup_fake(tmp);
    (store, image)
}

/// [`setup`], returning the fake that is the store's host, to mount with as well, so a
/// test can fail or inspect any seam call.
pub fn setup_fake(tmp: &Path) -> (Store, Image, Arc<FakeMounter>) {
    let fake = Arc::new(FakeMounter::new());
    let image = image(tmp);
    let store = Store::init_hosted(
        &tmp.join("store"),
        &StoreProperties::default(),
        fake.clone(),
    )
    .unwrap();
    (store, image, fake)
}

/// A store at `tmp/<name>` with `properties`, on `fake` as its host.
pub fn store_on(
    tmp: &Path,
    name: &str,
    properties: &StoreProperties,
    fake: &Arc<FakeMounter>,
) -> Store {
    Store::init_hosted(&tmp.join(name), properties, fake.clone()).unwrap()
}

fn image(tmp: &Path) -> Image {
    let busybox = tmp.join("fake-busybox");
    fs::write(&busybox, b"#!/bin/true\n").unwrap();
    let files = write_all_formats(&busybox_image(&busybox).unwrap(), &tmp.join("image")).unwrap();
    resolve(
        &ImageRef::parse(&files.references()[0]).unwrap(),
        &Platform::host(),
    )
    .unwrap()
}

/// Create options asking for the strategy list `list`.
pub fn with(list: &str) -> CreateOptions {
    CreateOptions {
        strategies: Strategies::parse(list).unwrap(),
        ..CreateOptions::default()
    }
}

/// [`with`], for a caller that mounts the rootfs itself (containerd): lamina mounts only
/// what only it can (a volatile overlay).
pub fn without_mount(list: &str) -> CreateOptions {
    CreateOptions {
        without_mount: true,
        mount_volatile_without_mount: true,
        ..with(list)
    }
}
