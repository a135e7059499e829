//! Small filesystem helpers every part of lamina-mount uses: a leaf, importing nothing
//! of this crate.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use lamina_store::StoreError;

/// The paths in `dir`; none when it does not exist (a store from before composefs).
pub(crate) fn entries(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    match fs::read_dir(dir) {
        Ok(list) => list
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<_>>()
            .map_err(StoreError::io("listing", dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("listing", dir)(e)),
    }
}

/// The last component of `path`, lossily as text (empty when it has none).
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Where overlay marks a volatile mount's work dir; its presence refuses a remount.
pub(crate) fn volatile_marker(work: &std::path::Path) -> std::path::PathBuf {
    work.join("work").join("incompat").join("volatile")
}
