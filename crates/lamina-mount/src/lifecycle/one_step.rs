//! Every lifecycle step on one container ID (create, delete, mount, unmount) runs while
//! holding the ID (see `lamina-store`'s `container_lock.rs`): a step that arrives during
//! another waits for it, so none meets a half-made or half-gone container.

use lamina_store::Store;

use crate::RootfsError;

/// Runs `step` on container `id` holding the ID; removes the ID's lock file afterwards
/// if the container does not exist (deleted, or never made). An invalid ID is refused
/// before anything is locked or touched (`lock_id` validates it).
pub(crate) fn holding_id<T>(
    store: &Store,
    id: &str,
    step: impl FnOnce() -> Result<T, RootfsError>,
) -> Result<T, RootfsError> {
    let held = store.lock_id(id)?;
    let result = step();
    if !store.container_exists(id) {
        held.release_gone();
    }
    result
}
