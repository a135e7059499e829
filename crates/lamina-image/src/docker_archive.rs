//! `docker save` archives: manifest.json names the config and the layer tars. Layers have
//! no declared compressed digest (older saves) so the diffIDs in the config, checked as
//! each layer streams in, are what proves them.

use crate::blobs::Members;
use crate::spec::DockerArchiveEntry;
use crate::{Digest, Image, ImageError, LayerBlob, Platform, documents, platform, shown};

pub fn resolve(
    members: &Members,
    reference: Option<&str>,
    platform: &Platform,
) -> Result<Image, ImageError> {
    let entries: Vec<DockerArchiveEntry> =
        crate::parse_json(&members.read("manifest.json")?, "manifest.json")?;
    let tags = |e: &DockerArchiveEntry| e.repo_tags.clone().unwrap_or_default();
    let entry = match reference {
        Some(r) => entries.iter().find(|e| {
            tags(e)
                .iter()
                .any(|t| t == r || t.strip_suffix(":latest") == Some(r))
        }),
        None if entries.len() == 1 => entries.first(),
        None => None,
    };
    let entry = entry.ok_or_else(|| {
        let all: Vec<String> = entries.iter().flat_map(tags).map(|t| shown(&t)).collect();
        let what = reference.map_or(
            "manifest.json holds several images; name one with :REPO:TAG".to_string(),
            |r| format!("no image tagged `{}`", shown(r)),
        );
        ImageError::new(format!(
            "{what} (tags: {})",
            if all.is_empty() {
                "none".into()
            } else {
                all.join(", ")
            }
        ))
    })?;

    let config_bytes = members.read(&entry.config)?;
    if let Some(expected) = digest_in_name(&entry.config) {
        let actual = Digest::of(&config_bytes);
        if actual != expected {
            return Err(ImageError::new(format!(
                "image config `{}`: digest mismatch: expected {expected}, got {actual}",
                shown(&entry.config)
            )));
        }
    }
    let config = documents::parse_config(
        &config_bytes,
        &format!("image config `{}`", shown(&entry.config)),
    )?;
    if let Some(declared) = config.platform() {
        platform::refuse_foreign(&declared, platform, "its config")?;
    }
    let diff_ids = crate::check_diff_ids(&config, entry.layers.len())?;

    let mut layers = Vec::with_capacity(entry.layers.len());
    for (index, (name, diff_id)) in entry.layers.iter().zip(diff_ids).enumerate() {
        let location = members.locate(name).ok_or_else(|| {
            ImageError::new(format!(
                "manifest.json names layer `{}` (layer {index}), which is missing",
                shown(name)
            ))
        })?;
        layers.push(LayerBlob {
            index,
            location,
            digest: digest_in_name(name),
            size: None,
            compression: None,
            diff_id: diff_id.clone(),
            remote: None,
        });
    }
    Ok(Image {
        source: String::new(),
        config,
        config_digest: Digest::of(&config_bytes),
        layers,
    })
}

/// `blobs/sha256/<hex>` (newer docker) and `<hex>.json` (older) carry their digest.
fn digest_in_name(name: &str) -> Option<Digest> {
    let base = name.rsplit('/').next()?;
    Digest::from_hex(base.strip_suffix(".json").unwrap_or(base))
}
