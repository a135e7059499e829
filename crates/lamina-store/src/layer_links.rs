//! Short names for layers, for callers that mount an overlay from one option string
//! (containerd, through the snapshotter's `Mounts`). mount(2) takes one page of options,
//! and `<store>/layers/<64 hex>/diff` per layer fills it at about 50 layers. `l/<name>` is
//! a symlink to `../layers/<hex>/diff`, named by the first 8 hex digits of the chain ID
//! (more where two layers share them). containerd, finding every lowerdir in one
//! directory, mounts from inside it with the bare names (its `compactLowerdirOption`), so
//! a layer costs 9 bytes of the page and about 400 layers fit.
//!
//! A link is made when a caller asks for it and removed by `clean` once its layer is
//! gone; a link to a layer that exists is never removed, so one handed out stays valid as
//! long as the snapshot that uses its layer.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use lamina_image::Digest;

use crate::{Store, StoreError};

/// Hex digits a link name starts with, and how many more each clash adds.
const SHORTEST: usize = 8;
const STEP: usize = 4;

impl Store {
    /// The short path of layer `chain_id`'s tree (`l/<name>`), made if missing.
    pub fn layer_link(&self, chain_id: &Digest) -> Result<PathBuf, StoreError> {
        self.find_layer_link(chain_id, true)?
            .ok_or_else(|| StoreError::NotFound(format!("the short link of layer {chain_id}")))
    }

    /// [`Store::layer_link`] if it is made, `None` if not: for a caller that holds
    /// neither the container nor the layers (a kept Mounts answer, checked).
    pub fn made_layer_link(&self, chain_id: &Digest) -> Result<Option<PathBuf>, StoreError> {
        self.find_layer_link(chain_id, false)
    }

    fn find_layer_link(
        &self,
        chain_id: &Digest,
        make: bool,
    ) -> Result<Option<PathBuf>, StoreError> {
        let links = self.layout().links();
        let target = Path::new("..")
            .join("layers")
            .join(chain_id.hex())
            .join("diff");
        let hex = chain_id.hex();
        let mut len = SHORTEST;
        // A name seen missing and then taken is read again, a few times at most: only
        // something making and removing it over and over keeps that up.
        let mut races = 0;
        loop {
            let link = links.join(&hex[..len]);
            // Read first: the link is there for every layer after its first use.
            match fs::read_link(&link) {
                Ok(found) if found == target => return Ok(Some(link)),
                // Another layer's link, or anything else: a longer name.
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::InvalidInput => {}
                Err(e) if e.kind() == ErrorKind::NotFound && !make => return Ok(None),
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    match std::os::unix::fs::symlink(&target, &link) {
                        Ok(()) => return Ok(Some(link)),
                        // Made meanwhile: read it again.
                        Err(e) if e.kind() == ErrorKind::AlreadyExists && races < 3 => {
                            races += 1;
                            continue;
                        }
                        Err(e) => return Err(StoreError::io("linking", &link)(e)),
                    }
                }
                Err(e) => return Err(StoreError::io("linking", &link)(e)),
            }
            if len == hex.len() {
                return Err(StoreError::io("linking", &link)(std::io::Error::other(
                    "the name is taken by something that is not this layer's link",
                )));
            }
            len = (len + STEP).min(hex.len());
        }
    }

    /// The path a caller mounting `lower` itself should be given: the layer's short link
    /// for a layer's tree, anything else as it is.
    pub fn short_lower(&self, lower: &Path) -> Result<PathBuf, StoreError> {
        let layer = lower
            .strip_prefix(self.layout().layers())
            .ok()
            .filter(|rest| rest.components().count() == 2 && rest.ends_with("diff"))
            .and_then(|rest| rest.components().next())
            .and_then(|hex| Digest::from_hex(&hex.as_os_str().to_string_lossy()));
        match layer {
            Some(chain_id) if self.layout().layer_diff(&chain_id) == lower => {
                self.layer_link(&chain_id)
            }
            _ => Ok(lower.to_path_buf()),
        }
    }

    /// Removes the links whose layer is gone. Run by layer collection, under its
    /// exclusive lock.
    pub fn sweep_layer_links(&self) -> Result<usize, StoreError> {
        let links = self.layout().links();
        let entries = match fs::read_dir(&links) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::io("listing", &links)(e)),
        };
        let mut removed = 0;
        for entry in entries {
            let link = entry.map_err(StoreError::io("listing", &links))?.path();
            // `exists` follows the link: false for a dangling one (and for anything that
            // is not a link to a directory lamina made).
            if link.exists() {
                continue;
            }
            match fs::remove_file(&link) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("removing", &link)(e)),
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_gets_a_short_link_that_resolves_to_its_tree_and_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        let a = Digest::of(b"a");
        fs::create_dir_all(store.layout().layer_diff(&a)).unwrap();
        fs::write(store.layout().layer_diff(&a).join("f"), b"a").unwrap();

        let link = store.layer_link(&a).unwrap();
        assert_eq!(link.file_name().unwrap().len(), SHORTEST);
        assert_eq!(fs::read(link.join("f")).unwrap(), b"a");
        assert_eq!(
            store.layer_link(&a).unwrap(),
            link,
            "asked again, the same link"
        );
        assert_eq!(
            store.short_lower(&store.layout().layer_diff(&a)).unwrap(),
            link
        );
        let other = dir.path().join("elsewhere");
        assert_eq!(store.short_lower(&other).unwrap(), other);

        assert_eq!(store.sweep_layer_links().unwrap(), 0, "its layer is there");
        fs::remove_dir_all(store.layout().layer(&a)).unwrap();
        assert_eq!(store.sweep_layer_links().unwrap(), 1);
        assert!(fs::symlink_metadata(&link).is_err());
    }

    /// Chain IDs are hashes of what an image ships, so a hostile image can be made to
    /// share its first hex digits with another layer: it gets a longer name, never the
    /// other layer's link.
    #[test]
    fn a_layer_whose_prefix_is_taken_gets_a_longer_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        let a = Digest::of(b"a");
        fs::create_dir_all(store.layout().links()).unwrap();
        let squatter = store.layout().links().join(&a.hex()[..SHORTEST]);
        std::os::unix::fs::symlink("../layers/someone-else/diff", &squatter).unwrap();

        let link = store.layer_link(&a).unwrap();
        assert_eq!(link.file_name().unwrap().len(), SHORTEST + STEP);
        assert_eq!(
            fs::read_link(&link).unwrap(),
            Path::new("../layers").join(a.hex()).join("diff")
        );
    }
}
