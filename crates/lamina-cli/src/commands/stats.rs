//! `stats` and `capacity`: Garden's questions about disk, answered in GrootFS's JSON.

use lamina_store::Store;

/// The configured size, else what `init-store` recorded, else the store filesystem's.
pub fn capacity(store: &Store, configured: Option<u64>) -> anyhow::Result<u64> {
    if let Some(bytes) = configured.or(store.properties().store_size_bytes) {
        return Ok(bytes);
    }
    Ok(store.filesystem_size()?)
}
