//! What a store is made with and keeps for life, recorded in its marker file by
//! `init-store`: Garden's uid/gid mappings (every container's root is the mapped root)
//! and the size the operator gave the store.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One line of a user namespace map: `size` ids from `ns_id` inside map to `host_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapping {
    pub ns_id: u32,
    pub host_id: u32,
    pub size: u32,
}

impl IdMapping {
    /// Parses GrootFS's `NS:HOST:SIZE` form.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let [ns, host, size] = parts[..] else {
            return Err(format!(
                "id mapping `{text}`: expected NS_ID:HOST_ID:SIZE, e.g. 0:100000:65536"
            ));
        };
        let number = |what: &str, s: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("id mapping `{text}`: {what} `{s}` is not a number"))
        };
        let mapping = IdMapping {
            ns_id: number("namespace id", ns)?,
            host_id: number("host id", host)?,
            size: number("size", size)?,
        };
        if mapping.size == 0 {
            return Err(format!("id mapping `{text}`: size is 0"));
        }
        if u64::from(mapping.ns_id) + u64::from(mapping.size) > 1 << 32
            || u64::from(mapping.host_id) + u64::from(mapping.size) > 1 << 32
        {
            return Err(format!("id mapping `{text}`: range runs past 2^32"));
        }
        Ok(mapping)
    }

    /// The host id of `id` inside, if this line maps it.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        (id >= self.ns_id && id - self.ns_id < self.size).then(|| self.host_id + (id - self.ns_id))
    }
}

impl fmt::Display for IdMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.ns_id, self.host_id, self.size)
    }
}

/// 0 → `uid_host` and 0 → `gid_host`, 65536 ids each: the map unit tests use.
#[cfg(test)]
pub(crate) fn test_map(uid_host: u32, gid_host: u32) -> IdMap {
    let line = |host_id| IdMapping {
        ns_id: 0,
        host_id,
        size: 65_536,
    };
    IdMap {
        uids: vec![line(uid_host)],
        gids: vec![line(gid_host)],
    }
}

/// A user namespace's uid and gid maps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
}

impl IdMap {
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }

    /// The host uid of `uid` inside; an unmapped id is the overflow id, as the kernel
    /// shows it.
    pub fn host_uid(&self, uid: u32) -> u32 {
        lookup(&self.uids, uid)
    }

    pub fn host_gid(&self, gid: u32) -> u32 {
        lookup(&self.gids, gid)
    }

    /// `/proc/<pid>/uid_map` text.
    pub fn uid_map_text(&self) -> String {
        map_text(&self.uids)
    }

    pub fn gid_map_text(&self) -> String {
        map_text(&self.gids)
    }
}

/// What the kernel shows for an id a namespace does not map.
pub const OVERFLOW_ID: u32 = 65534;

fn lookup(lines: &[IdMapping], id: u32) -> u32 {
    if lines.is_empty() {
        return id;
    }
    lines
        .iter()
        .find_map(|m| m.to_host(id))
        .unwrap_or(OVERFLOW_ID)
}

fn map_text(lines: &[IdMapping]) -> String {
    lines
        .iter()
        .map(|m| format!("{} {} {}\n", m.ns_id, m.host_id, m.size))
        .collect()
}

/// Recorded in the store marker by `init-store`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreProperties {
    /// Garden's `--uid-mapping` / `--gid-mapping`: containers run in a user namespace
    /// with these maps, so their rootfs must look owned by the mapped root.
    #[serde(default, skip_serializing_if = "IdMap::is_empty")]
    pub id_map: IdMap,
    /// How a uid-mapped store gives the mapped root its files: `false` (the default, where
    /// the kernel can) idmaps each layer at mount time and keeps layers as the image has
    /// them; `true` chowns every file at import instead (kernels without idmapped layers,
    /// and callers that mount the rootfs themselves with `--without-mount`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chowned_layers: bool,
    /// `init-store --share-file-content`: an import makes a file whose content and
    /// metadata another image's file already has a hardlink to that file's inode
    /// (`file_objects.rs`), so the store holds each content once on any filesystem. Off
    /// by default: every view of a shared file shows its link count, which tells a
    /// container how many images on the host hold that exact file (docs/security.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_file_content: bool,
    /// `init-store --layer-data objects`: an import moves each layer file's data into
    /// `objects/` (once per content) and leaves a metadata-only stub that overlay reads
    /// through `metacopy=on` (`object_layers.rs`), so the store holds each content once
    /// on any filesystem without two images ever sharing an inode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layer_data_in_objects: bool,
    /// `init.store_size_bytes`: what `capacity` reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_size_bytes: Option<u64>,
}

impl StoreProperties {
    /// Containers of this store run in a user namespace.
    pub fn mapped(&self) -> bool {
        !self.id_map.is_empty()
    }

    /// Layers are idmapped at mount time.
    pub fn idmaps_layers(&self) -> bool {
        self.mapped() && !self.chowned_layers
    }

    /// Layers are chowned to the mapped ids at import.
    pub fn chowns_layers(&self) -> bool {
        self.mapped() && self.chowned_layers
    }

    /// A uid map without a gid map (or the reverse) is a typo: a container's root would be
    /// mapped for one and not the other.
    pub fn validate(&self) -> Result<(), String> {
        if self.layer_data_in_objects && self.mapped() {
            return Err(
                "--layer-data objects cannot be combined with --uid-mapping/--gid-mapping: \
                 a layer's stubs read their data through a data-only lower, which is not idmapped"
                    .to_string(),
            );
        }
        if self.layer_data_in_objects && self.shared_file_content {
            return Err("--layer-data objects already stores each content once: \
                 it cannot be combined with --share-file-content"
                .to_string());
        }
        if self.id_map.uids.is_empty() != self.id_map.gids.is_empty() {
            return Err(
                "a uid-mapped store needs both --uid-mapping and --gid-mapping".to_string(),
            );
        }
        if !self.id_map.is_empty()
            && (self.id_map.uids.iter().all(|m| m.to_host(0).is_none())
                || self.id_map.gids.iter().all(|m| m.to_host(0).is_none()))
        {
            return Err(
                "the uid and gid mappings must map id 0 (the container's root)".to_string(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grootfs_mappings_and_maps_ids() {
        let m = IdMapping::parse("0:100000:65536").unwrap();
        assert_eq!(m.to_host(0), Some(100000));
        assert_eq!(m.to_host(65535), Some(165535));
        assert_eq!(m.to_host(65536), None);
        assert_eq!(m.to_string(), "0:100000:65536");
        let map = IdMap {
            uids: vec![m, IdMapping::parse("65536:300000:1").unwrap()],
            gids: vec![],
        };
        assert_eq!(map.host_uid(65536), 300000);
        assert_eq!(map.host_uid(70000), OVERFLOW_ID);
        assert_eq!(map.host_gid(7), 7, "no gid map: ids are the host's");
        assert_eq!(map.uid_map_text(), "0 100000 65536\n65536 300000 1\n");
    }

    #[test]
    fn bad_mappings_name_the_fault() {
        for (text, why) in [
            ("0:1", "expected NS_ID:HOST_ID:SIZE"),
            ("0:x:1", "host id `x` is not a number"),
            ("0:1:0", "size is 0"),
            ("0:4294967295:2", "past 2^32"),
        ] {
            let err = IdMapping::parse(text).unwrap_err();
            assert!(err.contains(why) && err.contains(text), "{err}");
        }
        let only_uids = StoreProperties {
            id_map: IdMap {
                uids: vec![IdMapping::parse("0:1000:1").unwrap()],
                gids: vec![],
            },
            ..StoreProperties::default()
        };
        assert!(only_uids.validate().unwrap_err().contains("--gid-mapping"));
    }
}
