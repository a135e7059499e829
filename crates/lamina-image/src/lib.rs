//! Image sources: turn an [`ImageRef`] into an [`Image`] — its config and an ordered list
//! of layer blobs, each with the digests it must be verified against — without unpacking
//! anything. Small documents (index, manifest, config) are verified here as they are
//! read; layer blobs are verified by the importer while they stream into the store.

mod blobs;
pub mod compression;
mod digest;
mod docker_archive;
pub mod documents;
pub mod lazy;
mod oci;
mod platform;
mod reference;
mod rootfs_tar;
pub mod spec;
mod tar_memo;

pub use blobs::{BlobLocation, Members, RemoteBlob, RemoteOpener};
pub use compression::Compression;
pub use digest::{Digest, HashingReader, chain_ids, next_chain_id};
pub use documents::MAX_DOCUMENT_BYTES;
pub use oci::pick_platform;
pub use platform::Platform;
pub use reference::ImageRef;
pub use spec::ImageConfig;
pub use tar_memo::{FileIdentity, NoMemo, SETTLED as TAR_SETTLED, TarMemo};

/// `s` as lamina prints any string that came from an image or a registry (a media type,
/// an annotation, a tag, a digest that failed to parse, a platform): control characters
/// escaped (`\n`, `\u{1b}`), so it can neither split a line nor drive a terminal, and
/// long strings cut with a marker. One helper for layer entry names and image documents
/// alike: it is lamina-unpack's.
pub fn shown(s: &str) -> String {
    lamina_unpack::shown(s.as_bytes())
}

/// One-line, human-readable failure naming the image part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ImageError {
    pub message: String,
}

impl ImageError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// A resolved image, ready to import.
#[derive(Debug, Clone)]
pub struct Image {
    /// The reference it came from, for logs and metadata.
    pub source: String,
    pub config: ImageConfig,
    /// Digest of the config document: the image ID.
    pub config_digest: Digest,
    /// Bottom-most first, as in the manifest.
    pub layers: Vec<LayerBlob>,
}

impl Image {
    pub fn diff_ids(&self) -> Vec<Digest> {
        self.layers.iter().map(|l| l.diff_id.clone()).collect()
    }

    pub fn chain_ids(&self) -> Vec<Digest> {
        chain_ids(&self.diff_ids())
    }

    pub fn env(&self) -> Vec<String> {
        self.config.config.env.clone().unwrap_or_default()
    }
}

/// One layer as the source stores it.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    /// Position in the image, bottom-most 0.
    pub index: usize,
    pub location: BlobLocation,
    /// Digest and size of the blob as stored, where the source declares them.
    pub digest: Option<Digest>,
    pub size: Option<u64>,
    /// Compression the media type declares, where there is a media type.
    pub compression: Option<Compression>,
    /// Digest of the uncompressed tar, from the image config.
    pub diff_id: Digest,
    /// A registry layer's descriptor annotations and byte ranges: what lazy pulling
    /// reads its index with. `None` for every other source.
    pub remote: Option<std::sync::Arc<lazy::source::RangeSource>>,
}

impl LayerBlob {
    /// `layer 1 (sha256:…)`: how errors name a layer.
    pub fn describe(&self) -> String {
        let id = self.digest.as_ref().unwrap_or(&self.diff_id);
        format!("layer {} ({id})", self.index)
    }
}

/// Resolves `reference` to an image for `platform`, with no bound on the bytes a plain
/// rootfs tar may decompress to while it is hashed. Callers that import take
/// [`resolve_limited`] and their per-layer limit.
pub fn resolve(reference: &ImageRef, platform: &Platform) -> Result<Image, ImageError> {
    resolve_limited(reference, platform, u64::MAX)
}

/// Resolves `reference` to an image for `platform`. A plain rootfs tar is hashed here (its
/// diffID names it in the store), and that pass stops at `max_layer_bytes` uncompressed
/// bytes, as the import pass does: a decompression bomb is refused before it is read
/// through.
pub fn resolve_limited(
    reference: &ImageRef,
    platform: &Platform,
    max_layer_bytes: u64,
) -> Result<Image, ImageError> {
    resolve_remembering(reference, platform, max_layer_bytes, &NoMemo)
}

/// [`resolve_limited`], taking a plain rootfs tar's digest from `memo` when it remembers
/// the file as it is now, and leaving it there when it had to hash it.
pub fn resolve_remembering(
    reference: &ImageRef,
    platform: &Platform,
    max_layer_bytes: u64,
    memo: &dyn TarMemo,
) -> Result<Image, ImageError> {
    let path = reference.path();
    let missing = || {
        ImageError::new(format!(
            "image `{}`: {} does not exist",
            shown(&reference.to_string()),
            shown(&path.display().to_string())
        ))
    };
    if !path.exists() {
        return Err(missing());
    }
    if matches!(reference, ImageRef::RootfsTar { .. }) && path.is_dir() {
        // GrootFS's text (create_test.go), which operators grep for, then the path.
        return Err(ImageError::new(format!(
            "invalid base image: directory provided instead of a tar file ({})",
            shown(&path.display().to_string())
        )));
    }
    let mut image = match reference {
        ImageRef::OciLayout { reference: r, .. } => {
            if !path.is_dir() {
                return Err(ImageError::new(format!(
                    "image `{}`: {} is not an OCI layout directory",
                    shown(&reference.to_string()),
                    shown(&path.display().to_string())
                )));
            }
            oci::resolve(&Members::dir(path), r.as_deref(), platform)
        }
        ImageRef::OciArchive { reference: r, .. } => {
            oci::resolve(&Members::tar(path)?, r.as_deref(), platform)
        }
        ImageRef::DockerArchive { reference: r, .. } => {
            docker_archive::resolve(&Members::tar(path)?, r.as_deref(), platform)
        }
        ImageRef::RootfsTar { path } => rootfs_tar::resolve(path, max_layer_bytes, memo),
    }
    .map_err(|e| {
        // Image-supplied parts of the message are escaped where they are written.
        ImageError::new(format!(
            "image `{}`: {}",
            shown(&reference.to_string()),
            e.message
        ))
    })?;
    image.source = reference.to_string();
    Ok(image)
}

/// Parses a JSON document that oci-spec has no type for (Docker's manifest.json, a
/// manifest's `mediaType` sniffed before its kind is known), naming it in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, ImageError> {
    documents::check_document_size(what, bytes.len() as u64)?;
    serde_json::from_slice(bytes).map_err(|e| {
        // serde_json quotes the input (`unknown field `…``): escaped like any image string.
        ImageError::new(format!("{what} is not valid: {}", shown(&e.to_string())))
    })
}

/// Most layers an image may have: overlay mounts at most 500 lower layers, and each
/// layer imported costs a directory tree and a sync; an image past it is refused before
/// any is imported.
pub const MAX_LAYERS: usize = 500;

/// Checks that the image config lists one diffID per layer (and no more than
/// [`MAX_LAYERS`]) and returns them.
pub fn check_diff_ids(config: &ImageConfig, layer_count: usize) -> Result<&[Digest], ImageError> {
    let ids = &config.rootfs.diff_ids;
    if layer_count > MAX_LAYERS {
        return Err(ImageError::new(format!(
            "the manifest has {layer_count} layers; overlay stacks at most {MAX_LAYERS}, so \
             no rootfs could be made of them"
        )));
    }
    if ids.len() != layer_count {
        return Err(ImageError::new(format!(
            "image config lists {} diff_ids but the manifest has {layer_count} layers",
            ids.len()
        )));
    }
    Ok(ids)
}
