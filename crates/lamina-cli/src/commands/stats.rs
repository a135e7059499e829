//! `stats` and `capacity`: Garden's questions about disk, answered in GrootFS's JSON.

use super::Ctx;

/// The configured size, else what `init-store` recorded, else the store filesystem's.
/// A configured size needs no store: GrootFS's capacity_test.go asks before `init-store`.
pub fn capacity(ctx: &Ctx, configured: Option<u64>) -> anyhow::Result<u64> {
    if let Some(bytes) = configured {
        return Ok(bytes);
    }
    let store = ctx.open_store()?;
    if let Some(bytes) = store.properties().store_size_bytes {
        return Ok(bytes);
    }
    Ok(store.filesystem_size()?)
}
