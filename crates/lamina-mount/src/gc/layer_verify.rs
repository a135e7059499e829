//! `lamina check --verify` for layer trees: every entry of every layer under `layers/`
//! read again against the list its import wrote (`lamina-store`'s `file_list`), each
//! entry changed, added or gone named with its layer. Reads every byte of every layer.

use std::path::PathBuf;

use lamina_store::file_list::{FILE_LIST, FileList};
use lamina_store::{LayerRecord, Store, StoreError};
use serde::Serialize;

use crate::fsutil::file_name;

/// What a verify of the layers covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LayersVerified {
    /// Layers whose every entry was read against their list.
    pub layers: usize,
    pub entries: usize,
    /// Layers without a list, so not verified: imported before lists were written,
    /// committed containerd snapshots, layers past the entries a list holds.
    pub unlisted_layers: usize,
}

/// A layer that is not what its import wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayerDamage {
    /// `bad_layer_file`, or `bad_file_list` for a list gone or unreadable.
    pub kind: &'static str,
    pub path: PathBuf,
    pub detail: String,
}

const WHAT_TO_DO: &str = "every container of an image with this layer reads it: delete them, `lamina clean`, and create them again";

/// Reads every listed layer against its list. Each layer is read under the layers lock
/// taken shared, as a create holds it, so no clean removes it meanwhile; a layer gone
/// before its turn is skipped. A layer `check` already reports as broken (no `diff/`, no
/// record) is left to that report.
pub(crate) fn verify(store: &Store) -> Result<(LayersVerified, Vec<LayerDamage>), StoreError> {
    let mut covered = LayersVerified::default();
    let mut damage = Vec::new();
    for layer in lamina_store::list_dirs(&store.layout().layers())? {
        let _in_use = store.use_layers()?;
        let diff = layer.join("diff");
        let Ok(record) = LayerRecord::read(&layer) else {
            continue;
        };
        if !diff.is_dir() {
            continue;
        }
        let chain = file_name(&layer);
        let mut bad = |kind: &'static str, path: PathBuf, what: String| {
            damage.push(LayerDamage {
                kind,
                path,
                detail: format!("layer {chain}: {what}"),
            });
        };
        if !record.file_list {
            // Imported before lists were written (or with an earlier list format), or a
            // committed containerd snapshot: nothing to read it against.
            covered.unlisted_layers += 1;
            continue;
        }
        let list = match FileList::read(&layer) {
            Ok(Some(list)) => list,
            Ok(None) => {
                bad(
                    "bad_file_list",
                    layer.join(FILE_LIST),
                    format!(
                        "the list of its entries its import wrote is gone, so nothing can show what changed; {WHAT_TO_DO}"
                    ),
                );
                continue;
            }
            Err(e) => {
                bad(
                    "bad_file_list",
                    layer.join(FILE_LIST),
                    format!("its list of entries cannot be read ({e}); {WHAT_TO_DO}"),
                );
                continue;
            }
        };
        let objects = store.layout().objects();
        let objects = record.objects.then_some(objects.as_path());
        match list.differences(&**store.host(), &diff, objects) {
            Ok(differences) => {
                covered.layers += 1;
                covered.entries += list.len();
                for difference in differences {
                    let path = difference.path().map_or(diff.clone(), |p| diff.join(p));
                    bad(
                        "bad_layer_file",
                        path,
                        format!("{difference}; {WHAT_TO_DO}"),
                    );
                }
            }
            // What cannot be read (EIO from a damaged disk) is damage, said with the rest.
            Err(e) => bad(
                "bad_layer_file",
                diff.clone(),
                format!("reading its tree failed: {e}; {WHAT_TO_DO}"),
            ),
        }
    }
    Ok((covered, damage))
}
