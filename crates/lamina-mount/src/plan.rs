//! Mount plans: which overlay a container gets. `classic` is GrootFS's fresh read-write
//! overlay per container, the baseline every other strategy is measured against; the
//! option strategies add overlay options to it.

use lamina_image::Digest;
use lamina_store::{ContainerDirs, Store};
use lamina_sys::OverlaySpec;

use crate::Strategies;

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

/// The classic plan with the options `strategies` add.
pub fn read_write(
    store: &Store,
    chain_ids: &[Digest],
    dirs: &ContainerDirs,
    strategies: Strategies,
) -> OverlaySpec {
    let mut spec = classic(store, chain_ids, dirs);
    spec.options = strategies.overlay_options();
    spec
}
