//! Layers with an index, which a lazy pull reads before (or instead of) the layer: eStargz
//! (gzip members per file chunk, a TOC at the end) and zstd:chunked (zstd frames per file
//! chunk, a manifest in a skippable frame). Each format's reader checks its index against
//! the digest a layer annotation gives and turns it into the same shape: the layer's
//! regular files, each as chunks located in the blob, each with the digest its bytes must
//! have. Everything here comes from a registry and is bounded and checked before use.

use std::io::Read;

use crate::Digest;

pub mod estargz;
pub mod source;
pub mod tree;
pub mod zstd_chunked;

/// The most bytes one chunk, its offset in its member, or its member may hold: a chunk
/// is fetched and decompressed whole, so this bounds what one read costs.
pub const MAX_CHUNK_BYTES: u64 = 64 << 20;
/// The most index bytes lamina reads (compressed or not): an index of a layer, not a layer.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;
/// The most entries an index may list (a layer listing more is pulled whole): checked
/// while the index is parsed, so a small member cannot expand into more entries in memory.
pub const MAX_INDEX_ENTRIES: usize = 1 << 19;
/// The most extended attributes an index may give all its entries together.
pub const MAX_INDEX_XATTRS: usize = 1 << 16;

/// Entries an index may hold; the `xattrs` each one carries counted against
/// [`MAX_INDEX_XATTRS`].
pub(crate) trait IndexEntry {
    fn xattr_count(&self) -> usize;
}

/// Deserializes an index's `entries`, failing at the first entry past
/// [`MAX_INDEX_ENTRIES`] or the first xattr past [`MAX_INDEX_XATTRS`] instead of building
/// them all first.
pub(crate) fn bounded_entries<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + IndexEntry,
{
    struct Bounded<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de> + IndexEntry> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_INDEX_ENTRIES} entries")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut entries = Vec::new();
            let mut xattrs = 0usize;
            while let Some(entry) = seq.next_element::<T>()? {
                xattrs += entry.xattr_count();
                if entries.len() == MAX_INDEX_ENTRIES || xattrs > MAX_INDEX_XATTRS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_INDEX_ENTRIES} entries or {MAX_INDEX_XATTRS} xattrs"
                    )));
                }
                entries.push(entry);
            }
            Ok(entries)
        }
    }
    deserializer.deserialize_seq(Bounded(std::marker::PhantomData))
}

/// Why a layer's index cannot be used (the layer is then pulled whole).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IndexError {
    #[error("eStargz footer: {0}")]
    Footer(String),
    #[error("layer index: {0}")]
    Index(String),
}

pub(crate) fn index_error(why: impl Into<String>) -> IndexError {
    IndexError::Index(why.into())
}

/// How a chunk's member is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Zstd,
}

/// A regular file's bytes, as a chunk in the blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Where its member (gzip member, or zstd frames) starts in the blob, and where the
    /// bytes to fetch for it end.
    pub member: (u64, u64),
    pub codec: Codec,
    /// All zero bytes (zstd:chunked marks such chunks): nothing to fetch.
    pub zeros: bool,
    /// Where in the member's decompressed bytes it starts.
    pub inner_offset: u64,
    /// Its place in the file.
    pub file_offset: u64,
    pub size: u64,
    pub digest: Digest,
}

/// A regular file of the layer and the chunks that hold it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyFile {
    pub name: String,
    pub size: u64,
    pub digest: Digest,
    pub chunks: Vec<Chunk>,
}

/// The bytes of `chunk` from its fetched member (`member`: the blob's bytes
/// `chunk.member`), checked against its digest; a zeros chunk needs no member. The
/// reader that made `chunk` bounded what this decompresses.
pub fn chunk_bytes(member: &[u8], chunk: &Chunk) -> Result<Vec<u8>, IndexError> {
    if chunk.zeros {
        return Ok(vec![0; chunk.size as usize]);
    }
    let inflated = inflate_member(member, chunk.codec, chunk.inner_offset + chunk.size)?;
    chunk_from(&inflated, chunk)
}

/// The first `upto` decompressed bytes of a member (fewer if it is shorter): what the
/// chunks sharing it need, decompressed once for all of them. The readers bound `upto`
/// (a chunk's end in its member is at most twice [`MAX_CHUNK_BYTES`]).
pub fn inflate_member(member: &[u8], codec: Codec, upto: u64) -> Result<Vec<u8>, IndexError> {
    let decoder: Box<dyn Read + '_> = match codec {
        Codec::Gzip => Box::new(flate2::read::GzDecoder::new(member)),
        Codec::Zstd => Box::new(
            zstd::stream::read::Decoder::new(member)
                .map_err(|e| index_error(format!("a chunk's member does not decompress: {e}")))?,
        ),
    };
    let mut bytes = Vec::new();
    decoder
        .take(upto)
        .read_to_end(&mut bytes)
        .map_err(|e| index_error(format!("a chunk's member does not decompress: {e}")))?;
    Ok(bytes)
}

/// The bytes of `chunk` from its member decompressed (at least up to the chunk's end),
/// checked against its digest.
pub fn chunk_from(inflated: &[u8], chunk: &Chunk) -> Result<Vec<u8>, IndexError> {
    if chunk.zeros {
        return Ok(vec![0; chunk.size as usize]);
    }
    let start = chunk.inner_offset as usize;
    let bytes = inflated
        .get(start..start + chunk.size as usize)
        .ok_or_else(|| index_error("a chunk's member is shorter than its chunk"))?;
    let digest = Digest::of(bytes);
    if digest != chunk.digest {
        return Err(index_error(format!(
            "a chunk's bytes hash to {digest}, its index says {}",
            chunk.digest
        )));
    }
    Ok(bytes.to_vec())
}

/// Checks that `file`'s chunks run in order from 0 to its size, each bounded.
pub fn check_chunks(file: &LazyFile) -> Result<(), IndexError> {
    let mut at = 0u64;
    for chunk in &file.chunks {
        if chunk.file_offset != at || chunk.size == 0 {
            return Err(index_error(format!(
                "`{}`: a chunk at {}+{} does not continue the file at {at}",
                file.name, chunk.file_offset, chunk.size
            )));
        }
        if chunk.size > MAX_CHUNK_BYTES
            || chunk.inner_offset > MAX_CHUNK_BYTES
            || chunk.member.1 <= chunk.member.0
            || chunk.member.1 - chunk.member.0 > MAX_CHUNK_BYTES
        {
            return Err(index_error(format!(
                "`{}`: a chunk or its member is empty or larger than {MAX_CHUNK_BYTES} bytes",
                file.name
            )));
        }
        at += chunk.size;
    }
    if at != file.size {
        return Err(index_error(format!(
            "`{}`: its chunks do not cover its {} bytes",
            file.name, file.size
        )));
    }
    Ok(())
}

fn parse_digest(name: &str, text: &str) -> Result<Digest, IndexError> {
    Digest::parse(text).map_err(|e| index_error(format!("`{name}`: digest `{text}`: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn chunks_sharing_a_member_are_cut_from_one_decompression_and_checked() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"first!second").unwrap();
        let member = gz.finish().unwrap();
        let chunk = |inner_offset: u64, bytes: &[u8]| Chunk {
            member: (0, member.len() as u64),
            codec: Codec::Gzip,
            zeros: false,
            inner_offset,
            file_offset: inner_offset,
            size: bytes.len() as u64,
            digest: Digest::of(bytes),
        };
        let (first, second) = (chunk(0, b"first!"), chunk(6, b"second"));
        let inflated = inflate_member(&member, Codec::Gzip, 12).unwrap();
        assert_eq!(chunk_from(&inflated, &first).unwrap(), b"first!");
        assert_eq!(chunk_from(&inflated, &second).unwrap(), b"second");
        assert_eq!(chunk_bytes(&member, &second).unwrap(), b"second");
        // Bytes that are not the digest's, and a chunk past the member's end, are refused.
        let lying = Chunk {
            digest: Digest::of(b"other!"),
            ..first.clone()
        };
        assert!(chunk_from(&inflated, &lying).is_err());
        let past = Chunk {
            inner_offset: 10,
            ..second
        };
        assert!(chunk_from(&inflated, &past).is_err());
    }
}
