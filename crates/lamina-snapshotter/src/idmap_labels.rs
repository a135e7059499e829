//! containerd's `uidmapping` and `gidmapping` labels: a user-namespaced container's
//! rootfs with its layers shown through idmapped mounts, so a file the image gives to
//! root belongs to the container's mapped root on the host — what containerd 2.x's
//! overlayfs does for the `remap-ids` capability, without chowning a copy of the image.
//!
//! containerd 1.6 cannot mount an idmapped overlay from options, so lamina mounts it and
//! answers a bind (as for a volatile upper). Labels reach lamina from pod specs, so they
//! are bounded like any input: the kernel's 340 lines per map, each range inside 2^32.

use std::collections::BTreeMap;

use lamina_store::{IdMap, IdMapping};

use crate::SnapshotError;
use crate::snapshotter::{GIDMAPPING_LABEL, UIDMAPPING_LABEL};

/// The kernel's limit on the lines of one `uid_map` or `gid_map`.
const MAX_RANGES: usize = 340;

/// The idmap `labels` ask for: none without the labels; refused for an unpack (its upper
/// becomes a layer, which must keep the image's own ids), for one label without the
/// other, and for a malformed or oversized mapping.
pub(crate) fn idmap(
    extraction: bool,
    labels: &BTreeMap<String, String>,
) -> Result<Option<IdMap>, SnapshotError> {
    let (uids, gids) = match (labels.get(UIDMAPPING_LABEL), labels.get(GIDMAPPING_LABEL)) {
        (None, None) => return Ok(None),
        (Some(uids), Some(gids)) => (uids, gids),
        _ => {
            return Err(SnapshotError::InvalidArgument(format!(
                "{UIDMAPPING_LABEL} and {GIDMAPPING_LABEL} are given together or not at all"
            )));
        }
    };
    if extraction {
        return Err(SnapshotError::InvalidArgument(format!(
            "{UIDMAPPING_LABEL} on an unpack: the layer it makes must keep the image's own ids"
        )));
    }
    let map = IdMap {
        uids: ranges(UIDMAPPING_LABEL, uids)?,
        gids: ranges(GIDMAPPING_LABEL, gids)?,
    };
    Ok(Some(map))
}

fn ranges(label: &str, value: &str) -> Result<Vec<IdMapping>, SnapshotError> {
    let refused = |why: String| {
        SnapshotError::InvalidArgument(format!("{label}: `{}` {why}", lamina_image::shown(value)))
    };
    // No more than one past the limit is split off: a caller's megabytes of commas cost
    // nothing before the refusal.
    let parts: Vec<&str> = value.split(',').take(MAX_RANGES + 1).collect();
    if parts.len() > MAX_RANGES {
        return Err(refused(format!(
            "has more than {MAX_RANGES} ranges; the kernel takes at most {MAX_RANGES}"
        )));
    }
    let ranges = parts
        .iter()
        .map(|part| IdMapping::parse(part.trim()).map_err(&refused))
        .collect::<Result<Vec<_>, _>>()?;
    let overlaps = |pick: fn(&IdMapping) -> u32| {
        let mut spans: Vec<(u64, u64)> = ranges
            .iter()
            .map(|r| (u64::from(pick(r)), u64::from(pick(r)) + u64::from(r.size)))
            .collect();
        spans.sort();
        spans.windows(2).any(|w| w[1].0 < w[0].1)
    };
    if overlaps(|r| r.ns_id) || overlaps(|r| r.host_id) {
        return Err(refused("has overlapping ranges".into()));
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn both_labels_make_a_map_of_every_range() {
        let map = idmap(
            false,
            &labels(&[
                (UIDMAPPING_LABEL, "0:100000:65536"),
                (GIDMAPPING_LABEL, "0:200000:1000,1000:300000:10"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(map.host_uid(0), 100_000);
        assert_eq!(map.host_gid(1005), 300_005);
        assert_eq!(idmap(false, &labels(&[])).unwrap(), None);
    }

    #[test]
    fn malformed_partial_oversized_and_unpack_mappings_are_refused() {
        let refused = |pairs: &[(&str, &str)], extraction: bool, says: &str| {
            let err = idmap(extraction, &labels(pairs)).unwrap_err().to_string();
            assert!(err.contains(says), "{pairs:?}: {err}");
        };
        refused(&[(UIDMAPPING_LABEL, "0:1:1")], false, "together");
        let both = |u: &'static str| [(UIDMAPPING_LABEL, u), (GIDMAPPING_LABEL, "0:1000:10")];
        refused(&both("0:1000"), false, "NS_ID:HOST_ID:SIZE");
        refused(&both("0:1000:0"), false, "size is 0");
        refused(&both("0:4294967295:2"), false, "2^32");
        refused(&both("0:1000:10,5:5000:10"), false, "overlapping");
        refused(&both("0:1000:10,10:1005:10"), false, "overlapping");
        refused(&both("0:1000:10"), true, "unpack");
        let many = vec!["1:1:1"; 341].join(",");
        let err = idmap(
            false,
            &labels(&[(UIDMAPPING_LABEL, &many), (GIDMAPPING_LABEL, "0:1:1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("at most 340"), "{err}");
    }
}
