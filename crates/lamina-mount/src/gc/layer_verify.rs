//! `lamina check --verify` for layer trees: every file of every layer under `layers/`
//! hashed again against the list its import wrote (`lamina-store`'s `file_list`), each
//! file changed, added or gone named with its layer. Reads every byte of every layer.

use std::path::PathBuf;

use lamina_store::file_list::{Difference, FileList};
use lamina_store::{Store, StoreError};
use serde::Serialize;

use crate::fsutil::{entries, file_name};

/// What a verify of the layers covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LayersVerified {
    /// Layers whose every file was hashed against their list.
    pub layers: usize,
    pub files: usize,
    /// Layers without a list, so not verified: imported before lists were written,
    /// committed containerd snapshots, layers past the files a list holds.
    pub unlisted_layers: usize,
}

/// A layer that is not what its import wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayerDamage {
    /// `bad_layer_file`, or `bad_file_list` for a list that cannot be read.
    pub kind: &'static str,
    pub path: PathBuf,
    pub detail: String,
}

/// Hashes every listed layer's files against its list.
pub(crate) fn verify(store: &Store) -> Result<(LayersVerified, Vec<LayerDamage>), StoreError> {
    let mut covered = LayersVerified::default();
    let mut damage = Vec::new();
    for layer in entries(&store.layout().layers())? {
        let chain = file_name(&layer);
        let diff = layer.join("diff");
        let list = match FileList::read(&layer) {
            Ok(Some(list)) => list,
            Ok(None) => {
                covered.unlisted_layers += 1;
                continue;
            }
            Err(e) => {
                damage.push(LayerDamage {
                    kind: "bad_file_list",
                    path: layer.join(lamina_store::file_list::FILE_LIST),
                    detail: format!("layer {chain}: its file list cannot be read: {e}"),
                });
                continue;
            }
        };
        let differences = list
            .differences(&diff)
            .map_err(StoreError::io("verifying", &diff))?;
        covered.layers += 1;
        covered.files += list.len();
        for difference in differences {
            let path = match &difference {
                Difference::Changed(p) | Difference::Added(p) | Difference::Gone(p) => diff.join(p),
                Difference::Unwalked => diff.clone(),
            };
            damage.push(LayerDamage {
                kind: "bad_layer_file",
                path,
                detail: format!(
                    "layer {chain}: {difference}; every container of an image with this layer reads it: delete them, `lamina clean`, and create them again"
                ),
            });
        }
    }
    Ok((covered, damage))
}
