//! Making a store: whether a uid-mapped store idmaps its layers at mount time or chowns
//! them at import is decided here, once, from what overlay on this kernel and filesystem
//! can do — and kept by the store for good, since its layers are made that way.

use std::path::Path;

use lamina_store::{Store, StoreError, StoreProperties};

use crate::{RootfsError, choose::probe, lowers::plan};

/// Makes (or opens) the store at `path` with `properties`. A mapped store that was not
/// told to chown its layers keeps an existing store's choice, or idmaps where a probe
/// shows overlay can, and chowns at import where it cannot.
pub fn init_store(path: &Path, mut properties: StoreProperties) -> Result<Store, RootfsError> {
    if properties.mapped() && !properties.chowned_layers {
        properties.chowned_layers = match Store::open(path) {
            Ok(existing) => existing.properties().chowned_layers,
            Err(_) => {
                std::fs::create_dir_all(path).map_err(StoreError::io("creating", path))?;
                let maps = plan::userns_maps(&properties.id_map);
                let idmaps = probe::idmapped_layers_on(path, &maps);
                if !idmaps {
                    tracing::warn!("overlay cannot idmap layers here: chowning layers at import");
                }
                !idmaps
            }
        };
    }
    Ok(Store::init_with(path, &properties)?)
}
