//! eStargz indexes: any TOC JSON, in the member a layer holds it in, is read and split into
//! files and chunks, or refused — never a panic — and every file it gives is sound: its
//! chunks run in order from 0 to its size, each bounded and in a member before the TOC.
//! Any 51 bytes as a footer give an offset inside the blob, or an error.

use std::io::Write;

use lamina_image::Digest;
use lamina_image::lazy::MAX_CHUNK_BYTES;
use lamina_image::lazy::estargz::{FOOTER_SIZE, read_toc, toc_offset};

/// The furthest the fuzzed TOC is taken to start.
const MAX_TOC_OFFSET: u64 = 1 << 40;

/// `data` as a TOC's JSON; returns whether it gave files.
pub fn estargz_index(data: &[u8]) -> bool {
    if data.len() as u64 >= FOOTER_SIZE {
        let blob_size = data.len() as u64 * 1024;
        if let Ok(offset) = toc_offset(&data[..FOOTER_SIZE as usize], blob_size) {
            assert!(
                offset < blob_size - FOOTER_SIZE,
                "a TOC offset past the blob"
            );
        }
    }
    let member = toc_member(data);
    let Ok(toc) = read_toc(&member, &Digest::of(data)) else {
        return false;
    };
    // The TOC is taken to start a little after the last member it names, as in a layer.
    let toc_offset = toc
        .entries
        .iter()
        .map(|e| e.offset)
        .max()
        .unwrap_or(0)
        .saturating_add(4096)
        .min(MAX_TOC_OFFSET);
    let Ok(files) = toc.files(toc_offset) else {
        return false;
    };
    assert_sound(&files, toc_offset);
    // The tree of the same index: refused or built, never a panic.
    let _ = toc.tree(toc_offset);
    true
}

/// A gzip member holding `json` as the tar entry `stargz.index.json`, then the tar's end.
fn toc_member(json: &[u8]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header
        .set_path(lamina_image::lazy::estargz::TOC_NAME)
        .expect("TOC name");
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append(&header, json).expect("TOC entry");
    let tar = tar.into_inner().expect("TOC tar");
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(&tar).expect("TOC member");
    gzip.finish().expect("TOC member")
}

/// `data` as a zstd:chunked manifest's JSON, compressed and located as a layer's
/// annotations would give it; returns whether it gave files. The same soundness as
/// [`estargz_index`] for every file.
pub fn zstd_chunked_manifest(data: &[u8]) -> bool {
    use lamina_image::lazy::zstd_chunked::{ManifestPosition, read_manifest};
    let Ok(compressed) = zstd::encode_all(data, 1) else {
        return false;
    };
    let manifest_offset = 1 << 30;
    let position = ManifestPosition {
        offset: manifest_offset,
        length: compressed.len() as u64,
        uncompressed: data.len() as u64,
    };
    let Ok(manifest) = read_manifest(&compressed, &position, &Digest::of(&compressed)) else {
        return false;
    };
    let Ok(files) = manifest.files(manifest_offset) else {
        return false;
    };
    assert_sound(&files, manifest_offset);
    let _ = manifest.tree(manifest_offset);
    true
}

/// Every file's chunks run in order from 0 to its size, each bounded, every member
/// before `index_offset`.
fn assert_sound(files: &[lamina_image::lazy::LazyFile], index_offset: u64) {
    for file in files {
        let mut at = 0;
        for chunk in &file.chunks {
            assert_eq!(
                chunk.file_offset, at,
                "`{}`: chunks out of order",
                file.name
            );
            assert!(chunk.size > 0 && chunk.size <= MAX_CHUNK_BYTES);
            assert!(chunk.inner_offset <= MAX_CHUNK_BYTES);
            assert!(chunk.member.0 < chunk.member.1 && chunk.member.1 <= index_offset);
            assert!(chunk.member.1 - chunk.member.0 <= MAX_CHUNK_BYTES);
            at += chunk.size;
        }
        assert_eq!(at, file.size, "`{}`: chunks do not cover it", file.name);
    }
}
