//! Where a lazy layer's index comes from: the registry layer's descriptor annotations say
//! which format it has and where its index is, its byte ranges give the index, and the
//! annotation's digest checks it. What is kept of it ([`IndexRecord`] and the index's
//! bytes) is enough to build the layer's tree again without the registry.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Digest;
use crate::lazy::estargz::{
    FOOTER_SIZE, TOC_DIGEST_ANNOTATION, TOC_NAME, TocFile, read_toc, toc_file, toc_offset,
};
use crate::lazy::tree::LayerTree;
use crate::lazy::zstd_chunked::{
    MANIFEST_CHECKSUM_ANNOTATION, MANIFEST_POSITION_ANNOTATION, ManifestPosition, read_manifest,
};
use crate::lazy::{IndexError, index_error};

/// Bytes `start..start + len` of the layer's blob.
pub type ReadRange = dyn Fn(u64, u64) -> io::Result<Vec<u8>> + Send + Sync;

/// A registry layer as lazy pulling sees it.
pub struct RangeSource {
    /// The layer descriptor's annotations (where its index is, and its digest).
    pub annotations: BTreeMap<String, String>,
    /// `docker://HOST/REPO`: where a server started later fetches the layer's chunks.
    pub repository: String,
    /// The registry was spoken to over plain HTTP (the operator marked it insecure).
    pub plain_http: bool,
    /// The username and password this pull spoke to the registry with (given, or its
    /// auth file's for the host), if any: a server fetches this layer's chunks with them,
    /// and no other layer's.
    pub credentials: Option<(String, String)>,
    pub read_range: Arc<ReadRange>,
}

impl std::fmt::Debug for RangeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeSource")
            .field("repository", &self.repository)
            .finish_non_exhaustive()
    }
}

/// Which index a layer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Estargz,
    ZstdChunked,
}

/// Where a layer's index was and what it must hash to: with the index's bytes, all that
/// [`IndexRecord::tree`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRecord {
    pub format: Format,
    /// Where the index's bytes start in the blob (its members all end before this).
    pub offset: u64,
    /// How many bytes it takes.
    pub length: u64,
    /// eStargz: the TOC's digest; zstd:chunked: the compressed manifest's.
    pub digest: Digest,
    /// zstd:chunked: the manifest's uncompressed length.
    #[serde(default)]
    pub uncompressed: u64,
}

/// The layer's format as its annotations name it, if it carries an index.
pub fn format_of(annotations: &BTreeMap<String, String>) -> Option<Format> {
    if annotations.contains_key(TOC_DIGEST_ANNOTATION) {
        Some(Format::Estargz)
    } else if annotations.contains_key(MANIFEST_CHECKSUM_ANNOTATION)
        && annotations.contains_key(MANIFEST_POSITION_ANNOTATION)
    {
        Some(Format::ZstdChunked)
    } else {
        None
    }
}

/// The format and index digest a layer's annotations declare, without fetching anything:
/// what a lazy layer already in the store must have been published from to be reused.
pub fn declared(annotations: &BTreeMap<String, String>) -> Option<(Format, Digest)> {
    let format = format_of(annotations)?;
    let name = match format {
        Format::Estargz => TOC_DIGEST_ANNOTATION,
        Format::ZstdChunked => MANIFEST_CHECKSUM_ANNOTATION,
    };
    Some((format, Digest::parse(annotations.get(name)?).ok()?))
}

fn fetch_error(e: io::Error) -> IndexError {
    index_error(format!("fetching it: {e}"))
}

/// Fetches and checks the index of a layer `blob_size` bytes long that carries one:
/// the record, the index's bytes, and the tree they make. `None` if its annotations
/// name no index.
pub fn fetch_index(
    source: &RangeSource,
    blob_size: u64,
) -> Result<Option<(IndexRecord, Vec<u8>, LayerTree)>, IndexError> {
    let annotation = |name: &str| {
        source
            .annotations
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    };
    let parse_digest = |name: &str| {
        Digest::parse(annotation(name))
            .map_err(|e| index_error(format!("annotation {name}: {}", e.message)))
    };
    let record = match format_of(&source.annotations) {
        None => return Ok(None),
        Some(Format::Estargz) => {
            let digest = parse_digest(TOC_DIGEST_ANNOTATION)?;
            if blob_size <= FOOTER_SIZE {
                return Err(IndexError::Footer("the blob is shorter than one".into()));
            }
            let footer =
                (source.read_range)(blob_size - FOOTER_SIZE, FOOTER_SIZE).map_err(fetch_error)?;
            let offset = toc_offset(&footer, blob_size)?;
            IndexRecord {
                format: Format::Estargz,
                offset,
                length: blob_size - FOOTER_SIZE - offset,
                digest,
                uncompressed: 0,
            }
        }
        Some(Format::ZstdChunked) => {
            let position =
                ManifestPosition::parse(annotation(MANIFEST_POSITION_ANNOTATION), blob_size)?;
            IndexRecord {
                format: Format::ZstdChunked,
                offset: position.offset,
                length: position.length,
                digest: parse_digest(MANIFEST_CHECKSUM_ANNOTATION)?,
                uncompressed: position.uncompressed,
            }
        }
    };
    let bytes = (source.read_range)(record.offset, record.length).map_err(fetch_error)?;
    let tree = record.tree(&bytes)?;
    Ok(Some((record, bytes, tree)))
}

impl IndexRecord {
    /// Files the layer's tar holds whose bytes the index itself gives, so a lazy view
    /// shows them as a whole pull does: eStargz's TOC entry. Call after [`Self::tree`]
    /// accepted `bytes`.
    pub fn inline_files(&self, bytes: &[u8]) -> Result<Vec<(String, TocFile)>, IndexError> {
        match self.format {
            Format::Estargz => Ok(vec![(TOC_NAME.to_string(), toc_file(bytes)?)]),
            Format::ZstdChunked => Ok(Vec::new()),
        }
    }

    /// The layer's tree from the index's `bytes`, checked against the digest again (the
    /// bytes may have been read back from disk).
    pub fn tree(&self, bytes: &[u8]) -> Result<LayerTree, IndexError> {
        if bytes.len() as u64 != self.length {
            return Err(index_error("its bytes are not the length recorded"));
        }
        match self.format {
            Format::Estargz => read_toc(bytes, &self.digest)?.tree(self.offset),
            Format::ZstdChunked => {
                let position = ManifestPosition {
                    offset: self.offset,
                    length: self.length,
                    uncompressed: self.uncompressed,
                };
                read_manifest(bytes, &position, &self.digest)?.tree(self.offset)
            }
        }
    }
}
