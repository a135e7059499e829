//! Watching an import as it runs. The store reports each layer's life — already there,
//! started, bytes read, finished — and a front-end turns that into what its user needs:
//! a progress bar on a terminal, log lines for a supervisor (see `lamina-cli`).

use std::io::{self, Read};
use std::sync::Arc;

use lamina_image::LayerBlob;

/// Told about every layer an import looks at. Methods are called from the import's
/// worker threads, several layers at once; each does nothing unless overridden.
pub trait ImportProgress: Send + Sync + std::fmt::Debug {
    /// `layer` is already in the store: nothing is fetched.
    fn present(&self, _layer: &LayerBlob) {}
    /// `layer` is being fetched and unpacked.
    fn started(&self, _layer: &LayerBlob) {}
    /// `bytes` more of `layer`'s blob (as stored, usually compressed) were read.
    fn advanced(&self, _layer: &LayerBlob, _bytes: u64) {}
    /// `layer` is in the store (`ok`), or its import failed.
    fn finished(&self, _layer: &LayerBlob, _ok: bool) {}
}

/// Reports nothing: what a store without a watcher uses.
#[derive(Debug)]
pub struct Silent;

impl ImportProgress for Silent {}

/// A blob stream that reports every read to `progress`, and stops once `cancelled` is
/// set: another layer of the same image failed, so this one's download is wasted.
pub(crate) struct Reported<'a, R> {
    pub inner: R,
    pub layer: &'a LayerBlob,
    pub progress: &'a Arc<dyn ImportProgress>,
    pub cancelled: &'a std::sync::atomic::AtomicBool,
}

impl<R: Read> Read for Reported<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancelled.load(std::sync::atomic::Ordering::Relaxed) {
            // Not `Interrupted`: readers retry that kind for ever.
            return Err(io::Error::other(
                "cancelled: another layer of this image failed",
            ));
        }
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.progress.advanced(self.layer, n as u64);
        }
        Ok(n)
    }
}
