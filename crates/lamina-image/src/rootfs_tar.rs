//! A plain root filesystem tar (Garden's "preloaded" rootfs): one layer, identified by
//! the digest of its uncompressed content, with an empty config.

use std::fs::File;
use std::path::Path;

use crate::blobs::BlobLocation;
use crate::compression::decoder;
use crate::spec::RootFs;
use crate::{Digest, HashingReader, Image, ImageConfig, ImageError, LayerBlob};

/// Resolves the tar at `path`, hashing at most `max_layer_bytes` of its uncompressed
/// content: past that it is refused as a decompression bomb, as the import would.
pub fn resolve(path: &Path, max_layer_bytes: u64) -> Result<Image, ImageError> {
    let fail = |e: std::io::Error| ImageError::new(format!("reading {}: {e}", path.display()));
    if !path.is_file() {
        return Err(ImageError::new(format!("{} is not a file", path.display())));
    }
    let file = File::open(path).map_err(fail)?;
    let what = format!("rootfs tar {}", path.display());
    // One pass to learn the content digest, so a tar already in the store is not unpacked
    // again; the import pass verifies the same digest, catching a file changed in between.
    // This pass is bounded like the import: a few MB of zstd frames can decode to many
    // GB of zeros, and hashing them all would take minutes before any limit applied.
    let (diff_id, _) = HashingReader::with_limit(decoder(file, None, &what)?, max_layer_bytes)
        .finish()
        .map_err(|e| ImageError::new(format!("layer 0 ({what}): reading: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_naming_pass_stops_at_the_layer_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rootfs.tar.zst");
        std::fs::write(&path, zstd::encode_all(&vec![0u8; 4 << 20][..], 3).unwrap()).unwrap();
        let err = resolve(&path, 1 << 20).unwrap_err();
        assert!(
            err.message.contains("layer 0") && err.message.contains("limit of 1048576 bytes"),
            "{err}"
        );
        let image = resolve(&path, 4 << 20).unwrap();
        assert_eq!(image.layers[0].diff_id, Digest::of(&vec![0u8; 4 << 20]));
    }
}
