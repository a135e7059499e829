//! eStargz: a gzip layer whose members split at file-chunk boundaries, with an index (the
//! TOC, `stargz.index.json`) in its last member before a fixed-size footer that locates
//! it. A lazy pull reads the footer and the TOC with two ranges, checks the TOC against
//! the digest the manifest's layer annotation gives, and from then on can fetch any
//! file's chunk by itself and check it against the TOC's digest for it. The whole blob is
//! still an ordinary gzip tar (the TOC is its last entry), so a full pull reads it as any
//! other layer.
//!
//! Everything read here comes from a registry: the footer's offset, the TOC's size and
//! every entry are bounded and checked before use, and a TOC that fails a check is refused
//! whole (the caller pulls the layer whole instead).

use std::collections::BTreeMap;
use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::Digest;
use crate::lazy::{
    Chunk, Codec, IndexError, LazyFile, MAX_CHUNK_BYTES, MAX_INDEX_BYTES, check_chunks,
    index_error, parse_digest,
};

/// The layer annotation giving the digest of the uncompressed TOC JSON.
pub const TOC_DIGEST_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The TOC's name in the layer's tar.
pub const TOC_NAME: &str = "stargz.index.json";
/// The footer's length: an empty gzip member whose extra field holds the TOC's offset.
pub const FOOTER_SIZE: u64 = 51;
/// The entry after the files an eStargz producer saw read at start, which come first
/// in the blob: what is before it is worth fetching before a container asks.
pub const PREFETCH_LANDMARK: &str = ".prefetch.landmark";

/// Where the prefetch region of an eStargz layer whose regular files are `files` ends:
/// the start of its landmark's member, if it has a landmark (with data: the format's is
/// one byte). Bytes past it are not prefetched.
pub fn prefetch_end(files: &[super::LazyFile]) -> Option<u64> {
    files
        .iter()
        .find(|f| f.name.trim_start_matches("./").trim_start_matches('/') == PREFETCH_LANDMARK)
        .and_then(|f| f.chunks.first())
        .filter(|c| !c.zeros)
        .map(|c| c.member.0)
}
fn toc_error(why: impl Into<String>) -> IndexError {
    index_error(format!("eStargz TOC: {}", why.into()))
}

/// The offset of the TOC's gzip member, from the blob's last [`FOOTER_SIZE`] bytes: a
/// gzip header with an extra field `SG` holding 16 hex digits and `STARGZ`.
pub fn toc_offset(footer: &[u8], blob_size: u64) -> Result<u64, IndexError> {
    let bad = |why: &str| Err(IndexError::Footer(why.into()));
    if footer.len() as u64 != FOOTER_SIZE {
        return bad("not 51 bytes");
    }
    // ID1 ID2 CM FLG(FEXTRA) MTIME(4) XFL OS XLEN(2) SI1 SI2 LEN(2) DATA(22)
    if footer[..4] != [0x1f, 0x8b, 8, 4] || footer[10..12] != [26, 0] {
        return bad("not a gzip header with one extra field");
    }
    if footer[12..16] != [b'S', b'G', 22, 0] || &footer[32..38] != b"STARGZ" {
        return bad("its extra field is not eStargz's");
    }
    let hex = std::str::from_utf8(&footer[16..32])
        .map_err(|_| IndexError::Footer("offset is not hex".into()))?;
    let offset =
        u64::from_str_radix(hex, 16).map_err(|_| IndexError::Footer("offset is not hex".into()))?;
    if offset >= blob_size.saturating_sub(FOOTER_SIZE) {
        return bad("its TOC offset is past the blob");
    }
    if blob_size - FOOTER_SIZE - offset > MAX_INDEX_BYTES {
        return bad("its TOC is larger than lamina reads");
    }
    Ok(offset)
}

/// One TOC entry, as eStargz writes it (Go's field names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TocEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// RFC 3339 (Go's `modtime`, all lower case).
    #[serde(default, rename = "modtime", skip_serializing_if = "String::is_empty")]
    pub mod_time: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub link_name: String,
    #[serde(default)]
    pub mode: u32,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_name: String,
    /// For a regular file or chunk: where the gzip member holding its bytes starts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dev_major: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dev_minor: u64,
    /// Values base64, as Go's encoding/json writes `[]byte`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
    /// The whole file's digest, on its first entry.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunk_offset: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunk_size: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub chunk_digest: String,
    /// Where in its member's decompressed bytes the chunk starts (0 when it starts it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inner_offset: u64,
}

impl crate::lazy::IndexEntry for TocEntry {
    fn xattr_count(&self) -> usize {
        self.xattrs.len()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The TOC document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toc {
    pub version: u32,
    #[serde(deserialize_with = "crate::lazy::bounded_entries")]
    pub entries: Vec<TocEntry>,
}

/// The TOC's own tar entry as a whole pull unpacks it: [`TOC_NAME`] at the layer's root,
/// with its header's mode, owners and time, and its bytes (the TOC's JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TocFile {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub json: Vec<u8>,
}

/// The TOC's entry from `member`: the blob's bytes from the TOC's offset to the footer
/// (one gzip member holding the TOC's tar entry and the tar's end). Not checked against
/// any digest: [`read_toc`] does that.
pub fn toc_file(member: &[u8]) -> Result<TocFile, IndexError> {
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(member)
        .take(MAX_INDEX_BYTES + 2048)
        .read_to_end(&mut tar_bytes)
        .map_err(|e| toc_error(format!("not gzip: {e}")))?;
    let mut archive = tar::Archive::new(&tar_bytes[..]);
    let mut entries = archive
        .entries()
        .map_err(|e| toc_error(format!("not a tar: {e}")))?;
    let mut entry = entries
        .next()
        .ok_or_else(|| toc_error("empty"))?
        .map_err(|e| toc_error(format!("not a tar: {e}")))?;
    let name = entry.path_bytes().into_owned();
    if name != TOC_NAME.as_bytes() {
        return Err(toc_error(format!(
            "its entry is `{}`, not {TOC_NAME}",
            String::from_utf8_lossy(&name)
        )));
    }
    if entry.header().entry_type() != tar::EntryType::Regular {
        return Err(toc_error("its entry is not a regular file"));
    }
    if entry.size() > MAX_INDEX_BYTES {
        return Err(toc_error("larger than lamina reads"));
    }
    // A writer may leave numeric fields blank (Go's writes them; a blank one is 0), and
    // the TOC's owner past 32 bits is refused as the tar path refuses it.
    let header = entry.header();
    let mode = header.mode().unwrap_or(0o644) & 0o7777;
    let uid = u32::try_from(header.uid().unwrap_or(0))
        .map_err(|_| toc_error("its entry's uid is past 32 bits"))?;
    let gid = u32::try_from(header.gid().unwrap_or(0))
        .map_err(|_| toc_error("its entry's gid is past 32 bits"))?;
    let mtime = i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(0);
    let mut json = Vec::new();
    entry
        .read_to_end(&mut json)
        .map_err(|e| toc_error(format!("reading it: {e}")))?;
    Ok(TocFile {
        mode,
        uid,
        gid,
        mtime,
        json,
    })
}

/// The TOC of a layer, checked against `expected` (the layer's annotation), from `member`
/// (see [`toc_file`]).
pub fn read_toc(member: &[u8], expected: &Digest) -> Result<Toc, IndexError> {
    let json = toc_file(member)?.json;
    let digest = Digest::of(&json);
    if digest != *expected {
        return Err(toc_error(format!(
            "its digest is {digest}, the layer's annotation says {expected}"
        )));
    }
    let toc: Toc = serde_json::from_slice(&json).map_err(|e| toc_error(format!("{e}")))?;
    if toc.version != 1 {
        return Err(toc_error(format!(
            "version {} (lamina reads 1)",
            toc.version
        )));
    }
    Ok(toc)
}

impl Toc {
    /// The regular files it lists with their chunks, each checked: chunks in order from
    /// 0 to the file's size, in members before the TOC (`toc_offset`), each with a digest;
    /// a file listed twice, or a chunk of no file, refuses the TOC.
    pub fn files(&self, toc_offset: u64) -> Result<Vec<LazyFile>, IndexError> {
        let mut files: Vec<LazyFile> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        // Each chunk's member ends where the next member of the blob starts.
        let mut starts: Vec<u64> = self
            .entries
            .iter()
            .filter(|e| e.kind == "reg" || e.kind == "chunk")
            .filter(|e| e.kind == "chunk" || e.size > 0)
            .map(|e| e.offset)
            .collect();
        starts.push(toc_offset);
        starts.sort_unstable();
        starts.dedup();
        let member_end = |start: u64| -> u64 {
            let at = starts.partition_point(|s| *s <= start);
            starts.get(at).copied().unwrap_or(toc_offset)
        };
        // Where the last chunk ended: (its member, its end in the member).
        let mut last_end = (0u64, 0u64);
        for entry in &self.entries {
            let chunk_of = match entry.kind.as_str() {
                "reg" => {
                    if !seen.insert(entry.name.clone()) {
                        return Err(toc_error(format!("`{}` is listed twice", entry.name)));
                    }
                    let digest = if entry.size == 0 {
                        Digest::of(b"")
                    } else {
                        parse_digest(&entry.name, &entry.digest)?
                    };
                    files.push(LazyFile {
                        name: entry.name.clone(),
                        size: entry.size,
                        digest,
                        chunks: Vec::new(),
                    });
                    if entry.size == 0 {
                        continue;
                    }
                    files.last_mut()
                }
                "chunk" => files.last_mut().filter(|f| f.name == entry.name),
                _ => continue,
            };
            let Some(file) = chunk_of else {
                return Err(toc_error(format!(
                    "a chunk of `{}` follows no entry of that file",
                    entry.name
                )));
            };
            let expected_offset = file.chunks.last().map_or(0, |c| c.file_offset + c.size);
            let size = if entry.chunk_size == 0 {
                file.size.saturating_sub(entry.chunk_offset)
            } else {
                entry.chunk_size
            };
            if entry.chunk_offset != expected_offset
                || size == 0
                || entry
                    .chunk_offset
                    .checked_add(size)
                    .is_none_or(|end| end > file.size)
            {
                return Err(toc_error(format!(
                    "`{}`: a chunk at {}+{} does not continue the file ({} bytes) at {expected_offset}",
                    entry.name, entry.chunk_offset, size, file.size
                )));
            }
            if entry.offset >= toc_offset {
                return Err(toc_error(format!(
                    "`{}`: a chunk's member at {} is not before the TOC",
                    entry.name, entry.offset
                )));
            }
            let member = (entry.offset, member_end(entry.offset));
            if size > MAX_CHUNK_BYTES
                || entry.inner_offset > MAX_CHUNK_BYTES
                || member.1 - member.0 > MAX_CHUNK_BYTES
            {
                return Err(toc_error(format!(
                    "`{}`: a chunk or its member is larger than {MAX_CHUNK_BYTES} bytes",
                    entry.name
                )));
            }
            // Chunks lie in the blob in the TOC's order, none overlapping another: no
            // member is fetched or inflated for more chunks than it holds.
            if (entry.offset, entry.inner_offset) < last_end {
                return Err(toc_error(format!(
                    "`{}`: a chunk at {}+{} is not after the chunk before it",
                    entry.name, entry.offset, entry.inner_offset
                )));
            }
            last_end = (entry.offset, entry.inner_offset + size);
            let digest = parse_digest(&entry.name, &entry.chunk_digest)?;
            file.chunks.push(Chunk {
                member,
                codec: Codec::Gzip,
                zeros: false,
                inner_offset: entry.inner_offset,
                file_offset: entry.chunk_offset,
                size,
                digest,
            });
        }
        for file in &files {
            check_chunks(file)?;
        }
        Ok(files)
    }
}

impl Toc {
    /// The changes the layer makes, with its files' chunks (see [`crate::lazy::tree`]).
    pub fn tree(&self, toc_offset: u64) -> Result<crate::lazy::tree::LayerTree, IndexError> {
        let files = self.files(toc_offset)?;
        let entries = self.entries.iter().map(crate::lazy::tree::RawEntry::from);
        crate::lazy::tree::build(entries, files)
    }
}

impl<'a> From<&'a TocEntry> for crate::lazy::tree::RawEntry<'a> {
    fn from(e: &'a TocEntry) -> Self {
        crate::lazy::tree::RawEntry {
            name: &e.name,
            kind: &e.kind,
            link_name: &e.link_name,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            dev: (e.dev_major, e.dev_minor),
            mtime: &e.mod_time,
            xattrs: &e.xattrs,
        }
    }
}
