//! Read-mostly calls: Stat, Update (labels only, as containerd allows), List and Usage.

use lamina_snapshot_index::{SnapshotKind, SnapshotRecord, StoreSnapshots};
use std::collections::BTreeMap;

use crate::filters::{Fields, Filters};
use crate::snapshotter::now_ns;
use crate::{SnapshotError, Snapshotter};

/// A snapshot as containerd sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub name: String,
    pub parent: String,
    pub kind: SnapshotKind,
    pub labels: BTreeMap<String, String>,
    pub created_ns: u128,
    pub updated_ns: u128,
}

impl Info {
    fn of(name: &str, record: &SnapshotRecord) -> Info {
        Info {
            name: name.to_string(),
            parent: record.parent.clone().unwrap_or_default(),
            kind: record.kind,
            labels: record.labels.clone(),
            created_ns: record.created_ns,
            updated_ns: record.updated_ns,
        }
    }
}

impl Fields for Info {
    fn field(&self, path: &[String]) -> Option<String> {
        match path {
            [field] => match field.as_str() {
                "name" => Some(self.name.clone()),
                "parent" => Some(self.parent.clone()),
                "kind" => Some(self.kind.as_str().to_string()),
                _ => None,
            },
            [field, key] if field == "labels" => self.labels.get(key).cloned(),
            _ => None,
        }
    }
}

/// Bytes and inodes a snapshot holds on disk (for a committed one, its layer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
}

impl Snapshotter {
    pub fn stat(&self, key: &str) -> Result<Info, SnapshotError> {
        self.index()
            .get(key)?
            .map(|r| Info::of(key, &r))
            .ok_or_else(|| SnapshotError::NotFound(key.into()))
    }

    /// Changes labels: `paths` empty or `labels` replaces them all; `labels.<key>` sets
    /// (or, absent from `info`, deletes) one. Nothing else of a snapshot may change.
    pub fn update(&self, info: &Info, paths: &[String]) -> Result<Info, SnapshotError> {
        let _lock = self.store.lock_snapshots()?;
        let mut index = self.index();
        let mut record = index
            .get(&info.name)?
            .ok_or_else(|| SnapshotError::NotFound(info.name.clone()))?;
        if paths.is_empty() || paths.iter().any(|p| p == "labels") {
            record.labels = info.labels.clone();
        }
        for path in paths.iter().filter(|p| *p != "labels") {
            let Some(key) = path.strip_prefix("labels.") else {
                return Err(SnapshotError::InvalidArgument(format!(
                    "cannot update `{path}` of snapshot `{}`: only labels change",
                    info.name
                )));
            };
            match info.labels.get(key) {
                Some(value) => record.labels.insert(key.to_string(), value.clone()),
                None => record.labels.remove(key),
            };
        }
        crate::label_bounds::check(&info.name, &record.labels)?;
        record.updated_ns = now_ns();
        index.update(&info.name, &record)?;
        Ok(Info::of(&info.name, &record))
    }

    /// Every snapshot that matches any of `filters` (all, without filters), by name.
    pub fn list(&self, filters: &[String]) -> Result<Vec<Info>, SnapshotError> {
        let filters = Filters::parse(filters).map_err(SnapshotError::InvalidArgument)?;
        let mut matching = Vec::new();
        self.index().for_each(|name, record| {
            let info = Info::of(&name, &record);
            if filters.matches(&info) {
                matching.push(info);
            }
        })?;
        Ok(matching)
    }

    /// What the snapshot holds: an active's upper (what was written), a view's nothing, a
    /// committed snapshot's layer.
    pub fn usage(&self, key: &str) -> Result<Usage, SnapshotError> {
        let record = self
            .index()
            .get(key)?
            .ok_or_else(|| SnapshotError::NotFound(key.into()))?;
        let dir = match (&record.layer, &record.container) {
            // A lazy layer counts what was fetched of it; its files not yet fetched take
            // no blocks.
            (Some(layer), _) => match lamina_mount::lazy_layer_usage(&self.store, layer) {
                Some(usage) => {
                    let (bytes, inodes) = usage?;
                    return Ok(Usage { bytes, inodes });
                }
                None => self.store.layout().layer_diff(layer),
            },
            (None, Some(_)) if record.kind == SnapshotKind::View => return Ok(Usage::default()),
            (None, Some(id)) => {
                // Its own filesystem's or qgroup's account where it has one, read anew;
                // a walk is reused for a while (see `usage_cache`).
                // The store's used bytes are asked only where a walk is reused or kept: an
                // upper with its own account costs no statfs of the store.
                let earlier = self
                    .usage_cache
                    .get(key, id, || store_used_bytes(&self.store));
                let written =
                    lamina_mount::written(&self.store, self.mounter.as_ref(), id, earlier)?;
                if let Some(walk) = written.walk {
                    self.usage_cache
                        .put(key, id, walk, store_used_bytes(&self.store));
                }
                return Ok(Usage {
                    bytes: written.bytes,
                    inodes: written.inodes,
                });
            }
            (None, None) => return Ok(Usage::default()),
        };
        let (bytes, inodes) = lamina_store::disk_usage_and_inodes(&dir)?;
        Ok(Usage { bytes, inodes })
    }
}

/// The bytes the store's filesystem uses (`statvfs`); 0 if it cannot be asked, which ends
/// no reuse early.
fn store_used_bytes(store: &lamina_store::Store) -> u64 {
    rustix::fs::statvfs(store.root())
        .map_or(0, |fs| fs.f_blocks.saturating_sub(fs.f_bfree) * fs.f_frsize)
}
