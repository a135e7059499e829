//! zstd:chunked: a zstd layer whose frames split at file-chunk boundaries, with an index
//! (the manifest, zstd-compressed JSON) in a skippable frame near its end. Two layer
//! annotations locate and vouch for it: `manifest-position` (`OFFSET:LENGTH:UNCOMPRESSED:1`,
//! the compressed manifest's bytes in the blob) and `manifest-checksum` (the digest of
//! those compressed bytes). A regular file's data is the frames from its entry's `offset`
//! to its `endOffset`; a file cut into chunks lists a `chunk` entry after it for each
//! further chunk, each starting at its `offset` and ending where the next one starts (the
//! last at the file's `endOffset`). Skippable frames are ignored by any zstd decoder, so a
//! full pull reads the blob as any zstd layer.

use std::collections::BTreeMap;
use std::io::Read;

use serde::Deserialize;

use crate::Digest;
use crate::lazy::{
    Chunk, Codec, IndexError, LazyFile, MAX_INDEX_BYTES, check_chunks, index_error, parse_digest,
};

/// The annotation giving the digest of the compressed manifest.
pub const MANIFEST_CHECKSUM_ANNOTATION: &str =
    "io.github.containers.zstd-chunked.manifest-checksum";
/// The annotation locating the compressed manifest: `OFFSET:LENGTH:UNCOMPRESSED:TYPE`.
pub const MANIFEST_POSITION_ANNOTATION: &str =
    "io.github.containers.zstd-chunked.manifest-position";

fn manifest_error(why: impl Into<String>) -> IndexError {
    index_error(format!("zstd:chunked manifest: {}", why.into()))
}

/// Where the compressed manifest is in the blob, and how large it is uncompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestPosition {
    pub offset: u64,
    pub length: u64,
    pub uncompressed: u64,
}

impl ManifestPosition {
    /// Parses the `manifest-position` annotation of a blob `blob_size` long: within the
    /// blob, of type 1 (the only one), both lengths bounded.
    pub fn parse(annotation: &str, blob_size: u64) -> Result<Self, IndexError> {
        let numbers: Vec<u64> = annotation
            .split(':')
            .map(|n| n.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| manifest_error(format!("position `{annotation}` is not four numbers")))?;
        let [offset, length, uncompressed, kind] = numbers[..] else {
            return Err(manifest_error(format!(
                "position `{annotation}` is not four numbers"
            )));
        };
        if kind != 1 {
            return Err(manifest_error(format!("type {kind} (lamina reads 1)")));
        }
        if length == 0 || offset.checked_add(length).is_none_or(|end| end > blob_size) {
            return Err(manifest_error(format!(
                "position `{annotation}` is not within the blob's {blob_size} bytes"
            )));
        }
        if length > MAX_INDEX_BYTES || uncompressed > MAX_INDEX_BYTES {
            return Err(manifest_error("larger than lamina reads"));
        }
        Ok(ManifestPosition {
            offset,
            length,
            uncompressed,
        })
    }
}

/// One manifest entry (containers/storage's field names; what lamina uses of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub link_name: String,
    #[serde(default)]
    pub mode: u32,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    /// RFC 3339.
    #[serde(default)]
    pub modtime: String,
    #[serde(default)]
    pub dev_major: u64,
    #[serde(default)]
    pub dev_minor: u64,
    /// Values base64.
    #[serde(default)]
    pub xattrs: BTreeMap<String, String>,
    #[serde(default)]
    pub digest: String,
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub end_offset: u64,
    #[serde(default)]
    pub chunk_size: u64,
    #[serde(default)]
    pub chunk_offset: u64,
    #[serde(default)]
    pub chunk_digest: String,
    #[serde(default)]
    pub chunk_type: String,
}

impl crate::lazy::IndexEntry for ManifestEntry {
    fn xattr_count(&self) -> usize {
        self.xattrs.len()
    }
}

/// The manifest document.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Manifest {
    pub version: u32,
    #[serde(deserialize_with = "crate::lazy::bounded_entries")]
    pub entries: Vec<ManifestEntry>,
}

/// The manifest from its compressed bytes (`compressed`, the blob's bytes at `position`),
/// checked against `checksum` (the `manifest-checksum` annotation) before it is
/// decompressed, and against the uncompressed length `position` gives.
pub fn read_manifest(
    compressed: &[u8],
    position: &ManifestPosition,
    checksum: &Digest,
) -> Result<Manifest, IndexError> {
    if compressed.len() as u64 != position.length {
        return Err(manifest_error(
            "its bytes are not the length its position gives",
        ));
    }
    let digest = Digest::of(compressed);
    if digest != *checksum {
        return Err(manifest_error(format!(
            "its digest is {digest}, the layer's annotation says {checksum}"
        )));
    }
    let mut json = Vec::new();
    zstd::stream::read::Decoder::new(compressed)
        .and_then(|decoder| {
            decoder
                .take(position.uncompressed + 1)
                .read_to_end(&mut json)
        })
        .map_err(|e| manifest_error(format!("does not decompress: {e}")))?;
    if json.len() as u64 != position.uncompressed {
        return Err(manifest_error(format!(
            "{} bytes uncompressed, its position says {}",
            json.len(),
            position.uncompressed
        )));
    }
    let manifest: Manifest =
        serde_json::from_slice(&json).map_err(|e| manifest_error(e.to_string()))?;
    if manifest.version != 1 {
        return Err(manifest_error(format!(
            "version {} (lamina reads 1)",
            manifest.version
        )));
    }
    Ok(manifest)
}

impl Manifest {
    /// The regular files it lists with their chunks, each checked: in order from 0 to the
    /// file's size, every member before the manifest (`manifest_offset`) and bounded; a
    /// file listed twice, or a chunk of no file, refuses the manifest.
    pub fn files(&self, manifest_offset: u64) -> Result<Vec<LazyFile>, IndexError> {
        let mut files: Vec<(LazyFile, u64)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for entry in &self.entries {
            match entry.kind.as_str() {
                "reg" => {
                    if !seen.insert(entry.name.clone()) {
                        return Err(manifest_error(format!("`{}` is listed twice", entry.name)));
                    }
                    let digest = if entry.size == 0 {
                        Digest::of(b"")
                    } else {
                        parse_digest(&entry.name, &entry.digest)?
                    };
                    let mut file = LazyFile {
                        name: entry.name.clone(),
                        size: entry.size,
                        digest,
                        chunks: Vec::new(),
                    };
                    if entry.size > 0 {
                        if entry.end_offset <= entry.offset || entry.end_offset > manifest_offset {
                            return Err(manifest_error(format!(
                                "`{}`: its data at {}..{} is not before the manifest",
                                entry.name, entry.offset, entry.end_offset
                            )));
                        }
                        // A file in one chunk lists no chunk fields: its data is the chunk.
                        let (size, chunk_digest) = if entry.chunk_size == 0 {
                            (entry.size, file.digest.clone())
                        } else {
                            (
                                entry.chunk_size,
                                parse_digest(&entry.name, &entry.chunk_digest)?,
                            )
                        };
                        file.chunks.push(chunk(entry, size, chunk_digest)?);
                    }
                    files.push((file, entry.end_offset));
                }
                "chunk" => {
                    let Some((file, _)) = files.last_mut().filter(|(f, _)| f.name == entry.name)
                    else {
                        return Err(manifest_error(format!(
                            "a chunk of `{}` follows no entry of that file",
                            entry.name
                        )));
                    };
                    let digest = parse_digest(&entry.name, &entry.chunk_digest)?;
                    file.chunks.push(chunk(entry, entry.chunk_size, digest)?);
                }
                _ => {}
            }
        }
        // Chunks lie in the blob in the manifest's order, each in frames of its own.
        let mut last = None;
        for chunk in files.iter().flat_map(|(f, _)| &f.chunks) {
            if last.is_some_and(|start| chunk.member.0 <= start) {
                return Err(manifest_error(format!(
                    "a chunk at {} is not after the chunk before it",
                    chunk.member.0
                )));
            }
            last = Some(chunk.member.0);
        }
        files
            .into_iter()
            .map(|(mut file, end_offset)| {
                // Each chunk's frames end where the next one's start, the last at the
                // file's end offset.
                let ends: Vec<u64> = file
                    .chunks
                    .iter()
                    .skip(1)
                    .map(|c| c.member.0)
                    .chain(std::iter::once(end_offset))
                    .collect();
                for (chunk, end) in file.chunks.iter_mut().zip(ends) {
                    chunk.member.1 = end;
                }
                check_chunks(&file)?;
                Ok(file)
            })
            .collect::<Result<Vec<_>, IndexError>>()
            .and_then(|files| {
                // A file's frames end before the next file's start: one read never
                // fetches another file's bytes.
                let chunks: Vec<&Chunk> = files.iter().flat_map(|f| &f.chunks).collect();
                match chunks
                    .windows(2)
                    .find(|pair| pair[0].member.1 > pair[1].member.0)
                {
                    Some(pair) => Err(manifest_error(format!(
                        "a chunk's frames end at {}, past the next chunk's start at {}",
                        pair[0].member.1, pair[1].member.0
                    ))),
                    None => Ok(files),
                }
            })
    }
}

fn chunk(entry: &ManifestEntry, size: u64, digest: Digest) -> Result<Chunk, IndexError> {
    let zeros = match entry.chunk_type.as_str() {
        "" => false,
        "zeros" => true,
        other => {
            return Err(manifest_error(format!(
                "`{}`: chunk type `{other}`",
                entry.name
            )));
        }
    };
    Ok(Chunk {
        member: (entry.offset, entry.offset),
        codec: Codec::Zstd,
        zeros,
        inner_offset: 0,
        file_offset: entry.chunk_offset,
        size,
        digest,
    })
}

impl Manifest {
    /// The changes the layer makes, with its files' chunks (see [`crate::lazy::tree`]).
    pub fn tree(&self, manifest_offset: u64) -> Result<crate::lazy::tree::LayerTree, IndexError> {
        let files = self.files(manifest_offset)?;
        let entries = self.entries.iter().map(crate::lazy::tree::RawEntry::from);
        crate::lazy::tree::build(entries, files)
    }
}

impl<'a> From<&'a ManifestEntry> for crate::lazy::tree::RawEntry<'a> {
    fn from(e: &'a ManifestEntry) -> Self {
        crate::lazy::tree::RawEntry {
            name: &e.name,
            kind: &e.kind,
            link_name: &e.link_name,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            dev: (e.dev_major, e.dev_minor),
            mtime: &e.modtime,
            xattrs: &e.xattrs,
        }
    }
}
