//! Images from OCI distribution registries (`docker://HOST[:PORT]/REPO[:TAG|@DIGEST]`).
//!
//! Resolution fetches the small documents (index or manifest list, image manifest,
//! config), verifying each against its digest, and returns a [`lamina_image::Image`]
//! whose layers are [`lamina_image::BlobLocation::Remote`]: the store's importer opens
//! each one as an HTTP stream and verifies and unpacks it as the bytes arrive, exactly as
//! it does a local blob. Nothing is downloaded to a temporary file first.

mod auth;
mod blob_stream;
mod client;
mod docker_config;
mod pace;
mod redact;
mod reference;
mod resolve;
mod trust;

pub use auth::Credentials;
pub use client::{Client, DEFAULT_STALL_TIMEOUT, MAX_LAYER_URLS, MAX_RANGE_BYTES, PullOptions};
pub use docker_config::credentials_for;
pub use pace::MIN_RATE;
pub use reference::{DOCKER_HUB, RegistryRef, Target};
pub use resolve::resolve;
pub use trust::{Trust, trust};

/// A registry failure, one line, naming the registry and what was asked of it. Never
/// contains credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    pub message: String,
}

impl RegistryError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}
