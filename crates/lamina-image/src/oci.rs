//! OCI image layouts (a directory, or the same in a tar): index.json → (nested indexes →)
//! manifest → config and layers. Every document's declared size is checked against
//! [`MAX_DOCUMENT_BYTES`] and the blob's real size before it is read, and its digest
//! after, before it is parsed.

use std::io::Read;

use crate::blobs::Members;
use crate::compression::Compression;
use crate::documents::{self, MAX_DOCUMENT_BYTES};
use crate::spec::{self, Descriptor, Index, Manifest};
use crate::{Digest, Image, ImageError, LayerBlob, Platform, platform, shown};

/// Nested indexes deeper than this are refused (a loop of indexes would never end).
const MAX_INDEX_DEPTH: usize = 4;

pub fn resolve(
    members: &Members,
    reference: Option<&str>,
    platform: &Platform,
) -> Result<Image, ImageError> {
    let index = documents::parse_index(&members.read("index.json")?, "index.json")?;
    let mut candidates: Vec<&Descriptor> = index.manifests.iter().collect();
    if let Some(r) = reference {
        candidates.retain(|d| d.ref_name() == Some(r));
        if candidates.is_empty() {
            return Err(ImageError::new(format!(
                "no image named `{}` (available: {})",
                shown(r),
                ref_names(&index)
            )));
        }
    }
    let chosen = if candidates.len() == 1 {
        candidates[0].clone()
    } else {
        pick_platform(&candidates, platform).map_err(|e| {
            ImageError::new(format!(
                "{}; name one image with :REF (available: {})",
                e.message,
                ref_names(&index)
            ))
        })?
    };
    // A single candidate is taken by name, not by platform: it must still be for `platform`.
    if let Some(declared) = &chosen.platform {
        platform::refuse_foreign(declared, platform, "its index entry")?;
    }
    let manifest = load_manifest(members, &chosen, platform, 0)?;
    let config_bytes = read_verified(members, &manifest.config, "image config")?;
    let config = documents::parse_config(&config_bytes, "image config")?;
    if let Some(declared) = config.platform() {
        platform::refuse_foreign(&declared, platform, "its config")?;
    }
    let diff_ids = crate::check_diff_ids(&config, manifest.layers.len())?;

    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (index, (desc, diff_id)) in manifest.layers.iter().zip(diff_ids).enumerate() {
        let compression = Compression::from_media_type(&desc.media_type).ok_or_else(|| {
            ImageError::new(format!(
                "layer {index} ({}) has unsupported media type `{}`",
                desc.digest,
                shown(&desc.media_type)
            ))
        })?;
        let location = members.locate(&blob_path(&desc.digest)).ok_or_else(|| {
            ImageError::new(format!(
                "manifest names blob {} (layer {index}), which is missing",
                desc.digest
            ))
        })?;
        layers.push(LayerBlob {
            index,
            location,
            digest: Some(desc.digest.clone()),
            size: Some(desc.size),
            compression: Some(compression),
            diff_id: diff_id.clone(),
            remote: None,
        });
    }
    Ok(Image {
        source: String::new(),
        config,
        config_digest: manifest.config.digest.clone(),
        layers,
    })
}

fn blob_path(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// Reads a document blob and checks it against its descriptor. The declared size is
/// bounded and compared with the blob's before anything is read.
fn read_verified(members: &Members, desc: &Descriptor, what: &str) -> Result<Vec<u8>, ImageError> {
    let named = format!("{what} {}", desc.digest);
    documents::check_document_size(&named, desc.size)?;
    let location = members
        .locate(&blob_path(&desc.digest))
        .ok_or_else(|| ImageError::new(format!("{what} blob {} is missing", desc.digest)))?;
    let fail = |e: std::io::Error| ImageError::new(format!("{named}: reading: {e}"));
    let size = location.size().map_err(fail)?;
    if size != desc.size {
        return Err(ImageError::new(format!(
            "{what} blob {}: size mismatch: descriptor says {} bytes, blob has {size}",
            desc.digest, desc.size
        )));
    }
    // Bounded by the size check above; room for one byte more reads it in one call.
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
    location
        .open()
        .map_err(fail)?
        .take(MAX_DOCUMENT_BYTES.min(desc.size) + 1)
        .read_to_end(&mut bytes)
        .map_err(fail)?;
    if bytes.len() as u64 != desc.size {
        return Err(ImageError::new(format!(
            "{what} blob {}: size mismatch: descriptor says {} bytes, blob has {}",
            desc.digest,
            desc.size,
            bytes.len()
        )));
    }
    let actual = Digest::of(&bytes);
    if actual != desc.digest {
        return Err(ImageError::new(format!(
            "{what} blob: digest mismatch: expected {}, got {actual}",
            desc.digest
        )));
    }
    Ok(bytes)
}

/// Follows indexes down to an image manifest, choosing by platform at each index.
fn load_manifest(
    members: &Members,
    desc: &Descriptor,
    platform: &Platform,
    depth: usize,
) -> Result<Manifest, ImageError> {
    if depth > MAX_INDEX_DEPTH {
        return Err(ImageError::new(format!(
            "image indexes nest deeper than {MAX_INDEX_DEPTH} levels"
        )));
    }
    let bytes = read_verified(members, desc, "manifest")?;
    let what = format!("manifest {}", desc.digest);
    // The kind of document decides which type parses it, so its mediaType is read first.
    let value: serde_json::Value = crate::parse_json(&bytes, &what)?;
    let media_type = value
        .get("mediaType")
        .and_then(|m| m.as_str())
        .unwrap_or(&desc.media_type);
    let is_index = matches!(media_type, spec::OCI_INDEX | spec::DOCKER_MANIFEST_LIST)
        || value.get("manifests").is_some();
    if is_index {
        let index = documents::parse_index(&bytes, &format!("image index {}", desc.digest))?;
        let refs: Vec<&Descriptor> = index.manifests.iter().collect();
        let chosen = pick_platform(&refs, platform)?;
        return load_manifest(members, &chosen, platform, depth + 1);
    }
    match media_type {
        spec::OCI_MANIFEST | spec::DOCKER_MANIFEST | "" => {}
        other => {
            return Err(ImageError::new(format!(
                "manifest {} has unsupported media type `{}`",
                desc.digest,
                shown(other)
            )));
        }
    }
    documents::parse_manifest(&bytes, &what)
}

/// The first of `candidates` whose declared platform matches `platform`.
pub fn pick_platform(
    candidates: &[&Descriptor],
    platform: &Platform,
) -> Result<Descriptor, ImageError> {
    candidates
        .iter()
        // Choosing among several, an entry must name its platform in full.
        .find(|d| {
            d.platform.as_ref().is_some_and(|p| {
                !p.os.is_empty() && !p.architecture.is_empty() && platform.matches(p)
            })
        })
        .map(|d| (*d).clone())
        .ok_or_else(|| {
            let available: Vec<String> = candidates
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", shown(&p.os), shown(&p.architecture)))
                .collect();
            ImageError::new(format!(
                "no image for platform {} among {} candidates (platforms: {})",
                shown(&platform.to_string()),
                candidates.len(),
                if available.is_empty() {
                    "none declared".to_string()
                } else {
                    available.join(", ")
                }
            ))
        })
}

/// The ref names an index offers, escaped, for errors.
fn ref_names(index: &Index) -> String {
    let names: Vec<String> = index
        .manifests
        .iter()
        .filter_map(Descriptor::ref_name)
        .map(shown)
        .collect();
    if names.is_empty() {
        "no named images".into()
    } else {
        names.join(", ")
    }
}
