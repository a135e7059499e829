//! Layer compression: declared by the media type, confirmed by the blob's magic bytes.

use std::io::{self, BufRead, BufReader, Read};

use crate::ImageError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

impl Compression {
    /// What a layer media type declares; `None` for media types that are not layers.
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        let base = media_type.trim_end_matches(".nondistributable");
        match base {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => {
                Some(Compression::Gzip)
            }
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// What the first bytes of a blob say it is.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(GZIP_MAGIC) {
            Compression::Gzip
        } else if head.starts_with(ZSTD_MAGIC) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Wraps `blob` in the decoder its magic bytes call for, after checking them against
/// `declared` (when the source declares anything). `what` names the layer in errors.
pub fn decoder<'a, R: Read + 'a>(
    blob: R,
    declared: Option<Compression>,
    what: &str,
) -> Result<Box<dyn Read + 'a>, ImageError> {
    let mut buffered = BufReader::with_capacity(256 * 1024, blob);
    let head = buffered
        .fill_buf()
        .map_err(|e| ImageError::new(format!("{what}: reading: {e}")))?;
    let actual = Compression::sniff(head);
    if let Some(declared) = declared
        && declared != actual
    {
        return Err(ImageError::new(format!(
            "{what}: media type declares {declared:?} compression but the blob is {actual:?}"
        )));
    }
    Ok(match actual {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(buffered)
                .map_err(|e: io::Error| ImageError::new(format!("{what}: zstd: {e}")))?,
        ),
    })
}
