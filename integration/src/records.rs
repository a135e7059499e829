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
