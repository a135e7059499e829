//! File capabilities (`security.capability`) across the chown of a uid-mapped store's
//! layers. The kernel removes the xattr on every chown, so [`crate::shift`] reads it
//! first and writes it back after; a version 3 value names the uid that is root of the
//! namespace it is valid in (its rootid), and that uid is shifted like the file's owner.

use std::io;
use std::path::Path;

use rustix::fs::XattrFlags;

use crate::IdMap;

/// The xattr holding a file's capabilities (`struct vfs_cap_data`).
pub(crate) const XATTR: &str = "security.capability";

/// `VFS_CAP_REVISION_3` in the top byte of the little-endian `magic_etc` word.
const REVISION_3: u32 = 0x0300_0000;
const REVISION_MASK: u32 = 0xff00_0000;
/// `XATTR_CAPS_SZ_3`: magic_etc, two (permitted, inheritable) pairs, rootid.
const SIZE_3: usize = 24;
/// Where a v3 value keeps its rootid.
const ROOTID_AT: usize = 20;

/// The capability xattr of `path` (not followed), if it has one.
pub(crate) fn read(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 64];
    match rustix::fs::lgetxattr(path, XATTR, &mut buf) {
        Ok(n) => Ok(Some(buf[..n].to_vec())),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `value` back as the capability xattr of `path`. lamina runs as real root in
/// the initial namespace on a layer directory that is not idmapped, so the kernel stores
/// the value as given: a v2 value stays v2.
pub(crate) fn write(path: &Path, value: &[u8]) -> io::Result<()> {
    rustix::fs::lsetxattr(path, XATTR, value, XattrFlags::empty()).map_err(Into::into)
}

/// `value` as it must read once the file's owner went through `map`: a v3 value's
/// rootid becomes the host uid it maps to (the image's root becomes the mapped root, so
/// the capability is honoured in the container's namespace); v1 and v2 values, valid in
/// every namespace, are unchanged.
pub(crate) fn shifted(value: &[u8], map: &IdMap) -> Vec<u8> {
    let mut out = value.to_vec();
    let Some(magic) = value.get(..4) else {
        return out;
    };
    let magic = u32::from_le_bytes(magic.try_into().expect("four bytes"));
    if magic & REVISION_MASK == REVISION_3 && value.len() == SIZE_3 {
        let rootid = u32::from_le_bytes(
            value[ROOTID_AT..SIZE_3]
                .try_into()
                .expect("four bytes of rootid"),
        );
        out[ROOTID_AT..SIZE_3].copy_from_slice(&map.host_uid(rootid).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdMapping;

    const CAP_NET_RAW: u32 = 1 << 13;
    const EFFECTIVE: u32 = 0x1;

    fn map() -> IdMap {
        IdMap {
            uids: vec![IdMapping {
                ns_id: 0,
                host_id: 100_000,
                size: 65_536,
            }],
            gids: vec![IdMapping {
                ns_id: 0,
                host_id: 200_000,
                size: 65_536,
            }],
        }
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
    fn v2_and_unknown_values_are_unchanged() {
        assert_eq!(shifted(&v2(CAP_NET_RAW), &map()), v2(CAP_NET_RAW));
        let v1 = [0x00, 0x00, 0x00, 0x01, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(shifted(&v1, &map()), v1);
        assert_eq!(shifted(&[3], &map()), [3]);
        // A v3 magic with the wrong length is not a v3 value: left alone.
        let odd = v3(CAP_NET_RAW, 0)[..20].to_vec();
        assert_eq!(shifted(&odd, &map()), odd);
    }
}
