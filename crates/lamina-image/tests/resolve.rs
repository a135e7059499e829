//! Resolves images written by lamina-sample in every source format.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use lamina_image::{Compression, ImageRef, Platform, resolve};
use lamina_sample::{
    BuiltImage, Layer, LayerBuilder, build_image, busybox_image, write_all_formats,
    write_oci_layout,
};

fn sample(dir: &Path) -> BuiltImage {
    let busybox = dir.join("fake-busybox");
    fs::write(&busybox, b"#!/bin/true\n").unwrap();
    busybox_image(&busybox).unwrap()
}

#[test]
fn every_source_form_resolves_to_the_same_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let image = sample(tmp.path());
    let files = write_all_formats(&image, &tmp.path().join("out")).unwrap();
    let [oci, oci_archive, docker, rootfs] = files.references();

    for reference in [&oci, &oci_archive, &docker] {
        let resolved = resolve(&ImageRef::parse(reference).unwrap(), &Platform::host()).unwrap();
        assert_eq!(
            resolved.diff_ids(),
            image.config.rootfs.diff_ids,
            "{reference}"
        );
        assert_eq!(resolved.env(), lamina_sample::SAMPLE_ENV, "{reference}");
        assert_eq!(resolved.chain_ids().len(), 2);
    }
    let oci = resolve(&ImageRef::parse(&oci).unwrap(), &Platform::host()).unwrap();
    assert_eq!(oci.layers[0].compression, Some(Compression::Gzip));
    assert_eq!(oci.layers[1].compression, Some(Compression::Zstd));

    let rootfs = resolve(&ImageRef::parse(&rootfs).unwrap(), &Platform::host()).unwrap();
    assert_eq!(rootfs.layers.len(), 1);
    assert_eq!(rootfs.diff_ids()[0], image.config.rootfs.diff_ids[0]);
}

#[test]
fn unknown_ref_lists_what_is_there() {
    let tmp = tempfile::tempdir().unwrap();
    let files = write_all_formats(&sample(tmp.path()), &tmp.path().join("out")).unwrap();
    let reference = format!("oci://{}:nope", files.oci_layout.display());
    let err = resolve(&ImageRef::parse(&reference).unwrap(), &Platform::host())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no image named `nope`") && err.contains("latest"),
        "{err}"
    );
    let reference = format!(
        "docker-archive://{}:other:tag",
        files.docker_archive.display()
    );
    let err = resolve(&ImageRef::parse(&reference).unwrap(), &Platform::host())
        .unwrap_err()
        .to_string();
    assert!(err.contains("lamina/sample:latest"), "{err}");
}

#[test]
fn multi_platform_layout_picks_the_host_or_the_asked_platform() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = |name: &str| Layer {
        tar: LayerBuilder::new()
            .file(name, 0o644, b"x")
            .unwrap()
            .finish()
            .unwrap(),
        compression: Compression::Gzip,
    };
    let host = Platform::host();
    let other = Platform {
        os: "linux".into(),
        architecture: "riscv64".into(),
        variant: None,
    };
    let a = build_image(&[layer("host")], &[], &host).unwrap();
    let b = build_image(&[layer("other")], &[], &other).unwrap();
    let dir = tmp.path().join("multi");
    write_oci_layout(
        &dir,
        &[&a, &b],
        &[(b.manifest.clone(), None), (a.manifest.clone(), None)],
    )
    .unwrap();
    let reference = ImageRef::parse(&format!("oci://{}", dir.display())).unwrap();

    assert_eq!(
        resolve(&reference, &host).unwrap().config_digest,
        a.config_digest
    );
    assert_eq!(
        resolve(&reference, &other).unwrap().config_digest,
        b.config_digest
    );
    let err = resolve(&reference, &Platform::parse("linux/s390x").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no image for platform linux/s390x") && err.contains("riscv64"),
        "{err}"
    );
}

#[test]
fn tampered_and_missing_blobs_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let image = sample(tmp.path());
    let files = write_all_formats(&image, &tmp.path().join("out")).unwrap();
    let blob = files
        .oci_layout
        .join("blobs/sha256")
        .join(image.manifest.digest.hex());
    let mut manifest = fs::read(&blob).unwrap();
    let pos = manifest.iter().position(|&b| b == b'2').unwrap();
    manifest[pos] = b'3';
    fs::write(&blob, &manifest).unwrap();
    let reference = ImageRef::parse(&format!("oci://{}", files.oci_layout.display())).unwrap();
    let err = resolve(&reference, &Platform::host())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("digest mismatch") && err.contains(&image.manifest.digest.to_string()),
        "{err}"
    );

    let files = write_all_formats(&image, &tmp.path().join("out2")).unwrap();
    let top = &image.layers[1].0;
    fs::remove_file(files.oci_layout.join("blobs/sha256").join(top.hex())).unwrap();
    let reference = ImageRef::parse(&format!("oci://{}", files.oci_layout.display())).unwrap();
    let err = resolve(&reference, &Platform::host())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&top.to_string()) && err.contains("missing"),
        "{err}"
    );

    let err = resolve(
        &ImageRef::parse("/does/not/exist.tar").unwrap(),
        &Platform::host(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("/does/not/exist.tar") && err.contains("does not exist"),
        "{err}"
    );
}
