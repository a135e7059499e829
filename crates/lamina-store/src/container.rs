//! Container directories and records. `mkdir images/<ID>` is the atomic claim of an ID;
//! `container.json`, written last by rename, is what makes a container listed.

use std::fs;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use serde::{Deserialize, Serialize};

use crate::{Store, StoreError};

const RECORD: &str = "container.json";

/// What the store remembers about a container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerRecord {
    pub id: String,
    /// The image reference it was created from.
    pub image: String,
    /// The image config digest.
    pub image_id: Digest,
    /// Chain IDs of its layers, bottom-most first.
    pub layers: Vec<Digest>,
    pub env: Vec<String>,
    /// How the rootfs is provided (`classic` for a fresh overlay).
    pub strategy: String,
    /// Whether lamina mounted the rootfs (false with `--without-mount`).
    pub mounted: bool,
    /// Overlay options the rootfs is (or is to be) mounted with.
    pub mount_options: Vec<String>,
    pub created_unix: u64,
}

/// The directories of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDirs {
    pub base: PathBuf,
    pub rootfs: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl ContainerDirs {
    pub fn under(base: PathBuf) -> Self {
        Self {
            rootfs: base.join("rootfs"),
            upper: base.join("upper"),
            work: base.join("work"),
            base,
        }
    }
}

/// IDs become directory names and appear in Garden's paths.
pub fn validate_id(id: &str) -> Result<(), StoreError> {
    let why = if id.is_empty() {
        Some("it is empty")
    } else if id.contains('/') {
        Some("it contains `/`")
    } else if id == "." || id == ".." {
        Some("it is `.` or `..`")
    } else if id.contains('\0') {
        Some("it contains a NUL byte")
    } else if id.len() > 200 {
        Some("it is longer than 200 bytes")
    } else if id.starts_with('.') {
        Some("it starts with `.`")
    } else {
        None
    };
    match why {
        Some(why) => Err(StoreError::InvalidId {
            id: id.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

impl Store {
    pub fn container_dirs(&self, id: &str) -> ContainerDirs {
        ContainerDirs::under(self.layout.container(id))
    }

    /// Claims `id` and makes its directories. Fails with `AlreadyExists` if the ID is
    /// taken, including by a create still in flight.
    pub fn create_container_dirs(&self, id: &str) -> Result<ContainerDirs, StoreError> {
        validate_id(id)?;
        let dirs = self.container_dirs(id);
        match fs::create_dir(&dirs.base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(StoreError::AlreadyExists(id.into()));
            }
            Err(e) => return Err(StoreError::io("creating", &dirs.base)(e)),
        }
        for dir in [&dirs.rootfs, &dirs.upper, &dirs.work] {
            fs::create_dir(dir).map_err(StoreError::io("creating", dir))?;
        }
        Ok(dirs)
    }

    /// Writes the record atomically (temp file + rename).
    pub fn write_record(&self, record: &ContainerRecord) -> Result<(), StoreError> {
        let base = self.layout.container(&record.id);
        let tmp = base.join(format!(".{RECORD}.tmp"));
        let path = base.join(RECORD);
        let json = serde_json::to_vec_pretty(record)
            .map_err(|e| StoreError::io("encoding", &path)(e.into()))?;
        fs::write(&tmp, json).map_err(StoreError::io("writing", &tmp))?;
        fs::rename(&tmp, &path).map_err(StoreError::io("writing", &path))
    }

    pub fn record(&self, id: &str) -> Result<ContainerRecord, StoreError> {
        validate_id(id)?;
        let path = self.layout.container(id).join(RECORD);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::io("reading", &path)(e.into())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NotFound(id.into()))
            }
            Err(e) => Err(StoreError::io("reading", &path)(e)),
        }
    }

    /// Whether anything (even a half-created container) holds this ID.
    pub fn container_exists(&self, id: &str) -> bool {
        validate_id(id).is_ok() && self.layout.container(id).exists()
    }

    /// Complete containers, sorted by ID.
    pub fn containers(&self) -> Result<Vec<ContainerRecord>, StoreError> {
        let images = self.layout.images();
        let mut out = Vec::new();
        for entry in fs::read_dir(&images).map_err(StoreError::io("listing", &images))? {
            let entry = entry.map_err(StoreError::io("listing", &images))?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            match self.record(&id) {
                Ok(record) => out.push(record),
                Err(StoreError::NotFound(_) | StoreError::InvalidId { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Removes a container's directory tree. The caller has unmounted it. The tree is
    /// first renamed into `tmp/`, so a concurrent delete or list never sees it half gone.
    pub fn remove_container_dirs(&self, id: &str) -> Result<bool, StoreError> {
        validate_id(id)?;
        let base = self.layout.container(id);
        let doomed = self
            .layout
            .tmp()
            .join(format!("delete-{id}-{}", unique_suffix()));
        match fs::rename(&base, &doomed) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("removing", &base)(e)),
        }
        fs::remove_dir_all(&doomed).map_err(StoreError::io("removing", &doomed))?;
        Ok(true)
    }

    pub fn rootfs_path(&self, id: &str) -> PathBuf {
        self.container_dirs(id).rootfs
    }

    pub fn id_from_path(&self, path: &Path) -> Option<String> {
        self.layout.id_from_rootfs_path(path)
    }
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}
