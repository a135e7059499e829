//! What one import knows of the layers below each layer it imports: their manifests
//! (`file_objects::MANIFEST`), which say what a layer may link its files to. An import
//! unpacks up to three layers at once, so a layer's manifest is asked for only once every
//! layer below it in the image is in the store or has failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use lamina_image::Digest;

use crate::Layout;
use crate::file_objects::{Digests, read_manifest};

/// The layers of one image being imported, bottom-most first, and which of them are
/// settled: in the store already, imported, or failed.
pub(crate) struct LayersBelow<'a> {
    layout: &'a Layout,
    chain_ids: &'a [Digest],
    settled: Mutex<Vec<bool>>,
    changed: Condvar,
    /// Manifests read so far, by index (`None`: the layer has none).
    manifests: Mutex<HashMap<usize, Option<Arc<Digests>>>>,
}

impl<'a> LayersBelow<'a> {
    /// The layers `chain_ids` of an image, of which those at `importing` are still to be
    /// imported by this import.
    pub(crate) fn new(
        layout: &'a Layout,
        chain_ids: &'a [Digest],
        importing: impl Iterator<Item = usize>,
    ) -> Self {
        let mut settled = vec![true; chain_ids.len()];
        for index in importing {
            settled[index] = false;
        }
        LayersBelow {
            layout,
            chain_ids,
            settled: Mutex::new(settled),
            changed: Condvar::new(),
            manifests: Mutex::new(HashMap::new()),
        }
    }

    /// A guard that marks layer `index` settled when dropped, however its import ended
    /// (a panic included), so that no layer above waits for it for ever.
    pub(crate) fn settle_on_drop(&self, index: usize) -> Settle<'_, 'a> {
        Settle { below: self, index }
    }

    /// The manifests of every layer below layer `index`, once each is settled; `None` when
    /// one has none (or is not in the store: its import failed), or when `failed` says
    /// the import is being given up.
    pub(crate) fn manifests(&self, index: usize, failed: &AtomicBool) -> Option<Vec<Arc<Digests>>> {
        self.wait_below(index, failed)?;
        let mut cache = self
            .manifests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (0..index)
            .map(|i| {
                cache
                    .entry(i)
                    .or_insert_with(|| {
                        read_manifest(&self.layout.layer(&self.chain_ids[i])).map(Arc::new)
                    })
                    .clone()
            })
            .collect()
    }
}

impl LayersBelow<'_> {
    /// Waits until every layer below layer `index` is settled; `None` when `failed` says
    /// the import is being given up.
    fn wait_below(&self, index: usize, failed: &AtomicBool) -> Option<()> {
        let mut settled = self.settled.lock().unwrap_or_else(PoisonError::into_inner);
        while !settled[..index].iter().all(|&s| s) {
            if failed.load(Ordering::Relaxed) {
                return None;
            }
            // Woken by every settle; the timeout only rechecks `failed`.
            settled = self
                .changed
                .wait_timeout(settled, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Some(())
    }

    /// The directories of every layer below layer `index`, once each is settled; `None`
    /// when one is not in the store (its import failed) or the import is being given up.
    pub(crate) fn dirs(
        &self,
        index: usize,
        failed: &AtomicBool,
    ) -> Option<Vec<std::path::PathBuf>> {
        self.wait_below(index, failed)?;
        self.chain_ids[..index]
            .iter()
            .map(|c| self.layout.layer(c))
            .map(|dir| dir.is_dir().then_some(dir))
            .collect()
    }
}

/// Marks its layer settled when dropped.
pub(crate) struct Settle<'b, 'a> {
    below: &'b LayersBelow<'a>,
    index: usize,
}

impl Drop for Settle<'_, '_> {
    fn drop(&mut self) {
        let mut settled = self
            .below
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        settled[self.index] = true;
        self.below.changed.notify_all();
    }
}
