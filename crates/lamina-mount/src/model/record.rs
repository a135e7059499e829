//! lamina-mount's part of a container record: the [`Model`] and what providing it left
//! to remember (what is mounted, with which options, what a bind binds, the lease, the
//! container's own upper filesystem). It is stored as the `rootfs` object of
//! `container.json`, tagged and versioned:
//!
//! ```json
//! "rootfs": {"version": 2, "provider": "fresh", "metacopy": true, "volatile": false,
//!            "read_only": false, "teardown": "deferred", "mounted": true, "mount_options": [...]}
//! ```
//!
//! Records written before the model (flat `strategy`, `mounted`, `bind_source`, … fields)
//! still load: [`RootfsRecord::from_legacy`] reads them into the same model, and the next
//! write stores them in the new form.
//!
//! A record is input: it is only trusted once it is consistent (the fields a provider
//! needs, nothing it cannot have) and every path in it has the exact shape lamina writes,
//! inside this store. Anything else makes it [`StoreError::BadRecord`], and a container
//! with a bad record is torn down by what is mounted in its own directory, never by what
//! the record says.

use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{BadRecord, ContainerDirs, ContainerRecord, IdMap, Layout, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::Model;
use crate::{Strategies, UpperBackend};

/// The `rootfs` format this lamina writes; a higher one is refused, not guessed at.
pub const ROOTFS_RECORD_VERSION: u32 = 2;
/// The key of lamina-mount's part in `container.json`.
const KEY: &str = "rootfs";

/// How a container's rootfs was provided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsRecord {
    pub version: u32,
    #[serde(flatten)]
    pub model: Model,
    /// Whether lamina mounted the rootfs (false with `--without-mount`, after `unmount`).
    pub mounted: bool,
    /// Overlay options the rootfs is (or is to be) mounted with.
    pub mount_options: Vec<String>,
    /// shared-ro and direct: the directory the rootfs is a read-only bind of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_source: Option<PathBuf>,
    /// shared-ro: the lease file that keeps the image's shared mount alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<PathBuf>,
    /// An isolated upper: its own filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_fs: Option<UpperFsRecord>,
    /// The container's own uid/gid mapping: its overlay's lowers are idmapped, so only
    /// lamina can mount it (`CreateOptions::idmap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idmap: Option<IdMap>,
}

/// An isolated container's own upper filesystem, as its record remembers it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UpperFsRecord {
    /// `ext4` or `xfs` (an image file, loop-mounted), [`UpperFsRecord::TMPFS`], or
    /// [`UpperFsRecord::SUBVOLUME`] (a btrfs subvolume with a qgroup limit).
    pub filesystem: String,
    /// Its size: the most the container can write.
    pub size_bytes: u64,
}

impl UpperFsRecord {
    /// The `filesystem` of a memory-backed upper.
    pub const TMPFS: &str = "tmpfs";

    /// The `filesystem` of a quota upper: a subvolume of the store's btrfs.
    pub const SUBVOLUME: &str = "btrfs-subvolume";

    /// A tmpfs: nothing of it is ever written back, and a host restart loses it.
    pub fn in_memory(&self) -> bool {
        self.filesystem == Self::TMPFS
    }

    /// Which backend this upper is of (any other name is a disk image's filesystem).
    pub fn backend(&self) -> UpperBackend {
        match self.filesystem.as_str() {
            Self::TMPFS => UpperBackend::Memory,
            Self::SUBVOLUME => UpperBackend::Quota,
            _ => UpperBackend::Disk,
        }
    }
}

/// A container: the store's record and the rootfs part, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub record: ContainerRecord,
    pub rootfs: RootfsRecord,
}

impl Container {
    pub fn id(&self) -> &str {
        &self.record.id
    }

    pub fn model(&self) -> Model {
        self.rootfs.model
    }

    /// The container's directories under `base`, in the shape its model gives them.
    pub fn dirs_in(&self, base: PathBuf) -> ContainerDirs {
        ContainerDirs::shaped(base, self.model().upper_backend().is_some())
    }

    /// Only lamina mounts this rootfs (a caller binds it): see
    /// [`Model::mounted_by_lamina_only`]; an idmapped overlay too, as no option string
    /// can carry an idmap.
    pub fn mounted_by_lamina_only(&self) -> bool {
        self.model().mounted_by_lamina_only() || self.rootfs.idmap.is_some()
    }

    /// Its directories in `images/`.
    pub fn dirs(&self, store: &Store) -> ContainerDirs {
        self.dirs_in(store.layout().container(self.id()))
    }

    /// Reads the rootfs part of `record` and checks it against `layout`.
    /// The part is taken out of `record.rootfs`, which stays empty: the typed value is
    /// the one to read and change.
    pub fn from_record(mut record: ContainerRecord, layout: &Layout) -> Result<Self, String> {
        let fields = std::mem::take(&mut record.rootfs);
        let rootfs = match fields.get(KEY) {
            // One form or the other: a flat field beside `rootfs` is nothing lamina wrote.
            Some(_) if fields.len() > 1 => {
                let extra: Vec<&str> = fields
                    .keys()
                    .map(String::as_str)
                    .filter(|k| *k != KEY)
                    .collect();
                return Err(format!(
                    "it has fields lamina does not write: {}",
                    lamina_image::shown(&extra.join(", "))
                ));
            }
            Some(value) => RootfsRecord::from_value(value)?,
            None => RootfsRecord::from_legacy(&fields)?,
        };
        rootfs.check(layout, record.layers.last())?;
        Ok(Container { record, rootfs })
    }

    /// The store's record with this rootfs part in it, in the current form.
    fn to_record(&self) -> Result<ContainerRecord, serde_json::Error> {
        let mut record = self.record.clone();
        let mut part = Map::new();
        part.insert(KEY.into(), serde_json::to_value(&self.rootfs)?);
        record.rootfs = part;
        Ok(record)
    }
}

impl RootfsRecord {
    /// A record of `model`, as providing it left things.
    pub fn new(model: Model, mounted: bool, mount_options: Vec<String>) -> Self {
        RootfsRecord {
            version: ROOTFS_RECORD_VERSION,
            model,
            mounted,
            mount_options,
            bind_source: None,
            lease: None,
            upper_fs: None,
            idmap: None,
        }
    }

    fn from_value(value: &Value) -> Result<Self, String> {
        let version = value.get("version").and_then(Value::as_u64);
        match version {
            Some(v) if v == u64::from(ROOTFS_RECORD_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "its rootfs record is version {v}; this lamina reads version {ROOTFS_RECORD_VERSION}"
                ));
            }
            None => return Err("its rootfs record has no version".into()),
        }
        let record: RootfsRecord =
            serde_json::from_value(value.clone()).map_err(|e| format!("its rootfs record: {e}"))?;
        // Exactly the fields lamina writes for this model: a field another provider has
        // (a `metacopy` on a direct bind) would be silently ignored otherwise.
        let written = serde_json::to_value(&record).map_err(|e| e.to_string())?;
        if let (Some(given), Some(written)) = (value.as_object(), written.as_object())
            && let Some(extra) = given.keys().find(|k| !written.contains_key(*k))
        {
            return Err(format!(
                "its rootfs record has a field provider `{}` does not: {}",
                record.model,
                lamina_image::shown(extra)
            ));
        }
        Ok(record)
    }

    /// A record written before the model existed: a `strategy` list and flat fields.
    pub fn from_legacy(fields: &Map<String, Value>) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Legacy {
            strategy: String,
            mounted: bool,
            mount_options: Vec<String>,
            #[serde(default)]
            read_only: bool,
            #[serde(default)]
            bind_source: Option<PathBuf>,
            #[serde(default)]
            lease: Option<PathBuf>,
            #[serde(default)]
            upper_fs: Option<UpperFsRecord>,
        }
        let legacy: Legacy = serde_json::from_value(Value::Object(fields.clone()))
            .map_err(|e| format!("not a container record: {e}"))?;
        let strategies = Strategies::parse(&legacy.strategy)?;
        let model = Model::named(strategies, legacy.read_only)?;
        Ok(RootfsRecord {
            version: ROOTFS_RECORD_VERSION,
            model,
            mounted: legacy.mounted,
            mount_options: legacy.mount_options,
            bind_source: legacy.bind_source,
            lease: legacy.lease,
            upper_fs: legacy.upper_fs,
            idmap: None,
        })
    }

    /// Why this record cannot be trusted, if it cannot: its model is not one lamina makes,
    /// a field its provider needs is missing, one it cannot have is there, or a path is
    /// not the store's own for this image (`top`: the record's top layer).
    fn check(&self, layout: &Layout, top: Option<&Digest>) -> Result<(), String> {
        let read_only = self.model.read_only();
        if Model::named(self.model.strategies(), read_only).as_ref() != Ok(&self.model) {
            return Err(format!(
                "its rootfs record names a model lamina does not make (`{}`, teardown {:?})",
                self.model, self.model.teardown
            ));
        }
        let names = self.model.provider.names();
        if self.bind_source.is_some() != names.bind_source || self.lease.is_some() != names.lease {
            return Err(format!(
                "its rootfs record does not fit provider `{}` (bind source, lease)",
                self.model
            ));
        }
        let isolated = self.model.flavour().and_then(|f| f.isolated);
        let fits = isolated == self.upper_fs.as_ref().map(UpperFsRecord::backend)
            // No pool holds quota uppers (see `Strategies::parse`).
            && !(self.model.strategies().pooled && isolated == Some(UpperBackend::Quota));
        if !fits {
            return Err(format!(
                "its upper filesystem does not fit strategy `{}`",
                self.model
            ));
        }
        if self.idmap.is_some() && !names.own_idmap {
            return Err(format!(
                "its rootfs record idmaps provider `{}`, which shares its mount",
                self.model
            ));
        }
        if let Some(lease) = &self.lease
            && !layout.names(lease, &[&["shared", "*", "users", "*"]])
        {
            return Err(format!(
                "its lease {} is not a lease of this store",
                lease.display()
            ));
        }
        if let Some(source) = &self.bind_source
            && !layout.names(source, names.bind_shapes)
        {
            return Err(format!(
                "its bind source {} is not a mount of this store",
                source.display()
            ));
        }
        // A bind of this image's tree, under this image's key: never another image's
        // shared mount, flattened tree or layer (which collection would not keep for it).
        let key = top.map(|t| t.hex().to_string());
        let key_of = |path: &Path, up: usize| {
            path.ancestors()
                .nth(up)
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
        };
        let source_key = self.bind_source.as_deref().map(|source| {
            // shared/<K>/rootfs and layers/<K>/diff name K one up; flat/<K> names it.
            let flat = source.parent().and_then(Path::file_name) == Some("flat".as_ref());
            let up = usize::from(!flat);
            key_of(source, up)
        });
        let lease_key = self.lease.as_deref().map(|lease| key_of(lease, 2));
        for (what, found) in [("bind source", source_key), ("lease", lease_key)] {
            if let Some(found) = found
                && found != key
            {
                return Err(format!("its {what} is not of the image it was made from"));
            }
        }
        Ok(())
    }
}

/// Container `id`, read and checked.
pub fn read(store: &Store, id: &str) -> Result<Container, StoreError> {
    Ok(read_with_bytes(store, id)?.0)
}

/// [`read`], and the record's bytes as stored ([`Store::record_bytes`] compares them).
pub fn read_with_bytes(store: &Store, id: &str) -> Result<(Container, Vec<u8>), StoreError> {
    let (record, bytes) = store.record_and_bytes(id)?;
    let path = store.layout().container(id).join("container.json");
    let container =
        Container::from_record(record, store.layout()).map_err(|why| StoreError::BadRecord {
            id: id.into(),
            path,
            why,
        })?;
    Ok((container, bytes))
}

/// The container whose directory is `dir`, wherever it is (`images/`, `trash/`).
pub fn read_in(store: &Store, dir: &Path) -> Result<Option<Container>, StoreError> {
    let Some(record) = store.record_in(dir)? else {
        return Ok(None);
    };
    let id = record.id.clone();
    Container::from_record(record, store.layout())
        .map(Some)
        .map_err(|why| StoreError::BadRecord {
            id,
            path: dir.join("container.json"),
            why,
        })
}

/// Writes `container`'s record durably, in the current form.
pub fn write(store: &Store, container: &Container) -> Result<(), StoreError> {
    store.write_record(&to_store_record(store, container)?)
}

/// Writes a new container's first record ([`Store::write_new_record`]): whole after any
/// crash, without a device flush on ext4 and xfs.
pub fn write_new(store: &Store, container: &Container) -> Result<(), StoreError> {
    store.write_new_record(&to_store_record(store, container)?)
}

fn to_store_record(store: &Store, container: &Container) -> Result<ContainerRecord, StoreError> {
    container.to_record().map_err(|e| {
        StoreError::io(
            "encoding the record of",
            &store.layout().container(container.id()),
        )(e.into())
    })
}

/// Every container in `images/`: the readable ones, sorted by ID, and those whose record
/// is torn, garbage, or names a rootfs lamina cannot trust.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub containers: Vec<Container>,
    pub bad: Vec<BadRecord>,
}

pub fn scan(store: &Store) -> Result<Scan, StoreError> {
    let found = store.scan_containers()?;
    let mut scan = Scan {
        containers: Vec::new(),
        bad: found.bad,
    };
    for record in found.records {
        let id = record.id.clone();
        match Container::from_record(record, store.layout()) {
            Ok(container) => scan.containers.push(container),
            Err(why) => scan.bad.push(BadRecord {
                path: store.layout().container(&id).join("container.json"),
                id,
                why,
            }),
        }
    }
    scan.bad.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Provider;
    use serde_json::json;

    fn layout() -> Layout {
        Layout::new(Path::new("/var/lib/lamina"))
    }

    /// The top layer of every test record, whose hex keys its shared and flat trees.
    fn top() -> lamina_image::Digest {
        lamina_image::Digest::of(b"layer")
    }

    /// `path` with `{top}` replaced by the top layer's hex.
    fn at(path: &str) -> String {
        path.replace("{top}", top().hex())
    }

    fn store_record(rootfs: Value) -> ContainerRecord {
        let mut value = json!({
            "id": "c",
            "image": "oci:///image",
            "image_id": lamina_image::Digest::of(b"config").to_string(),
            "layers": [top().to_string()],
            "env": [],
            "created_unix": 0,
        });
        for (k, v) in rootfs.as_object().unwrap() {
            value[k] = v.clone();
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn records_written_before_the_model_load_into_it() {
        let legacy = store_record(json!({
            "strategy": "shared-ro,deferred",
            "mounted": true,
            "mount_options": ["bind", "ro"],
            "read_only": true,
            "bind_source": at("/var/lib/lamina/shared/{top}/rootfs"),
            "lease": at("/var/lib/lamina/shared/{top}/users/1-2-3"),
        }));
        let container = Container::from_record(legacy, &layout()).unwrap();
        assert_eq!(container.model().provider, Provider::SharedRo);
        assert!(container.model().deferred());
        assert!(container.record.rootfs.is_empty());
        let rewritten = container.to_record().unwrap();
        assert_eq!(rewritten.rootfs.len(), 1, "{:?}", rewritten.rootfs);
        let again = Container::from_record(rewritten, &layout()).unwrap();
        assert_eq!(again, container);

        let isolated = store_record(json!({
            "strategy": "isolated-memory,volatile,deferred",
            "mounted": true,
            "mount_options": [],
            "upper_fs": {"filesystem": "tmpfs", "size_bytes": 1024},
        }));
        let model = Container::from_record(isolated, &layout()).unwrap().model();
        assert_eq!(
            model.flavour().unwrap().isolated,
            Some(UpperBackend::Memory)
        );
    }

    #[test]
    fn a_quota_upper_round_trips_and_must_be_a_subvolume() {
        let quota = |filesystem: &str, isolated: &str, provider: &str| {
            // Inline only where lamina makes it so: a quota upper named without `deferred`.
            let teardown = if (isolated, provider) == ("quota", "fresh") {
                "inline"
            } else {
                "deferred"
            };
            let mut rootfs = json!({"version": 2, "provider": provider,
                "metacopy": true, "volatile": false,
                "isolated": isolated, "teardown": teardown, "mounted": true,
                "mount_options": [],
                "upper_fs": {"filesystem": filesystem, "size_bytes": 4096}});
            if provider == "fresh" {
                rootfs["read_only"] = json!(false);
            }
            store_record(json!({ "rootfs": rootfs }))
        };
        let container =
            Container::from_record(quota("btrfs-subvolume", "quota", "fresh"), &layout()).unwrap();
        assert_eq!(container.model().to_string(), "isolated-quota,metacopy");
        let json = serde_json::to_value(&container.rootfs).unwrap();
        assert_eq!(json["isolated"], "quota");
        assert_eq!(json["upper_fs"]["filesystem"], "btrfs-subvolume");
        let again: RootfsRecord = serde_json::from_value(json).unwrap();
        assert_eq!(again, container.rootfs);
        for (filesystem, isolated, provider) in [
            ("ext4", "quota", "fresh"),
            ("btrfs-subvolume", "disk", "fresh"),
            ("btrfs-subvolume", "memory", "fresh"),
            ("btrfs-subvolume", "quota", "pooled"),
        ] {
            let err = Container::from_record(quota(filesystem, isolated, provider), &layout())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("does not fit strategy"),
                "{filesystem} {isolated} {provider}: {err}"
            );
        }
    }

    #[test]
    fn inconsistent_or_foreign_records_are_refused_with_the_reason() {
        let cases = [
            (
                json!({"rootfs": {"version": 3, "provider": "fresh"}}),
                "version 3",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": []}}),
                "does not fit provider",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": [], "bind_source": "/etc"}}),
                "not a mount of this store",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "fresh", "metacopy": false,
                       "volatile": false, "read_only": false, "teardown": "inline",
                       "mounted": true, "mount_options": [],
                       "upper_fs": {"filesystem": "tmpfs", "size_bytes": 1}}}),
                "does not fit strategy",
            ),
            (
                json!({"strategy": "pooled", "mounted": true, "mount_options": [],
                       "read_only": true}),
                "does not combine with --read-only",
            ),
            (
                json!({"strategy": "teleport", "mounted": true, "mount_options": []}),
                "unknown strategy",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "shared-ro", "teardown": "deferred",
                       "mounted": true, "mount_options": [],
                       "bind_source": at("/var/lib/lamina/shared/{top}/rootfs"),
                       "lease": "/var/lib/lamina/shared/../../etc/users/x"}}),
                "not a lease of this store",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": [],
                       "bind_source": at("/var/lib/lamina/flat/{top}")},
                       "lease": "/etc"}),
                "fields lamina does not write: lease",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": [],
                       "bind_source": "/var/lib/lamina/layers/0123/diff"}}),
                "not of the image it was made from",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": [],
                       "bind_source": at("/var/lib/lamina/shared/{top}/rootfs")}}),
                "not a mount of this store",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "shared-ro", "teardown": "inline",
                       "mounted": true, "mount_options": [],
                       "bind_source": at("/var/lib/lamina/shared/{top}/rootfs"),
                       "lease": at("/var/lib/lamina/shared/{top}/users/x")}}),
                "a model lamina does not make",
            ),
            (
                json!({"rootfs": {"version": 2, "provider": "direct", "teardown": "deferred",
                       "mounted": true, "mount_options": [], "metacopy": true,
                       "bind_source": at("/var/lib/lamina/flat/{top}")}}),
                "a field provider `direct,deferred` does not: metacopy",
            ),
        ];
        for (rootfs, expect) in cases {
            let err = Container::from_record(store_record(rootfs.clone()), &layout()).unwrap_err();
            assert!(err.contains(expect), "{rootfs}: {err}");
        }
    }
}
