//! What `list`, `clean`, `stats` and `delete` do about a store that is not there, as
//! GrootFS's specs have it ("when the store doesn't exist" in list_test.go,
//! clean_test.go, stats_test.go and delete_test.go). Garden cleans on a timer and asks
//! about containers of stores an operator may have removed: each answer names, in a log
//! line, the path or the ID it was asked about, and only a question that needs the store
//! fails (`list`, `stats`); `clean` and `delete` have nothing to do, and succeed.

use std::path::{Path, PathBuf};

use lamina_mount::CleanReport;
use lamina_store::{Layout, StoreError};

use super::Ctx;

/// GrootFS's words for a store directory that does not exist, which list_test.go and
/// clean_test.go read in the log.
pub fn no_store(path: &Path) -> String {
    format!("no store found at {}", path.display())
}

/// `clean` of a store that does not exist: nothing to clean, said in the log and in the
/// report. `None` when the store is there.
pub fn clean(ctx: &Ctx, threshold_bytes: Option<u64>) -> Option<CleanReport> {
    if ctx.store_path.exists() {
        return None;
    }
    let message = no_store(&ctx.store_path);
    tracing::info!(why = %message, "nothing to clean");
    Some(CleanReport {
        threshold_bytes,
        skipped: true,
        message: format!("{message}: nothing to clean"),
        ..CleanReport::default()
    })
}

/// The error for `id_or_path` when the store cannot be opened: a store that is missing
/// or was never initialised holds no image, so the answer is GrootFS's for an image that
/// is not there (or for a path outside the store); any other failure is the store's own.
pub fn not_found(ctx: &Ctx, id_or_path: &str, opening: StoreError) -> anyhow::Error {
    if !matches!(opening, StoreError::NotInitialised(_)) {
        return opening.into();
    }
    match id_of(&ctx.store_path, id_or_path) {
        Some(id) => StoreError::NotFound(id).into(),
        None => anyhow::anyhow!("path `{id_or_path}` is outside store path"),
    }
}

/// The ID `id_or_path` names in the store at `store`, found from the path alone (the store
/// need not exist); `None` for a path outside it.
fn id_of(store: &Path, id_or_path: &str) -> Option<String> {
    if !id_or_path.contains('/') {
        return Some(id_or_path.to_string());
    }
    let path = PathBuf::from(id_or_path);
    let path = match path.is_absolute() {
        true => path,
        false => std::env::current_dir().ok()?.join(path),
    };
    Layout::new(store).id_from_rootfs_path(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_path_alone() {
        let store = Path::new("/no/such/store");
        assert_eq!(id_of(store, "web-1").as_deref(), Some("web-1"));
        let rootfs = "/no/such/store/images/web-1/rootfs";
        assert_eq!(id_of(store, rootfs).as_deref(), Some("web-1"));
        assert_eq!(
            id_of(store, "/no/such/store/images/web-1").as_deref(),
            Some("web-1")
        );
        assert_eq!(id_of(store, "/path/to/random-id"), None);
    }
}
