//! What a container's record says of its rootfs, read the way lamina reads it (old and
//! new record forms alike), for tests that check what a create chose.

use std::path::Path;

/// Container `id`'s rootfs as `{"strategy", "read_only", "mounted", "mount_options",
/// "upper_fs"}`.
pub fn rootfs_of(store: &Path, id: &str) -> serde_json::Value {
    let store = lamina_store::Store::open(store).expect("opening the store");
    let container = lamina_mount::record::read(&store, id).expect("reading the record");
    let model = container.model();
    serde_json::json!({
        "strategy": model.to_string(),
        "read_only": model.read_only(),
        "mounted": container.rootfs.mounted,
        "mount_options": container.rootfs.mount_options,
        "upper_fs": container.rootfs.upper_fs,
    })
}

/// The bytes of the record file at `path`: a first record is a symlink whose target is
/// the record (on ext4 and xfs), later ones a regular file. Panics if there is none.
pub fn record_bytes(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStringExt;
    match std::fs::read_link(path) {
        Ok(target) => target.into_os_string().into_vec(),
        Err(_) => std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    }
}

/// The record at `path` as JSON.
pub fn record_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&record_bytes(path)).expect("a record")
}

/// Whether a record is at `path` (a symlink record's target names no file: `exists`
/// would say no).
pub fn record_exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Replaces the record at `path` with a regular file holding `bytes` (writing through a
/// symlink record would make a file its target names).
pub fn overwrite_record(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
