//! The image documents lamina reads, in the checked form the rest of lamina uses.
//!
//! The OCI documents (index, manifest, config) are parsed by [`crate::documents`] with the
//! `oci-spec` crate's types, which follow the published schema; they are then narrowed
//! into the types below. These stay lamina's own because they carry what was checked: a
//! strict sha256 [`Digest`] (every blob path is derived from one), media types as plain
//! strings, and only the config fields lamina uses. They serialize to spec-conforming JSON,
//! which is how lamina-sample and the tests write images. `docker save`'s manifest.json is
//! Docker's format, not OCI's, so it has a small serde type of its own here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::Digest;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformSpec>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Where a non-distributable layer can be fetched instead of the registry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

impl Descriptor {
    /// The `org.opencontainers.image.ref.name` annotation, if any.
    pub fn ref_name(&self) -> Option<&str> {
        self.annotations
            .get(REF_NAME_ANNOTATION)
            .map(String::as_str)
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PlatformSpec {
    pub architecture: String,
    pub os: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl std::fmt::Display for PlatformSpec {
    /// `os/arch[/variant]`, escaped: these strings come from the image.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = crate::shown;
        write!(f, "{}/{}", shown(&self.os), shown(&self.architecture))?;
        if let Some(v) = &self.variant {
            write!(f, "/{}", shown(v))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image configuration: what a container needs (Env), the platform it was built for,
/// and the layer diffIDs that every unpacked layer is checked against.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ImageConfig {
    pub architecture: String,
    pub os: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub config: ContainerConfig,
    pub rootfs: RootFs,
}

impl ImageConfig {
    /// The platform the config declares, or `None` when it leaves both os and architecture
    /// empty (then nothing is known to refuse; one field alone is still checked).
    pub fn platform(&self) -> Option<PlatformSpec> {
        (!self.os.is_empty() || !self.architecture.is_empty()).then(|| PlatformSpec {
            architecture: self.architecture.clone(),
            os: self.os.clone(),
            variant: self.variant.clone(),
        })
    }
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct ContainerConfig {
    #[serde(rename = "Env", skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(rename = "Cmd", skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

/// One element of `docker save`'s manifest.json. This is Docker's format, not an OCI
/// document, so oci-spec has no type for it; unknown fields are ignored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DockerArchiveEntry {
    #[serde(rename = "Config")]
    pub config: String,
    #[serde(rename = "RepoTags", default)]
    pub repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    pub layers: Vec<String>,
}
