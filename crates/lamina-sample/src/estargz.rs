//! eStargz layers, written deterministically from an ordinary tar: each entry's headers in
//! a gzip member of their own, each regular file's bytes in members of at most
//! `chunk_size` bytes, then the TOC's member and the footer (see
//! `lamina_image::lazy::estargz`). The blob decompresses to the same tar with the TOC as its
//! last entry, so a full pull reads it as any gzip layer.

use std::io::{self, Read, Write};

use lamina_image::Digest;
use lamina_image::lazy::estargz::{TOC_NAME, Toc, TocEntry};

/// An eStargz layer: its blob, the digest its layer annotation gives the TOC, and its
/// diff ID (the digest of the tar the blob decompresses to).
#[derive(Debug, Clone)]
pub struct EstargzLayer {
    pub blob: Vec<u8>,
    pub toc_digest: Digest,
    pub diff_id: Digest,
    /// The TOC as written, for tests that change it.
    pub toc: Toc,
}

fn gzip(bytes: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes)?;
    encoder.finish()
}

/// The TOC as the tar that ends the layer (its entry and the tar's two closing blocks),
/// and the digest of its JSON.
fn toc_tar(toc: &Toc) -> io::Result<(Vec<u8>, Digest)> {
    let json = serde_json::to_vec(toc)?;
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_path(TOC_NAME)?;
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    builder.append(&header, &json[..])?;
    Ok((builder.into_inner()?, Digest::of(&json)))
}

/// Rewrites uncompressed `tar` (as [`crate::LayerBuilder`] makes it) as eStargz with
/// file chunks of at most `chunk_size` bytes.
pub fn estargz(tar: &[u8], chunk_size: u64) -> io::Result<EstargzLayer> {
    assert!(chunk_size > 0, "a chunk size");
    let mut blob = Vec::new();
    let mut uncompressed = Vec::new();
    let mut entries = Vec::new();
    let mut archive = tar::Archive::new(tar);
    // Where the previous entry's data (padded) ended: the next entry's headers, PAX and
    // long-name ones included, run from there to its data.
    let mut previous_end = 0usize;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let data_at = entry.raw_file_position() as usize;
        let size = entry.size();
        let padded = size.div_ceil(512) * 512;
        let headers = &tar[previous_end..data_at];
        previous_end = data_at + padded as usize;
        blob.extend(gzip(headers)?);
        uncompressed.extend_from_slice(headers);

        let header = entry.header().clone();
        let kind = index_kind(header.entry_type())?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let link_name = entry
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        let xattrs = xattrs_of(&mut entry)?;
        let base = TocEntry {
            name,
            kind: kind.into(),
            size,
            mod_time: humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(header.mtime()?),
            )
            .to_string(),
            link_name,
            mode: header.mode()?,
            uid: header.uid()? as u32,
            gid: header.gid()? as u32,
            // Blank in headers of entries that are no devices.
            dev_major: header.device_major().ok().flatten().unwrap_or(0) as u64,
            dev_minor: header.device_minor().ok().flatten().unwrap_or(0) as u64,
            xattrs,
            ..TocEntry::default()
        };
        if kind != "reg" || size == 0 {
            entries.push(base);
            uncompressed.extend_from_slice(&tar[data_at..data_at + padded as usize]);
            if padded > 0 {
                blob.extend(gzip(&tar[data_at..data_at + padded as usize])?);
            }
            continue;
        }
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        let mut first = true;
        let mut at = 0u64;
        while at < size {
            let len = chunk_size.min(size - at);
            let chunk = &data[at as usize..(at + len) as usize];
            let last = at + len == size;
            // The tar's padding after the file goes with its last chunk.
            let pad = if last { (padded - size) as usize } else { 0 };
            let mut member = chunk.to_vec();
            member.extend(std::iter::repeat_n(0u8, pad));
            let mut chunk_entry = if first {
                TocEntry {
                    digest: Digest::of(&data).to_string(),
                    ..base.clone()
                }
            } else {
                TocEntry {
                    name: base.name.clone(),
                    kind: "chunk".into(),
                    ..TocEntry::default()
                }
            };
            chunk_entry.offset = blob.len() as u64;
            chunk_entry.chunk_offset = at;
            // As eStargz's own writer does: a last chunk shorter than the others runs to
            // the file's end, its size left out.
            chunk_entry.chunk_size = if last && len < chunk_size { 0 } else { len };
            chunk_entry.chunk_digest = Digest::of(chunk).to_string();
            entries.push(chunk_entry);
            blob.extend(gzip(&member)?);
            uncompressed.extend_from_slice(&member);
            first = false;
            at += len;
        }
    }
    let toc = Toc {
        version: 1,
        entries,
    };
    let (toc_tar, toc_digest) = toc_tar(&toc)?;
    let toc_offset = blob.len() as u64;
    blob.extend(gzip(&toc_tar)?);
    uncompressed.extend_from_slice(&toc_tar);
    blob.extend(footer(toc_offset));
    Ok(EstargzLayer {
        blob,
        toc_digest,
        diff_id: Digest::of(&uncompressed),
        toc,
    })
}

impl EstargzLayer {
    /// The same layer with `toc` as its TOC (an index that lies about its tar, for
    /// tests): the members before the TOC kept, the TOC's member, the footer and the
    /// digests written anew.
    pub fn with_toc(&self, toc: Toc) -> io::Result<EstargzLayer> {
        use lamina_image::lazy::estargz::{FOOTER_SIZE, toc_offset};
        let old_footer = &self.blob[self.blob.len() - FOOTER_SIZE as usize..];
        let offset =
            toc_offset(old_footer, self.blob.len() as u64).map_err(io::Error::other)? as usize;
        let (toc_tar, toc_digest) = toc_tar(&toc)?;
        let mut blob = self.blob[..offset].to_vec();
        blob.extend(gzip(&toc_tar)?);
        blob.extend(footer(offset as u64));
        let mut uncompressed = Vec::new();
        flate2::read::MultiGzDecoder::new(&blob[..]).read_to_end(&mut uncompressed)?;
        Ok(EstargzLayer {
            diff_id: Digest::of(&uncompressed),
            toc_digest,
            blob,
            toc,
        })
    }

    /// The layer as an image stores it: a gzip layer annotated with its TOC's digest.
    /// `tar` is what it was written from.
    pub fn stored(&self, tar: &[u8]) -> crate::StoredLayer {
        crate::StoredLayer {
            blob: self.blob.clone(),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
            diff_id: self.diff_id.clone(),
            annotations: [(
                lamina_image::lazy::estargz::TOC_DIGEST_ANNOTATION.to_string(),
                self.toc_digest.to_string(),
            )]
            .into(),
            tar: tar.to_vec(),
        }
    }
}

/// An entry's extended attributes (its PAX `SCHILY.xattr.` records), values base64, as
/// both indexes give them.
pub(crate) fn xattrs_of<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> io::Result<std::collections::BTreeMap<String, String>> {
    let mut xattrs = std::collections::BTreeMap::new();
    if let Some(extensions) = entry.pax_extensions()? {
        for extension in extensions {
            let extension = extension?;
            if let Some(key) = extension
                .key()
                .map_err(io::Error::other)?
                .strip_prefix("SCHILY.xattr.")
            {
                xattrs.insert(key.to_string(), base64(extension.value_bytes()));
            }
        }
    }
    Ok(xattrs)
}

/// The word eStargz's TOC and zstd:chunked's manifest give an entry of this type.
pub(crate) fn index_kind(kind: tar::EntryType) -> io::Result<&'static str> {
    Ok(match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous => "reg",
        tar::EntryType::Directory => "dir",
        tar::EntryType::Symlink => "symlink",
        tar::EntryType::Link => "hardlink",
        tar::EntryType::Char => "char",
        tar::EntryType::Block => "block",
        tar::EntryType::Fifo => "fifo",
        other => {
            return Err(io::Error::other(format!(
                "entry type {other:?} in an indexed sample layer"
            )));
        }
    })
}

/// The 51-byte footer: an empty gzip member whose extra field `SG` says where the TOC's
/// member starts.
pub fn footer(toc_offset: u64) -> Vec<u8> {
    let mut out = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 255, 26, 0, b'S', b'G', 22, 0,
    ];
    out.extend(format!("{toc_offset:016x}STARGZ").as_bytes());
    // An empty, final stored block, then CRC32 and ISIZE of nothing.
    out.extend([1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    out
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
