//! zstd:chunked's manifest read back from layers lamina-sample writes: located and checked
//! by its annotations, every file's chunks and their bytes; each kind of damage refused.

#![allow(clippy::unwrap_used)]

use lamina_image::Digest;
use lamina_image::lazy::chunk_bytes;
use lamina_image::lazy::zstd_chunked::{
    MANIFEST_CHECKSUM_ANNOTATION, MANIFEST_POSITION_ANNOTATION, Manifest, ManifestPosition,
    read_manifest,
};
use lamina_sample::LayerBuilder;
use lamina_sample::zstd_chunked::{ZstdChunkedLayer, zstd_chunked};

fn big() -> Vec<u8> {
    (0..10_000u32).map(|i| (i * 13 % 241) as u8).collect()
}

fn layer() -> (Vec<u8>, ZstdChunkedLayer) {
    let tar = LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|b| b.file("etc/small", 0o644, b"small\n"))
        .and_then(|b| b.file("etc/empty", 0o600, b""))
        .and_then(|b| b.file("big", 0o755, &big()))
        .and_then(|b| b.symlink("link", "etc/small"))
        .and_then(|b| b.whiteout("gone"))
        .and_then(LayerBuilder::finish)
        .unwrap();
    let layer = zstd_chunked(&tar, 4096).unwrap();
    (tar, layer)
}

fn manifest_of(layer: &ZstdChunkedLayer) -> (ManifestPosition, Manifest) {
    let position = ManifestPosition::parse(
        &layer.annotations[MANIFEST_POSITION_ANNOTATION],
        layer.blob.len() as u64,
    )
    .unwrap();
    let compressed =
        &layer.blob[position.offset as usize..(position.offset + position.length) as usize];
    let checksum = Digest::parse(&layer.annotations[MANIFEST_CHECKSUM_ANNOTATION]).unwrap();
    (
        position,
        read_manifest(compressed, &position, &checksum).unwrap(),
    )
}

#[test]
fn the_blob_decompresses_to_the_tar_itself() {
    let (tar, layer) = layer();
    assert_eq!(zstd::decode_all(&layer.blob[..]).unwrap(), tar);
    assert_eq!(layer.diff_id, Digest::of(&tar));
}

#[test]
fn every_file_is_read_back_chunk_by_chunk() {
    let (_, layer) = layer();
    let (position, manifest) = manifest_of(&layer);
    let files = manifest.files(position.offset).unwrap();
    let file = files.iter().find(|f| f.name == "big").unwrap();
    assert_eq!(file.chunks.len(), 3);
    let mut read = Vec::new();
    for chunk in &file.chunks {
        let member = &layer.blob[chunk.member.0 as usize..chunk.member.1 as usize];
        read.extend(chunk_bytes(member, chunk).unwrap());
    }
    assert_eq!(read, big());
    let small = files.iter().find(|f| f.name == "etc/small").unwrap();
    assert_eq!(small.chunks.len(), 1);
    let member = &layer.blob[small.chunks[0].member.0 as usize..small.chunks[0].member.1 as usize];
    assert_eq!(chunk_bytes(member, &small.chunks[0]).unwrap(), b"small\n");
}

#[test]
fn a_manifest_other_than_its_annotations_say_is_refused() {
    let (_, layer) = layer();
    let size = layer.blob.len() as u64;
    let position =
        ManifestPosition::parse(&layer.annotations[MANIFEST_POSITION_ANNOTATION], size).unwrap();
    let compressed =
        &layer.blob[position.offset as usize..(position.offset + position.length) as usize];
    assert!(read_manifest(compressed, &position, &Digest::of(b"another")).is_err());
    for bad in [
        "1:2:3",
        "0:10:10:2",
        &format!("{size}:1:1:1"),
        "0:0:0:1",
        "a:b:c:d",
        "18446744073709551615:2:2:1",
    ] {
        assert!(ManifestPosition::parse(bad, size).is_err(), "{bad}");
    }
    let short = ManifestPosition {
        uncompressed: position.uncompressed - 1,
        ..position
    };
    let checksum = Digest::parse(&layer.annotations[MANIFEST_CHECKSUM_ANNOTATION]).unwrap();
    assert!(
        read_manifest(compressed, &short, &checksum).is_err(),
        "a lying length"
    );
}

#[test]
fn chunks_out_of_order_or_past_the_manifest_are_refused() {
    let (_, layer) = layer();
    let (position, manifest) = manifest_of(&layer);
    let mut swapped = manifest.clone();
    let chunks: Vec<usize> = swapped
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == "chunk")
        .map(|(i, _)| i)
        .collect();
    let (a, b) = (chunks[0], chunks[1]);
    let offset = swapped.entries[a].offset;
    swapped.entries[a].offset = swapped.entries[b].offset;
    swapped.entries[b].offset = offset;
    assert!(
        swapped.files(position.offset).is_err(),
        "members out of order"
    );
    let mut past = manifest.clone();
    let entry = past.entries.iter_mut().find(|e| e.name == "big").unwrap();
    entry.end_offset = position.offset + 100;
    assert!(
        past.files(position.offset).is_err(),
        "data past the manifest"
    );
    let mut zeros = manifest.clone();
    zeros
        .entries
        .iter_mut()
        .find(|e| e.kind == "chunk")
        .unwrap()
        .chunk_type = "holes".into();
    assert!(
        zeros.files(position.offset).is_err(),
        "an unknown chunk type"
    );
}
