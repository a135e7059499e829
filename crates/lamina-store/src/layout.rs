//! Where everything lives in a store. See docs/store.md for the picture and the rules.

use std::path::{Path, PathBuf};

use lamina_image::Digest;

/// The marker file whose presence (and version) makes a directory a lamina store.
pub const MARKER: &str = "lamina-store.json";
pub const STORE_VERSION: u32 = 1;

/// The marker version of a store that shares file content (`shared_file_content`): a
/// lamina from before sharing refuses it ("not a lamina store") instead of opening it and
/// making objects of committed snapshots' inodes, which this store's imports would then
/// link into verified layers (after a rollback and roll forward).
pub const SHARING_STORE_VERSION: u32 = 2;

/// The marker versions ([`STORE_VERSION`] and [`SHARING_STORE_VERSION`] otherwise alike)
/// of a store whose first container records may be symlinks with the record for target
/// (docs/store.md, "Durability of records"): a lamina from before reads such a record as
/// damage, and one older still would take a containerd snapshot's container for lost and
/// make it again empty, so it refuses the store ("not a lamina store") instead. Stores
/// made by a lamina from before keep their version, and their records regular files.
pub const SYMLINK_RECORDS_VERSION: u32 = 3;
pub const SHARING_SYMLINK_RECORDS_VERSION: u32 = 4;

/// The marker version of a store whose layers keep their data in `objects/`
/// (`layer_data_in_objects`; symlink records too): a lamina from before would mount its
/// layers' stubs without the data-only lower and show files of zeros, so it refuses the
/// store ("not a lamina store") instead.
pub const OBJECT_LAYERS_VERSION: u32 = 5;

#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn marker(&self) -> PathBuf {
        self.root.join(MARKER)
    }

    pub fn layers(&self) -> PathBuf {
        self.root.join("layers")
    }

    /// A complete layer: only ever created by renaming a finished unpack into place.
    pub fn layer(&self, chain_id: &Digest) -> PathBuf {
        self.layers().join(chain_id.hex())
    }

    /// The unpacked tree overlay uses as a lower dir.
    pub fn layer_diff(&self, chain_id: &Digest) -> PathBuf {
        self.layer(chain_id).join("diff")
    }

    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Garden's rootfs path convention: `<store>/images/<ID>/rootfs`.
    pub fn container(&self, id: &str) -> PathBuf {
        self.images().join(id)
    }

    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Containers deleted from `images/` whose teardown (unmount, removal) is not done:
    /// the reaper's queue, and what a crash mid-delete leaves.
    pub fn trash(&self) -> PathBuf {
        self.root.join("trash")
    }

    /// One read-only overlay per image, bound read-only into shared-ro containers.
    pub fn shared(&self) -> PathBuf {
        self.root.join("shared")
    }

    /// Flattened read-only trees (hardlinks into the layers), one per multi-layer image,
    /// bound read-only into direct containers.
    pub fn flat(&self) -> PathBuf {
        self.root.join("flat")
    }

    /// composefs: file contents, each stored once, named by fs-verity digest
    /// (`ab/cdef…`); the data-only lower of every composefs overlay.
    pub fn objects(&self) -> PathBuf {
        self.root.join("objects")
    }

    /// composefs: one EROFS metadata image per image, `<top-chain-id>.erofs`.
    pub fn composefs(&self) -> PathBuf {
        self.root.join("composefs")
    }

    /// Pre-mounted read-write overlays waiting to be claimed by `create`.
    pub fn pool(&self) -> PathBuf {
        self.root.join("pool")
    }

    /// containerd snapshots' metadata (see the `lamina-snapshot-index` crate).
    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// The snapshot metadata of releases before the database; migrated on first open.
    pub fn snapshot_metadata(&self) -> PathBuf {
        self.snapshots().join("metadata.json")
    }

    /// The snapshot metadata (see the `lamina-snapshot-index` crate).
    pub fn snapshot_db(&self) -> PathBuf {
        self.snapshots().join("metadata.db")
    }

    /// Short symlinks to layer trees, for overlays mounted from one option string (see
    /// `layer_links.rs`).
    pub fn links(&self) -> PathBuf {
        self.root.join("l")
    }

    /// Per-boot state, such as the probe cache.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }

    /// A named flock file under `locks/`.
    pub fn lock(&self, name: &str) -> PathBuf {
        self.locks().join(format!("{name}.lock"))
    }

    pub fn locks(&self) -> PathBuf {
        self.root.join("locks")
    }

    pub fn layer_lock(&self, chain_id: &Digest) -> PathBuf {
        self.locks().join(format!("layer-{}.lock", chain_id.hex()))
    }

    /// The ID of the container whose rootfs is `path`, if `path` is one in this store.
    pub fn id_from_rootfs_path(&self, path: &Path) -> Option<String> {
        let rel = path.strip_prefix(self.images()).ok()?;
        let mut parts = rel.components();
        let id = parts.next()?.as_os_str().to_str()?.to_string();
        match (parts.next(), parts.next()) {
            (Some(c), None) if c.as_os_str() == "rootfs" => Some(id),
            (None, None) => Some(id),
            _ => None,
        }
    }
}
