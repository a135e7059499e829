//! zstd:chunked layers, written deterministically from an ordinary tar: each entry's
//! headers (with the previous file's padding) in a zstd frame of their own, each regular
//! file's bytes in frames of at most `chunk_size` bytes, the tar's end in a last frame,
//! then the manifest (zstd JSON) and the footer in skippable frames (see
//! `lamina_image::lazy::zstd_chunked`). No tar-split frame: lamina does not read one. The
//! blob decompresses to the tar itself, so a full pull reads it as any zstd layer.

use std::io;

use lamina_image::Digest;
use lamina_image::lazy::zstd_chunked::{
    MANIFEST_CHECKSUM_ANNOTATION, MANIFEST_POSITION_ANNOTATION,
};

/// A zstd:chunked layer: its blob, the annotations that locate and vouch for its
/// manifest, its diff ID, and the manifest's JSON (for tests that change it).
#[derive(Debug, Clone)]
pub struct ZstdChunkedLayer {
    pub blob: Vec<u8>,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub diff_id: Digest,
    pub manifest: serde_json::Value,
}

fn frame(bytes: &[u8]) -> io::Result<Vec<u8>> {
    zstd::encode_all(bytes, 3)
}

/// A skippable frame (magic 0x184D2A50) holding `data`.
fn skippable(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x50, 0x2a, 0x4d, 0x18];
    out.extend((data.len() as u32).to_le_bytes());
    out.extend(data);
    out
}

/// Rewrites uncompressed `tar` as zstd:chunked with file chunks of at most `chunk_size`.
pub fn zstd_chunked(tar: &[u8], chunk_size: u64) -> io::Result<ZstdChunkedLayer> {
    assert!(chunk_size > 0, "a chunk size");
    let mut blob = Vec::new();
    let mut entries = Vec::new();
    // Where the previous file's data ended (unpadded): its padding goes with the next
    // headers, as containers/storage writes it.
    let mut previous_end = 0usize;
    for entry in tar::Archive::new(tar).entries()? {
        let mut entry = entry?;
        let data_at = entry.raw_file_position() as usize;
        let size = entry.size();
        blob.extend(frame(&tar[previous_end..data_at])?);
        previous_end = data_at + size as usize;
        let xattrs = crate::estargz::xattrs_of(&mut entry)?;
        let header = entry.header();
        let kind = crate::estargz::index_kind(header.entry_type())?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let mut main = serde_json::json!({
            "type": kind,
            "name": name,
            "mode": header.mode()?,
            "uid": header.uid()?,
            "gid": header.gid()?,
        });
        if let Some(link) = entry.link_name_bytes() {
            main["linkName"] = String::from_utf8_lossy(&link).into_owned().into();
        }
        if !xattrs.is_empty() {
            main["xattrs"] = serde_json::json!(xattrs);
        }
        if kind != "reg" || size == 0 {
            entries.push(main);
            continue;
        }
        let data = &tar[data_at..data_at + size as usize];
        main["size"] = size.into();
        main["digest"] = Digest::of(data).to_string().into();
        main["offset"] = blob.len().into();
        let mut chunks = Vec::new();
        let mut at = 0u64;
        while at < size {
            let len = chunk_size.min(size - at);
            let bytes = &data[at as usize..(at + len) as usize];
            chunks.push((at, len, blob.len(), Digest::of(bytes)));
            blob.extend(frame(bytes)?);
            at += len;
        }
        main["endOffset"] = blob.len().into();
        if chunks.len() > 1 {
            for (i, (chunk_offset, len, offset, digest)) in chunks.into_iter().enumerate() {
                let mut chunk = if i == 0 {
                    main.clone()
                } else {
                    serde_json::json!({ "type": "chunk", "name": name })
                };
                chunk["chunkOffset"] = chunk_offset.into();
                chunk["chunkSize"] = len.into();
                chunk["chunkDigest"] = digest.to_string().into();
                chunk["offset"] = offset.into();
                entries.push(chunk);
            }
        } else {
            entries.push(main);
        }
    }
    blob.extend(frame(&tar[previous_end..])?);
    let manifest = serde_json::json!({ "version": 1, "entries": entries });
    let json = serde_json::to_vec(&manifest)?;
    let compressed = frame(&json)?;
    let offset = blob.len() + 8;
    blob.extend(skippable(&compressed));
    let mut footer = Vec::new();
    for n in [
        offset as u64,
        compressed.len() as u64,
        json.len() as u64,
        1,
        0,
        0,
        0,
    ] {
        footer.extend(n.to_le_bytes());
    }
    footer.extend(b"GNUlInUx");
    blob.extend(skippable(&footer));
    let annotations = [
        (
            MANIFEST_CHECKSUM_ANNOTATION.to_string(),
            Digest::of(&compressed).to_string(),
        ),
        (
            MANIFEST_POSITION_ANNOTATION.to_string(),
            format!("{offset}:{}:{}:1", compressed.len(), json.len()),
        ),
    ]
    .into();
    Ok(ZstdChunkedLayer {
        blob,
        annotations,
        diff_id: Digest::of(tar),
        manifest,
    })
}

impl ZstdChunkedLayer {
    /// The layer as an image stores it: a zstd layer with its manifest's annotations.
    /// `tar` is what it was written from.
    pub fn stored(&self, tar: &[u8]) -> crate::StoredLayer {
        crate::StoredLayer {
            blob: self.blob.clone(),
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd",
            diff_id: self.diff_id.clone(),
            annotations: self.annotations.clone(),
            tar: tar.to_vec(),
        }
    }
}
