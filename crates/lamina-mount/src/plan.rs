//! Mount plans: which overlay a container gets. Today that is `classic` — GrootFS's
//! fresh read-write overlay per container, the baseline every other strategy is
//! measured against.

use lamina_image::Digest;
use lamina_store::{ContainerDirs, Store};
use lamina_sys::OverlaySpec;

/// The classic plan: every layer as a lower (top-most first, as overlay orders them),
/// the container's own upper and work dirs.
pub fn classic(store: &Store, chain_ids: &[Digest], dirs: &ContainerDirs) -> OverlaySpec {
    OverlaySpec {
        lowers: chain_ids
            .iter()
            .rev()
            .map(|c| store.layout().layer_diff(c))
            .collect(),
        upper: Some(dirs.upper.clone()),
        work: Some(dirs.work.clone()),
        options: Vec::new(),
        read_only: false,
    }
}
