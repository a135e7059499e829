//! From a reference to an [`Image`]: the manifest (following an index or manifest list to
//! this platform's entry), the config, and a remote location for every layer blob. Every
//! document is checked against the digest that named it.

use std::sync::Arc;

use lamina_image::documents::{parse_config, parse_index, parse_manifest};
use lamina_image::lazy::source::RangeSource;
use lamina_image::spec::{self, Descriptor, Manifest};
use lamina_image::{BlobLocation, Compression, Digest, Image, LayerBlob, Platform, RemoteBlob};

use crate::RegistryError;
use crate::client::{Client, PullOptions};
use crate::reference::{RegistryRef, Target};

/// Every manifest form lamina reads, in the order it prefers them.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// Indexes may point at indexes; this many levels are followed.
const MAX_DEPTH: usize = 4;

/// Resolves `reference` for `platform`; layers are fetched later, when the store opens
/// them.
pub fn resolve(
    reference: &RegistryRef,
    options: &PullOptions,
    platform: &Platform,
) -> Result<Image, RegistryError> {
    let client = Arc::new(Client::new(reference, options)?);
    let fail = |what: String| RegistryError::new(format!("image `{reference}`: {what}"));

    let (mut bytes, mut media_type) = client.document(
        &format!("manifests/{}", reference.manifest_ref()),
        ACCEPT,
        None,
    )?;
    let mut digest = Digest::of(&bytes);
    if let Target::Digest(pinned) = &reference.target
        && *pinned != digest
    {
        return Err(fail(format!(
            "manifest digest mismatch: asked for {pinned}, got {digest}"
        )));
    }
    let mut depth = 0;
    let manifest: Manifest = loop {
        let value: serde_json::Value =
            lamina_image::parse_json(&bytes, &format!("manifest {digest}"))
                .map_err(|e| fail(e.message))?;
        if let Some(declared) = value.get("mediaType").and_then(|m| m.as_str()) {
            media_type = declared.to_string();
        }
        let is_index = media_type.starts_with(spec::OCI_INDEX)
            || media_type.starts_with(spec::DOCKER_MANIFEST_LIST)
            || value.get("manifests").is_some();
        if !is_index {
            break parse_manifest(&bytes, &format!("manifest {digest}"))
                .map_err(|e| fail(e.message))?;
        }
        depth += 1;
        if depth > MAX_DEPTH {
            return Err(fail(format!(
                "image indexes nest deeper than {MAX_DEPTH} levels"
            )));
        }
        let index =
            parse_index(&bytes, &format!("image index {digest}")).map_err(|e| fail(e.message))?;
        let candidates: Vec<&Descriptor> = index.manifests.iter().collect();
        let chosen =
            lamina_image::pick_platform(&candidates, platform).map_err(|e| fail(e.message))?;
        (bytes, media_type) = client.document(
            &format!("manifests/{}", chosen.digest),
            ACCEPT,
            Some(chosen.size),
        )?;
        digest = verified(&bytes, &chosen, "manifest").map_err(fail)?;
    };

    let (config_bytes, _) = client.document(
        &format!("blobs/{}", manifest.config.digest),
        "*/*",
        Some(manifest.config.size),
    )?;
    verified(&config_bytes, &manifest.config, "image config").map_err(fail)?;
    let config = parse_config(&config_bytes, "image config").map_err(|e| fail(e.message))?;
    let diff_ids = lamina_image::check_diff_ids(&config, manifest.layers.len())
        .map_err(|e| fail(e.message))?
        .to_vec();

    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (index, (desc, diff_id)) in manifest.layers.iter().zip(diff_ids).enumerate() {
        let compression = Compression::from_media_type(&desc.media_type).ok_or_else(|| {
            fail(format!(
                "layer {index} ({}) has unsupported media type `{}`",
                desc.digest, desc.media_type
            ))
        })?;
        let (client, blob, size, urls) = (
            client.clone(),
            desc.digest.to_string(),
            desc.size,
            desc.urls.clone(),
        );
        let from = format!("{}/{}@{}", client.host(), client.repository(), desc.digest);
        let ranges = {
            let (client, blob) = (client.clone(), desc.digest.to_string());
            RangeSource {
                annotations: desc.annotations.clone(),
                repository: format!("docker://{}/{}", client.host(), client.repository()),
                plain_http: options.insecure_registries.contains(&reference.host),
                credentials: client
                    .credentials()
                    .map(|c| (c.username.clone(), c.password.clone())),
                read_range: Arc::new(move |start, len| {
                    client
                        .read_range(&blob, size, start, len)
                        .map_err(std::io::Error::other)
                }),
            }
        };
        layers.push(LayerBlob {
            index,
            location: BlobLocation::Remote(RemoteBlob {
                from,
                size: desc.size,
                opener: Arc::new(move || client.open_blob(&blob, size, &urls)),
            }),
            digest: Some(desc.digest.clone()),
            size: Some(desc.size),
            compression: Some(compression),
            diff_id,
            remote: Some(Arc::new(ranges)),
        });
    }
    Ok(Image {
        source: reference.to_string(),
        config,
        config_digest: manifest.config.digest.clone(),
        layers,
    })
}

/// Checks a fetched document against the descriptor that named it.
fn verified(bytes: &[u8], desc: &Descriptor, what: &str) -> Result<Digest, String> {
    let actual = Digest::of(bytes);
    if actual != desc.digest {
        return Err(format!(
            "{what} digest mismatch: expected {}, got {actual}",
            desc.digest
        ));
    }
    if bytes.len() as u64 != desc.size {
        return Err(format!(
            "{what} {}: size mismatch: descriptor says {} bytes, got {}",
            desc.digest,
            desc.size,
            bytes.len()
        ));
    }
    Ok(actual)
}
