//! `XFS_IOC_FSGEOMETRY` (`<xfs/xfs_fs.h>`): where an xfs filesystem keeps its log and
//! whether it has a realtime section — what `ordered_journal` needs to know, answered by
//! the filesystem in one call instead of by reading the whole mount table.

use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::io::Errno;

/// `_IOR('X', 126, struct xfs_fsop_geom)`: the v5 geometry (kernel 5.1 and later).
const XFS_IOC_FSGEOMETRY: libc::c_ulong = 0x8100_587E;

/// `struct xfs_fsop_geom` (256 bytes); only the fields read are named.
#[repr(C)]
struct FsopGeom {
    /// blocksize, rtextsize, agblocks, agcount, logblocks, sectsize, inodesize, imaxpct.
    sizes: [u32; 8],
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    /// The log's first block inside the data device; 0 when the log is on a device of
    /// its own.
    logstart: u64,
    rest: [u8; 256 - 64],
}

/// Where the log and the realtime section of the xfs filesystem behind `fd` live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// The log is inside the data device (`mkfs.xfs` without `-l logdev=`).
    pub internal_log: bool,
    /// The filesystem has a realtime section (`mkfs.xfs -r rtdev=`).
    pub realtime: bool,
}

/// The geometry of the xfs filesystem `fd` (any file or directory on it) is on.
pub fn geometry(fd: BorrowedFd<'_>) -> Result<Geometry, Errno> {
    let mut geom = FsopGeom {
        sizes: [0; 8],
        datablocks: 0,
        rtblocks: 0,
        rtextents: 0,
        logstart: 0,
        rest: [0; 256 - 64],
    };
    // SAFETY: `fd` is live for the borrow; `geom` is a writable, properly laid out
    // 256-byte `struct xfs_fsop_geom`, the size the request number encodes, so the
    // kernel writes within it.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            XFS_IOC_FSGEOMETRY,
            &mut geom as *mut FsopGeom,
        )
    };
    if rc != 0 {
        return Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::INVAL));
    }
    Ok(Geometry {
        internal_log: geom.logstart != 0,
        realtime: geom.rtblocks != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_number_encodes_the_structure_size() {
        assert_eq!(std::mem::size_of::<FsopGeom>(), 256);
        assert_eq!((XFS_IOC_FSGEOMETRY >> 16) & 0x3fff, 256);
    }
}
