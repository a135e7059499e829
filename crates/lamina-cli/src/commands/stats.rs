//! `stats` and `capacity`: Garden's questions about disk, answered in GrootFS's JSON.

use lamina_store::StoreError;
use lamina_sys::RealMounter;

use super::{AlreadyReported, Ctx};

/// Prints the container's disk usage. A failure is logged with the ID or path asked
/// about, as GrootFS logs it (stats_test.go, "when the store doesn't exist"): Garden's
/// log then says which container's stats failed.
pub fn run(ctx: &Ctx, mounter: &RealMounter, id_or_path: &str) -> anyhow::Result<()> {
    match usage(ctx, mounter, id_or_path) {
        Ok(line) => {
            println!("{line}");
            Ok(())
        }
        Err(e) => {
            let message = crate::output::error_line(&crate::one_line(&e));
            tracing::error!(id = %lamina_image::shown(id_or_path), error = %message, "command failed");
            println!("{message}");
            Err(AlreadyReported.into())
        }
    }
}

fn usage(ctx: &Ctx, mounter: &RealMounter, id_or_path: &str) -> anyhow::Result<String> {
    let store = match ctx.open_store() {
        Ok(store) => store,
        Err(e) => {
            return Err(match e.downcast::<StoreError>() {
                Ok(opening) => super::absent::not_found(ctx, id_or_path, opening),
                Err(other) => other,
            });
        }
    };
    let id = super::container_id(&store, id_or_path)?;
    Ok(crate::output::json_line(&lamina_mount::stats(
        &store, mounter, &id,
    )?)?)
}

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
