//! A plain root filesystem tar (Garden's "preloaded" rootfs): one layer, identified by
//! the digest of its uncompressed content, with an empty config.

use std::fs::File;
use std::path::Path;

use crate::blobs::BlobLocation;
use crate::compression::decoder;
use crate::spec::RootFs;
use crate::tar_memo::{FileIdentity, TarMemo};
use crate::{Digest, HashingReader, Image, ImageConfig, ImageError, LayerBlob};

/// Resolves the tar at `path`, hashing at most `max_layer_bytes` of its uncompressed
/// content: past that it is refused as a decompression bomb, as the import would. A digest
/// `memo` remembers for the file as it is now is taken without reading the tar.
pub fn resolve(path: &Path, max_layer_bytes: u64, memo: &dyn TarMemo) -> Result<Image, ImageError> {
    resolve_at(path, max_layer_bytes, memo, std::time::SystemTime::now())
}

/// [`resolve`], judging whether the tar has settled against `now`.
fn resolve_at(
    path: &Path,
    max_layer_bytes: u64,
    memo: &dyn TarMemo,
    now: std::time::SystemTime,
) -> Result<Image, ImageError> {
    let fail = |e: std::io::Error| ImageError::new(format!("reading {}: {e}", path.display()));
    if !path.is_file() {
        return Err(ImageError::new(format!("{} is not a file", path.display())));
    }
    let file = File::open(path).map_err(fail)?;
    let identity = FileIdentity::of(&file).map_err(fail)?;
    let diff_id = match memo.recall(path, &identity) {
        Some(diff_id) => diff_id,
        None => {
            let hashed = file.try_clone().map_err(fail)?;
            let diff_id = hash(hashed, path, max_layer_bytes)?;
            // Remembered only for a file that did not change while it was hashed (its
            // descriptor and its path both still describe it; the path is not opened
            // again, so nothing swapped in there is read) and that was last written
            // long enough before (see `FileIdentity::settled`).
            let unchanged = FileIdentity::of(&file).is_ok_and(|now| now == identity)
                && std::fs::metadata(path).is_ok_and(|m| FileIdentity::from(&m) == identity);
            if unchanged && identity.settled(now) {
                memo.remember(path, &identity, &diff_id);
            }
            diff_id
        }
    };
    let config = ImageConfig {
        architecture: crate::Platform::host().architecture,
        os: "linux".into(),
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: vec![diff_id.clone()],
        },
        ..ImageConfig::default()
    };
    let config_digest =
        Digest::of(&serde_json::to_vec(&config).map_err(|e| ImageError::new(e.to_string()))?);
    Ok(Image {
        source: String::new(),
        config,
        config_digest,
        layers: vec![LayerBlob {
            index: 0,
            location: BlobLocation::File(path.to_path_buf()),
            digest: None,
            size: None,
            compression: None,
            diff_id,
            remote: None,
        }],
    })
}

/// One pass to learn the content digest, so a tar already in the store is not unpacked
/// again; the import pass verifies the same digest, catching a file changed in between.
/// This pass is bounded like the import: a few MB of zstd frames can decode to many GB of
/// zeros, and hashing them all would take minutes before any limit applied.
fn hash(file: File, path: &Path, max_layer_bytes: u64) -> Result<Digest, ImageError> {
    let what = format!("rootfs tar {}", path.display());
    let (diff_id, _) = HashingReader::with_limit(decoder(file, None, &what)?, max_layer_bytes)
        .finish()
        .map_err(|e| ImageError::new(format!("layer 0 ({what}): reading: {e}")))?;
    Ok(diff_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar_memo::{NoMemo, SETTLED};

    #[test]
    fn the_naming_pass_stops_at_the_layer_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rootfs.tar.zst");
        std::fs::write(&path, zstd::encode_all(&vec![0u8; 4 << 20][..], 3).unwrap()).unwrap();
        let err = resolve(&path, 1 << 20, &NoMemo).unwrap_err();
        assert!(
            err.message.contains("layer 0") && err.message.contains("limit of 1048576 bytes"),
            "{err}"
        );
        let image = resolve(&path, 4 << 20, &NoMemo).unwrap();
        assert_eq!(image.layers[0].diff_id, Digest::of(&vec![0u8; 4 << 20]));
    }

    /// Remembers in memory, counting what it was asked.
    #[derive(Default)]
    struct Remembered {
        kept: std::cell::RefCell<Option<(FileIdentity, Digest)>>,
        recalled: std::cell::Cell<usize>,
    }

    impl TarMemo for Remembered {
        fn recall(&self, _: &Path, identity: &FileIdentity) -> Option<Digest> {
            let kept = self.kept.borrow();
            let (kept_identity, digest) = kept.as_ref()?;
            (kept_identity == identity).then(|| {
                self.recalled.set(self.recalled.get() + 1);
                digest.clone()
            })
        }

        fn remember(&self, _: &Path, identity: &FileIdentity, diff_id: &Digest) {
            *self.kept.borrow_mut() = Some((identity.clone(), diff_id.clone()));
        }

        fn forget(&self, _: &Path) {
            *self.kept.borrow_mut() = None;
        }
    }

    #[test]
    fn a_remembered_digest_names_the_tar_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rootfs.tar");
        std::fs::write(&path, b"first content").unwrap();
        let memo = Remembered::default();
        let first = resolve_at(&path, u64::MAX, &memo, later()).unwrap().layers[0]
            .diff_id
            .clone();
        assert_eq!(first, Digest::of(b"first content"));
        assert_eq!(memo.recalled.get(), 0);
        // The memo is believed while the file is as it was: a planted digest proves the
        // tar was not read again.
        let planted = Digest::of(b"planted");
        memo.kept.borrow_mut().as_mut().unwrap().1 = planted.clone();
        assert_eq!(
            resolve_at(&path, u64::MAX, &memo, later()).unwrap().layers[0].diff_id,
            planted
        );
        assert_eq!(memo.recalled.get(), 1);
        // Same size, modification time put back: the change time still moves, so the tar
        // is hashed again and the new content named.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"other content").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
        let again = resolve_at(&path, u64::MAX, &memo, later()).unwrap().layers[0]
            .diff_id
            .clone();
        assert_eq!(again, Digest::of(b"other content"));
        assert_eq!(memo.recalled.get(), 1);
    }

    /// A moment long after any write the tests make: every tar has settled by then.
    fn later() -> std::time::SystemTime {
        std::time::SystemTime::now() + std::time::Duration::from_secs(60)
    }

    #[test]
    fn a_tar_written_just_now_is_hashed_every_time_not_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rootfs.tar");
        std::fs::write(&path, b"fresh").unwrap();
        let memo = Remembered::default();
        resolve(&path, u64::MAX, &memo).unwrap();
        assert!(
            memo.kept.borrow().is_none(),
            "a tar written within {SETTLED:?}"
        );
        resolve_at(&path, u64::MAX, &memo, later()).unwrap();
        assert!(memo.kept.borrow().is_some());
    }
}
