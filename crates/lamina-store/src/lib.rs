//! lamina's on-disk store: verified layers keyed by OCI chain ID (so images share
//! layers), and one directory per container at Garden's `<store>/images/<ID>`.
//!
//! The store never mounts anything; `lamina-mount` decides how a container's layers
//! become its rootfs. Invariants (see docs/store.md): a directory under `layers/` is a
//! complete, verified layer; a container is listed once its `container.json` exists;
//! everything under `tmp/` is unfinished work that may be removed.

pub mod beneath;
mod container;
mod container_lock;
mod durable;
mod error;
mod file_caps;
pub mod file_list;
pub mod file_objects;
mod import;
mod layer_links;
mod layers_below;
mod layout;
mod lock_holders;
mod locks;
pub mod object_layers;
mod pause;
mod permissions;
pub mod progress;
mod properties;
mod record_paths;
mod regular_file;
mod remove_tree;
mod shift;
mod tar_memo;
mod usage;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use lamina_sys::{HostFs, RealHost};

/// The lock file in every container directory.
pub use container::LOCK as LOCK_FILE;
pub use container::list_dirs;
pub use container::{BadRecord, ContainerScan};
pub use container::{
    ContainerClaim, ContainerDirs, ContainerRecord, DirLock, DiskLimitRecord, STAGING_PREFIX,
    printable, unique_suffix, validate_id, validate_new_id,
};
pub use container_lock::IdLock;
pub use durable::{sync_dir, write_durably};
pub use error::StoreError;
pub use import::LayerRecord;
pub use layout::{Layout, MARKER, STORE_VERSION};
pub use locks::{DEFAULT_LOCK_TIMEOUT, Flocked, StoreLock};
pub use permissions::{create_private_dir, use_fixed_umask};
pub use progress::ImportProgress;
pub use properties::{IdMap, IdMapping, StoreProperties};
pub use record_paths::MAX_RECORD_BYTES;
pub use regular_file::{
    open_regular_file, open_regular_file_to_append, read_regular_file, read_regular_file_at_most,
    read_regular_to_string, refuse_non_regular,
};
pub use remove_tree::remove_tree;
pub use usage::{ContainerUsage, disk_usage, disk_usage_and_inodes};

/// Default per-layer cap on uncompressed bytes: a decompression bomb stops here.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 64 * 1024 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Store {
    layout: Layout,
    max_layer_bytes: u64,
    properties: StoreProperties,
    progress: std::sync::Arc<dyn ImportProgress>,
    /// The longest any wait for a store lock lasts ([`Store::with_lock_timeout`]).
    lock_timeout: std::time::Duration,
    /// Where ownership, xattr, device-node and durable-write calls go: the kernel, or a
    /// test's fake ([`Store::init_hosted`]).
    host: Arc<dyn HostFs>,
    /// [`Store::symlink_records`].
    symlink_records: bool,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    version: u32,
    #[serde(flatten)]
    properties: StoreProperties,
}

impl Store {
    /// Creates the store's directories (idempotent). Refuses a non-empty directory that
    /// is not already a lamina store, so a typo never scribbles into someone's data.
    pub fn init(root: &Path) -> Result<Store, StoreError> {
        Store::init_with(root, &StoreProperties::default())
    }

    /// [`Store::init`] with properties the store keeps for life. Initialising an existing
    /// store again is fine with the same properties and refused with others: its layers
    /// were made for the recorded ones.
    pub fn init_with(root: &Path, properties: &StoreProperties) -> Result<Store, StoreError> {
        Store::init_hosted(root, properties, Arc::new(RealHost))
    }

    /// [`Store::init_with`] making its ownership, metadata and durable-write calls
    /// through `host` (for the rest of the store's life, too): tests pass the fake.
    pub fn init_hosted(
        root: &Path,
        properties: &StoreProperties,
        host: Arc<dyn HostFs>,
    ) -> Result<Store, StoreError> {
        properties
            .validate()
            .map_err(|why| StoreError::Properties {
                store: root.to_path_buf(),
                why,
            })?;
        let layout = Layout::new(root);
        if layout.marker().exists() {
            let store = Store::open_hosted(root, host)?;
            if store.properties != *properties {
                return Err(StoreError::Properties {
                    store: root.to_path_buf(),
                    why: format!(
                        "it was initialised with {}; asked for {}",
                        describe(&store.properties),
                        describe(properties)
                    ),
                });
            }
            return Ok(store);
        }
        if !layout.marker().exists() && root.is_dir() {
            let mut entries = fs::read_dir(root).map_err(StoreError::io("reading", root))?;
            if entries.next().is_some() {
                return Err(StoreError::NotAStore(root.to_path_buf()));
            }
        }
        permissions::secure_store(&layout, properties, &*host, permissions::Root::Make)?;
        if !layout.marker().exists() {
            let version = if properties.layer_data_in_objects {
                layout::OBJECT_LAYERS_VERSION
            } else if properties.shared_file_content {
                layout::SHARING_SYMLINK_RECORDS_VERSION
            } else {
                layout::SYMLINK_RECORDS_VERSION
            };
            let marker = serde_json::to_vec(&Marker {
                version,
                properties: properties.clone(),
            })
            .map_err(|e| StoreError::io("encoding", root)(e.into()))?;
            // Durable: a torn marker would make the store look like it is not one.
            durable::write_durably_with(&*host, &layout.marker(), &marker)?;
        }
        Store::open_hosted(root, host)
    }

    /// Opens an initialised store.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        Store::open_hosted(root, Arc::new(RealHost))
    }

    /// [`Store::open`] with the calls [`Store::init_hosted`] describes going to `host`.
    pub fn open_hosted(root: &Path, host: Arc<dyn HostFs>) -> Result<Store, StoreError> {
        let layout = Layout::new(root);
        let bytes = match read_regular_file(&layout.marker()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotInitialised(root.to_path_buf()));
            }
            Err(e) => return Err(StoreError::io("reading", &layout.marker())(e)),
        };
        let marker: Marker = serde_json::from_slice(&bytes)
            .map_err(|_| StoreError::NotAStore(root.to_path_buf()))?;
        let (sharing, symlink_records, object_layers) = match marker.version {
            STORE_VERSION => (false, false, false),
            layout::SHARING_STORE_VERSION => (true, false, false),
            layout::SYMLINK_RECORDS_VERSION => (false, true, false),
            layout::SHARING_SYMLINK_RECORDS_VERSION => (true, true, false),
            layout::OBJECT_LAYERS_VERSION => (false, true, true),
            _ => return Err(StoreError::NotAStore(root.to_path_buf())),
        };
        if sharing != marker.properties.shared_file_content
            || object_layers != marker.properties.layer_data_in_objects
        {
            return Err(StoreError::NotAStore(root.to_path_buf()));
        }
        // Stores made by an older lamina lack the newer directories, and were made with
        // the umask's modes: both are put right on every open.
        permissions::secure_store(
            &layout,
            &marker.properties,
            &*host,
            permissions::Root::Existing,
        )?;
        Ok(Store {
            host,
            layout,
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
            properties: marker.properties,
            progress: std::sync::Arc::new(progress::Silent),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            symlink_records,
        })
    }

    /// Whether a first container record may be a symlink here: only in stores made by a
    /// lamina that reads them, whose version older ones refuse.
    pub fn symlink_records(&self) -> bool {
        self.symlink_records
    }

    pub fn with_max_layer_bytes(mut self, max: u64) -> Self {
        self.max_layer_bytes = max;
        self
    }

    /// Reports every import this store runs (including a create's) to `progress`.
    pub fn with_import_progress(mut self, progress: std::sync::Arc<dyn ImportProgress>) -> Self {
        self.progress = progress;
        self
    }

    /// Where this store's ownership, metadata and durable-write calls go.
    pub fn host(&self) -> &Arc<dyn HostFs> {
        &self.host
    }

    /// [`write_durably`] through this store's host, so a test can fail its write or
    /// fsync.
    pub fn write_durably(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        durable::write_durably_with(&*self.host, path, bytes)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn root(&self) -> &Path {
        self.layout.root()
    }

    pub fn properties(&self) -> &StoreProperties {
        &self.properties
    }
}

/// Properties as an operator typed them, for an error message.
fn describe(p: &StoreProperties) -> String {
    let list = |m: &[IdMapping]| {
        m.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut parts = Vec::new();
    if !p.id_map.is_empty() {
        parts.push(format!("uid mappings [{}]", list(&p.id_map.uids)));
        parts.push(format!("gid mappings [{}]", list(&p.id_map.gids)));
    }
    if p.chowns_layers() {
        parts.push("chowned layers".into());
    }
    if let Some(size) = p.store_size_bytes {
        parts.push(format!("store size {size} bytes"));
    }
    if p.shared_file_content {
        parts.push("file content shared".into());
    }
    if p.layer_data_in_objects {
        parts.push("layer data in objects".into());
    }
    if parts.is_empty() {
        "no mappings, no size and no shared file content".into()
    } else {
        parts.join(", ")
    }
}
