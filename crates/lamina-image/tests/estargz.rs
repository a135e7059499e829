//! eStargz's index read back from layers lamina-sample writes: the footer, the TOC checked
//! against its annotation digest, every file's chunks, each chunk's bytes; and each kind of
//! damage refused.

#![allow(clippy::unwrap_used)]

use std::io::Read;

use lamina_image::Digest;
use lamina_image::lazy::estargz::{FOOTER_SIZE, Toc, read_toc, toc_offset};
use lamina_image::lazy::{IndexError, chunk_bytes};
use lamina_sample::LayerBuilder;
use lamina_sample::estargz::{EstargzLayer, estargz, footer};

/// 10000 bytes, so three chunks of at most 4096.
fn big() -> Vec<u8> {
    (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

fn layer() -> (Vec<u8>, EstargzLayer) {
    let tar = LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|b| b.file("etc/small", 0o644, b"small\n"))
        .and_then(|b| b.file("etc/empty", 0o600, b""))
        .and_then(|b| b.file("big", 0o755, &big()))
        .and_then(|b| b.file_with_xattrs("x", 0o644, b"x", &[("user.k", b"v")]))
        .and_then(|b| b.symlink("link", "etc/small"))
        .and_then(|b| b.hardlink("hard", "big"))
        .and_then(|b| b.whiteout("gone"))
        .and_then(LayerBuilder::finish)
        .unwrap();
    let layer = estargz(&tar, 4096).unwrap();
    (tar, layer)
}

fn toc_of(layer: &EstargzLayer) -> (u64, Toc) {
    let blob = &layer.blob;
    let len = blob.len() as u64;
    let offset = toc_offset(&blob[(len - FOOTER_SIZE) as usize..], len).unwrap();
    let toc = read_toc(
        &blob[offset as usize..(len - FOOTER_SIZE) as usize],
        &layer.toc_digest,
    )
    .unwrap();
    (offset, toc)
}

#[test]
fn the_blob_is_the_tar_with_the_toc_as_its_last_entry() {
    let (tar, layer) = layer();
    let mut plain = Vec::new();
    flate2::read::MultiGzDecoder::new(&layer.blob[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(Digest::of(&plain), layer.diff_id);
    let names = |bytes: &[u8]| -> Vec<String> {
        tar::Archive::new(bytes)
            .entries()
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
            .collect()
    };
    let mut expected = names(&tar);
    expected.push("stargz.index.json".into());
    assert_eq!(names(&plain), expected);
}

#[test]
fn every_file_is_read_back_chunk_by_chunk() {
    let (_, layer) = layer();
    let (offset, toc) = toc_of(&layer);
    assert_eq!(toc, layer.toc);
    let files = toc.files(offset).unwrap();
    let big_file = files.iter().find(|f| f.name == "big").unwrap();
    assert_eq!(big_file.chunks.len(), 3);
    assert_eq!(big_file.digest, Digest::of(&big()));
    let mut read = Vec::new();
    for chunk in &big_file.chunks {
        let member = &layer.blob[chunk.member.0 as usize..chunk.member.1 as usize];
        read.extend(chunk_bytes(member, chunk).unwrap());
    }
    assert_eq!(read, big());
    let empty = files.iter().find(|f| f.name == "etc/empty").unwrap();
    assert!(empty.chunks.is_empty());
    assert!(
        files
            .iter()
            .any(|f| f.name == ".wh.gone" || f.name == "gone")
    );
}

#[test]
fn a_toc_other_than_its_annotation_says_is_refused() {
    let (_, layer) = layer();
    let blob = &layer.blob;
    let len = blob.len() as u64;
    let offset = toc_offset(&blob[(len - FOOTER_SIZE) as usize..], len).unwrap();
    let member = &blob[offset as usize..(len - FOOTER_SIZE) as usize];
    let err = read_toc(member, &Digest::of(b"another")).unwrap_err();
    assert!(
        matches!(err, IndexError::Index(ref why) if why.contains("annotation")),
        "{err}"
    );
}

#[test]
fn a_footer_that_is_not_estargz_or_points_past_the_blob_is_refused() {
    let (_, layer) = layer();
    let len = layer.blob.len() as u64;
    let mut bad = layer.blob[(len - FOOTER_SIZE) as usize..].to_vec();
    bad[33] = b'X';
    assert!(matches!(toc_offset(&bad, len), Err(IndexError::Footer(_))));
    assert!(matches!(
        toc_offset(&footer(len), len),
        Err(IndexError::Footer(_))
    ));
    assert!(matches!(
        toc_offset(&footer(0)[..50], len),
        Err(IndexError::Footer(_))
    ));
}

#[test]
fn a_chunk_whose_bytes_differ_from_its_digest_is_refused() {
    let (_, layer) = layer();
    let (offset, toc) = toc_of(&layer);
    let files = toc.files(offset).unwrap();
    let chunk = &files.iter().find(|f| f.name == "big").unwrap().chunks[1];
    let mut other = toc.clone();
    let tampered = other
        .entries
        .iter_mut()
        .find(|e| e.chunk_digest == chunk.digest.to_string())
        .unwrap();
    tampered.chunk_digest = Digest::of(b"not these bytes").to_string();
    let files = other.files(offset).unwrap();
    let chunk = &files.iter().find(|f| f.name == "big").unwrap().chunks[1];
    let member = &layer.blob[chunk.member.0 as usize..chunk.member.1 as usize];
    assert!(chunk_bytes(member, chunk).is_err());
}

#[test]
fn chunks_that_do_not_cover_their_file_or_lie_past_the_toc_are_refused() {
    let (_, layer) = layer();
    let (offset, toc) = toc_of(&layer);
    let gap = {
        let mut toc = toc.clone();
        let at = toc.entries.iter().position(|e| e.kind == "chunk").unwrap();
        toc.entries.remove(at);
        toc
    };
    assert!(gap.files(offset).is_err(), "a missing chunk");
    let past = {
        let mut toc = toc.clone();
        let entry = toc.entries.iter_mut().find(|e| e.kind == "chunk").unwrap();
        entry.offset = offset + 1;
        toc
    };
    assert!(past.files(offset).is_err(), "a member past the TOC");
    let twice = {
        let mut toc = toc.clone();
        let first = toc
            .entries
            .iter()
            .find(|e| e.name == "etc/small")
            .unwrap()
            .clone();
        toc.entries.push(first);
        toc
    };
    assert!(twice.files(offset).is_err(), "a file listed twice");
    let overlapping = {
        let mut toc = toc.clone();
        let first = toc.entries.iter().position(|e| e.name == "big").unwrap();
        toc.entries[first + 1].offset = toc.entries[first].offset;
        toc
    };
    assert!(
        overlapping.files(offset).is_err(),
        "two chunks in one place"
    );
}

/// An index whose JSON lists more entries than lamina keeps is refused while it is
/// parsed: a small member cannot make a gigabyte of entries in memory first.
#[test]
fn a_toc_listing_too_many_entries_is_refused() {
    use std::io::Write;
    let count = lamina_image::lazy::MAX_INDEX_ENTRIES + 1;
    let mut json = br#"{"version":1,"entries":["#.to_vec();
    for i in 0..count {
        if i > 0 {
            json.push(b',');
        }
        json.extend_from_slice(br#"{"name":"","type":""}"#);
    }
    json.extend_from_slice(b"]}");
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_path("stargz.index.json").unwrap();
    header.set_size(json.len() as u64);
    header.set_cksum();
    tar.append(&header, &json[..]).unwrap();
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(&tar.into_inner().unwrap()).unwrap();
    let member = gzip.finish().unwrap();
    let err = read_toc(&member, &Digest::of(&json)).unwrap_err();
    assert!(err.to_string().contains("entries"), "{err}");
}
