//! File capabilities (`security.capability`) across the chown of a uid-mapped store's
//! layers. The kernel removes the xattr on every chown, so [`crate::shift`] reads it
//! first and writes it back after, shifted like the file's owner.
//!
//! A version 3 value names the uid that is root of the namespaces it is valid in (its
//! rootid); a version 2 value has none, and the kernel reads it as rootid 0 — so much so
//! that when real root writes a v3 value with rootid 0 (the unpacker does, for an image's
//! v3 value), the kernel stores it as v2. Both therefore mean "the image's root", which in
//! a chowned store is the mapped root: the value written back is v3 with the mapped root
//! as rootid, exactly what the kernel stores when the container's root runs `setcap`
//! inside its user namespace. The capability then works in the container and, unlike a
//! v2 value, not for someone executing the layer file on the host.

use std::ffi::OsStr;
use std::io;
use std::path::Path;

use lamina_sys::{At, HostFs};

use crate::IdMap;

/// The xattr holding a file's capabilities (`struct vfs_cap_data`).
pub(crate) const XATTR: &str = "security.capability";

/// `VFS_CAP_REVISION_2` and `_3` in the top byte of the little-endian `magic_etc` word.
const REVISION_2: u32 = 0x0200_0000;
const REVISION_3: u32 = 0x0300_0000;
const REVISION_MASK: u32 = 0xff00_0000;
/// `XATTR_CAPS_SZ_2`: magic_etc and two (permitted, inheritable) pairs.
const SIZE_2: usize = 20;
/// `XATTR_CAPS_SZ_3`: magic_etc, two (permitted, inheritable) pairs, rootid.
const SIZE_3: usize = 24;
/// Where a v3 value keeps its rootid.
const ROOTID_AT: usize = 20;

/// The capability xattr of `path` (not followed), if it has one.
/// Read and written through the kernel seam: writing it needs privilege.
pub(crate) fn read(host: &dyn HostFs, path: &Path) -> io::Result<Option<Vec<u8>>> {
    host.get_xattr(At::Path(path), OsStr::new(XATTR))
        .map_err(Into::into)
}

/// Writes `value` back as the capability xattr of `path`. lamina runs as real root in
/// the initial namespace on a layer directory that is not idmapped, so the kernel stores
/// the value as given (but for a v3 rootid of 0, which it stores as v2).
pub(crate) fn write(host: &dyn HostFs, path: &Path, value: &[u8]) -> io::Result<()> {
    host.set_xattr(At::Path(path), OsStr::new(XATTR), value)
        .map_err(Into::into)
}

/// `value` as it must read once the file's owner went through `map`: the rootid of a v3
/// value, and the implied rootid 0 of a v2 value, become the host uid they map to (the
/// image's root becomes the mapped root, so the capability is honoured in the
/// container's namespace). Anything else (v1, malformed) is returned unchanged.
pub(crate) fn shifted(value: &[u8], map: &IdMap) -> Vec<u8> {
    let Some(magic) = value.get(..4) else {
        return value.to_vec();
    };
    let magic = u32::from_le_bytes(magic.try_into().expect("four bytes"));
    let rootid = match (magic & REVISION_MASK, value.len()) {
        (REVISION_3, SIZE_3) => u32::from_le_bytes(
            value[ROOTID_AT..SIZE_3]
                .try_into()
                .expect("four bytes of rootid"),
        ),
        (REVISION_2, SIZE_2) => 0,
        _ => return value.to_vec(),
    };
    let mut out = Vec::with_capacity(SIZE_3);
    out.extend(((magic & !REVISION_MASK) | REVISION_3).to_le_bytes());
    out.extend(&value[4..ROOTID_AT]);
    out.extend(map.host_uid(rootid).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP_NET_RAW: u32 = 1 << 13;
    const EFFECTIVE: u32 = 0x1;

    fn map() -> IdMap {
        crate::properties::test_map(100_000, 200_000)
    }

    fn v2(permitted: u32) -> Vec<u8> {
        let mut v = (0x0200_0000 | EFFECTIVE).to_le_bytes().to_vec();
        for word in [permitted, 0, 0, 0] {
            v.extend(word.to_le_bytes());
        }
        v
    }

    fn v3(permitted: u32, rootid: u32) -> Vec<u8> {
        let mut v = (REVISION_3 | EFFECTIVE).to_le_bytes().to_vec();
        for word in [permitted, 0, 0, 0, rootid] {
            v.extend(word.to_le_bytes());
        }
        v
    }

    #[test]
    fn a_v3_rootid_of_the_images_root_becomes_the_mapped_root() {
        let shifted = shifted(&v3(CAP_NET_RAW, 0), &map());
        assert_eq!(shifted, v3(CAP_NET_RAW, 100_000));
    }

    #[test]
    fn a_v3_rootid_of_another_uid_is_shifted_like_an_owner() {
        assert_eq!(
            shifted(&v3(CAP_NET_RAW, 1000), &map()),
            v3(CAP_NET_RAW, 101_000)
        );
        // Outside the mapping: the overflow id, as the kernel would show it.
        assert_eq!(
            shifted(&v3(CAP_NET_RAW, 70_000), &map()),
            v3(CAP_NET_RAW, 65_534)
        );
    }

    #[test]
    fn v3_keeps_its_flags_and_capability_sets() {
        let before = v3(CAP_NET_RAW | 1, 0);
        let after = shifted(&before, &map());
        assert_eq!(after[..ROOTID_AT], before[..ROOTID_AT]);
    }

    #[test]
    fn a_v2_value_is_rooted_at_the_mapped_root_as_v3() {
        assert_eq!(shifted(&v2(CAP_NET_RAW), &map()), v3(CAP_NET_RAW, 100_000));
        // Without a uid mapping the rootid stays 0: the kernel keeps that as v2.
        assert_eq!(
            shifted(&v2(CAP_NET_RAW), &IdMap::default()),
            v3(CAP_NET_RAW, 0)
        );
    }

    #[test]
    fn v1_and_malformed_values_are_unchanged() {
        let v1 = [0x00, 0x00, 0x00, 0x01, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(shifted(&v1, &map()), v1);
        assert_eq!(shifted(&[3], &map()), [3]);
        // A v3 magic with the wrong length is not a v3 value: left alone.
        let odd = v3(CAP_NET_RAW, 0)[..20].to_vec();
        assert_eq!(shifted(&odd, &map()), odd);
    }
}
