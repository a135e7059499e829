//! Setup shared by the fake-mounter tests: a store and the busybox sample image, with a
//! stand-in busybox binary (nothing runs it; the fake mounts nothing).

use std::fs;
use std::path::Path;

use lamina_image::{Image, ImageRef, Platform, resolve};
use lamina_mount::{CreateOptions, Strategies};
use lamina_sample::{busybox_image, write_all_formats};
use lamina_store::Store;

pub fn setup(tmp: &Path) -> (Store, Image) {
    let busybox = tmp.join("fake-busybox");
    fs::write(&busybox, b"#!/bin/true\n").unwrap();
    let files = write_all_formats(&busybox_image(&busybox).unwrap(), &tmp.join("image")).unwrap();
    let image = resolve(
        &ImageRef::parse(&files.references()[0]).unwrap(),
        &Platform::host(),
    )
    .unwrap();
    (Store::init(&tmp.join("store")).unwrap(), image)
}

/// Create options asking for the strategy list `list`.
pub fn with(list: &str) -> CreateOptions {
    CreateOptions {
        strategies: Strategies::parse(list).unwrap(),
        ..CreateOptions::default()
    }
}
