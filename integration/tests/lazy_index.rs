//! Images with indexed layers in a real registry (Debian's docker-registry, pushed with
//! skopeo), eStargz and zstd:chunked: each index read with byte ranges and checked against
//! the image manifest's annotations, a file's chunks fetched by themselves and checked;
//! and each image pulled whole as any gzip or zstd layer, its rootfs what the tars say.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use lamina_image::Digest;
use lamina_image::lazy::chunk_bytes;
use lamina_image::lazy::estargz::{FOOTER_SIZE, TOC_DIGEST_ANNOTATION, read_toc, toc_offset};
use lamina_integration::lazy_image::{Format, big, push_image};
use lamina_integration::registry::Registry;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root};

/// Pushes the lazy test image in eStargz as `lazy/image:v1`.
fn push_lazy_image(registry: &Registry, dir: &Path) {
    push_image(registry, dir, Format::Estargz, "lazy/image:v1");
}

/// `file`'s bytes, each chunk fetched by itself from blob `digest` (`size` bytes) and
/// checked.
fn fetch(
    client: &lamina_registry::Client,
    digest: &str,
    size: u64,
    file: &lamina_image::lazy::LazyFile,
) -> Vec<u8> {
    let mut read = Vec::new();
    for chunk in &file.chunks {
        let (start, end) = chunk.member;
        let member = client.read_range(digest, size, start, end - start).unwrap();
        read.extend(chunk_bytes(&member, chunk).unwrap());
    }
    read
}

#[test]
fn an_estargz_index_is_read_by_ranges_and_a_file_fetched_chunk_by_chunk() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_lazy_image(&registry, fs.path());
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("lazy/image:v1")).unwrap();
    let layer = &manifest["layers"][1];
    let digest = layer["digest"].as_str().unwrap();
    let size = layer["size"].as_u64().unwrap();
    let annotation = layer["annotations"][TOC_DIGEST_ANNOTATION]
        .as_str()
        .unwrap();

    let client = registry.client("lazy/image:v1");
    let footer = client
        .read_range(digest, size, size - FOOTER_SIZE, FOOTER_SIZE)
        .unwrap();
    let offset = toc_offset(&footer, size).unwrap();
    let member = client
        .read_range(digest, size, offset, size - FOOTER_SIZE - offset)
        .unwrap();
    let toc = read_toc(&member, &Digest::parse(annotation).unwrap()).unwrap();
    let files = toc.files(offset).unwrap();
    let file = files.iter().find(|f| f.name == "data/big").unwrap();
    assert_eq!(file.chunks.len(), 5, "300 KiB in 64 KiB chunks");
    assert_eq!(fetch(&client, digest, size, file), big());
    // What was fetched: the index and that file's members, a part of the layer.
    let fetched: u64 = FOOTER_SIZE
        + (size - FOOTER_SIZE - offset)
        + file
            .chunks
            .iter()
            .map(|c| c.member.1 - c.member.0)
            .sum::<u64>();
    assert!(fetched <= size, "{fetched} of {size}");

    // A TOC the annotation does not name is refused.
    assert!(read_toc(&member, &Digest::of(b"another index")).is_err());
}

#[test]
fn a_zstd_chunked_manifest_is_read_by_range_and_a_file_fetched_chunk_by_chunk() {
    use lamina_image::lazy::zstd_chunked::{
        MANIFEST_CHECKSUM_ANNOTATION, MANIFEST_POSITION_ANNOTATION, ManifestPosition, read_manifest,
    };
    require_root();
    let fs = ScratchFs::ext4(256);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::ZstdChunked, "lazy/zstd:v1");
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("lazy/zstd:v1")).unwrap();
    let layer = &manifest["layers"][1];
    let digest = layer["digest"].as_str().unwrap();
    let size = layer["size"].as_u64().unwrap();
    let annotations = &layer["annotations"];
    let position = ManifestPosition::parse(
        annotations[MANIFEST_POSITION_ANNOTATION].as_str().unwrap(),
        size,
    )
    .unwrap();
    let checksum =
        Digest::parse(annotations[MANIFEST_CHECKSUM_ANNOTATION].as_str().unwrap()).unwrap();
    let client = registry.client("lazy/zstd:v1");
    let compressed = client
        .read_range(digest, size, position.offset, position.length)
        .unwrap();
    let index = read_manifest(&compressed, &position, &checksum).unwrap();
    let files = index.files(position.offset).unwrap();
    let file = files.iter().find(|f| f.name == "data/big").unwrap();
    assert_eq!(file.chunks.len(), 5, "300 KiB in 64 KiB chunks");
    assert_eq!(fetch(&client, digest, size, file), big());
}

#[test]
fn a_zstd_chunked_image_pulled_whole_is_an_ordinary_image() {
    pulled_whole(Format::ZstdChunked, "lazy/zstd:v1");
}

#[test]
fn an_estargz_image_pulled_whole_is_an_ordinary_image() {
    pulled_whole(Format::Estargz, "lazy/image:v1");
}

fn pulled_whole(format: Format, repo_tag: &str) {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), format, repo_tag);
    let lamina = Lamina::init(&fs.path().join("store"));
    let reference = registry.reference(repo_tag);
    let out = lamina.run(&[
        "--insecure-registry",
        &registry.host,
        "create",
        &reference,
        "whole",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let rootfs = lamina.rootfs("whole");
    assert_eq!(std::fs::read(rootfs.join("data/big")).unwrap(), big());
    assert!(!rootfs.join("etc/hosts").exists(), "the whiteout applies");
    // eStargz's TOC is an entry of the layer's tar: a whole pull unpacks it, as
    // containerd's applier does (a lazy view must then show it too, to be the same
    // layer); zstd:chunked keeps its manifest out of the tar.
    assert_eq!(
        rootfs.join("stargz.index.json").exists(),
        format == Format::Estargz
    );
    let booted = Bundle::new(&rootfs, false).run("whole", "cat /data/small");
    assert_eq!(booted.stdout, "small\n", "{booted:?}");
    lamina.delete_and_assert_gone("whole", "lazy_index");
}
