//! Reading the OCI documents — index, manifest, config — with `oci-spec`'s types, and
//! narrowing them into lamina's checked types ([`crate::spec`]).
//!
//! Every document is bounded by [`MAX_DOCUMENT_BYTES`]. Readers check a document's size
//! (declared by its descriptor, or the file's) before reading it; the parsers here check
//! again, for callers that got their bytes elsewhere (a registry).

use oci_spec::image as oci;

use crate::spec::{
    ContainerConfig, Descriptor, ImageConfig, Index, Manifest, PlatformSpec, RootFs,
};
use crate::{Digest, ImageError, shown};

/// The largest index, manifest or config lamina reads: 4 MiB. Real ones are a few KiB (a
/// config with a long history reaches tens of KiB); anything near this is not an image
/// document but an attempt to make lamina hold and parse megabytes of JSON.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// Refuses a document of `size` bytes past [`MAX_DOCUMENT_BYTES`], naming it as `what`.
pub fn check_document_size(what: &str, size: u64) -> Result<(), ImageError> {
    if size > MAX_DOCUMENT_BYTES {
        return Err(ImageError::new(format!(
            "{what} is {size} bytes, past the {MAX_DOCUMENT_BYTES}-byte limit for an image document"
        )));
    }
    Ok(())
}

/// Parses an image index (or Docker manifest list).
pub fn parse_index(bytes: &[u8], what: &str) -> Result<Index, ImageError> {
    check_document_size(what, bytes.len() as u64)?;
    let index = oci::ImageIndex::from_reader(bytes).map_err(|e| invalid(what, e))?;
    let manifests = index
        .manifests()
        .iter()
        .map(|d| descriptor(d, what))
        .collect::<Result<_, _>>()?;
    Ok(Index {
        schema_version: index.schema_version(),
        media_type: index.media_type().as_ref().map(|m| m.to_string()),
        manifests,
    })
}

/// Parses an image manifest (OCI or Docker schema 2).
pub fn parse_manifest(bytes: &[u8], what: &str) -> Result<Manifest, ImageError> {
    check_document_size(what, bytes.len() as u64)?;
    let manifest = oci::ImageManifest::from_reader(bytes).map_err(|e| invalid(what, e))?;
    Ok(Manifest {
        schema_version: manifest.schema_version(),
        media_type: manifest.media_type().as_ref().map(|m| m.to_string()),
        config: descriptor(manifest.config(), what)?,
        layers: manifest
            .layers()
            .iter()
            .map(|d| descriptor(d, what))
            .collect::<Result<_, _>>()?,
    })
}

/// Parses an image config; every diffID must be a sha256 digest.
pub fn parse_config(bytes: &[u8], what: &str) -> Result<ImageConfig, ImageError> {
    check_document_size(what, bytes.len() as u64)?;
    let config = oci::ImageConfiguration::from_reader(bytes).map_err(|e| invalid(what, e))?;
    let diff_ids = config
        .rootfs()
        .diff_ids()
        .iter()
        .map(|d| Digest::parse(d).map_err(|e| ImageError::new(format!("{what}: diff_id {e}"))))
        .collect::<Result<_, _>>()?;
    let container = config.config().as_ref();
    Ok(ImageConfig {
        architecture: config.architecture().to_string(),
        os: config.os().to_string(),
        variant: config.variant().clone(),
        config: ContainerConfig {
            env: container.and_then(|c| c.env().clone()),
            cmd: container.and_then(|c| c.cmd().clone()),
            working_dir: container.and_then(|c| c.working_dir().clone()),
        },
        rootfs: RootFs {
            kind: config.rootfs().typ().clone(),
            diff_ids,
        },
    })
}

/// oci-spec's error text can quote the document (an unknown variant, a bad digest): it
/// is escaped like every other image-supplied string.
fn invalid(what: &str, e: oci_spec::OciSpecError) -> ImageError {
    ImageError::new(format!("{what} is not valid: {}", shown(&e.to_string())))
}

/// Narrows a descriptor: only sha256 digests (lamina derives blob paths from them).
fn descriptor(d: &oci::Descriptor, what: &str) -> Result<Descriptor, ImageError> {
    let digest = Digest::parse(d.digest().as_ref())
        .map_err(|e| ImageError::new(format!("{what}: descriptor {e}")))?;
    Ok(Descriptor {
        media_type: d.media_type().to_string(),
        digest,
        size: d.size(),
        platform: d.platform().as_ref().map(|p| PlatformSpec {
            architecture: p.architecture().to_string(),
            os: p.os().to_string(),
            variant: p.variant().clone(),
        }),
        annotations: d
            .annotations()
            .as_ref()
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
        urls: d.urls().clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn parses_a_manifest_into_checked_types() {
        let json = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":7}},
            "layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"{}","size":9,
            "annotations":{{"a":"b"}},"urls":["http://x/y"]}}]}}"#,
            digest('a'),
            digest('b')
        );
        let m = parse_manifest(json.as_bytes(), "manifest").unwrap();
        assert_eq!(m.config.digest.to_string(), digest('a'));
        assert_eq!(
            m.layers[0].media_type,
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
        );
        assert_eq!(m.layers[0].annotations["a"], "b");
        assert_eq!(m.layers[0].urls, ["http://x/y"]);
    }

    #[test]
    fn refuses_digests_lamina_cannot_store() {
        let sha512 = format!("sha512:{}", "a".repeat(128));
        let json = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"x","digest":"{sha512}","size":1}}]}}"#
        );
        let err = parse_index(json.as_bytes(), "index.json").unwrap_err();
        assert!(err.message.contains("not a sha256 digest"), "{err}");
    }

    #[test]
    fn refuses_oversized_documents_by_name() {
        let big = vec![b' '; MAX_DOCUMENT_BYTES as usize + 1];
        let err = parse_config(&big, "image config").unwrap_err();
        assert!(
            err.message
                .starts_with("image config is 4194305 bytes, past the 4194304-byte limit"),
            "{err}"
        );
    }

    #[test]
    fn parse_errors_are_escaped() {
        let json = "{\"schemaVersion\":2,\"manifests\":[{\"digest\":\"sha256:\x1b[2K\",\"size\":1,\"mediaType\":\"x\"}]}";
        let err = parse_index(json.as_bytes(), "index.json").unwrap_err();
        assert!(!err.message.contains('\x1b'), "{err}");
    }

    #[test]
    fn config_keeps_platform_and_env() {
        let json = format!(
            r#"{{"architecture":"arm64","os":"linux","variant":"v8","config":{{"Env":["A=1"]}},
            "rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
            digest('c')
        );
        let c = parse_config(json.as_bytes(), "image config").unwrap();
        assert_eq!(c.platform().unwrap().to_string(), "linux/arm64/v8");
        assert_eq!(c.config.env.unwrap(), ["A=1"]);
    }
}
