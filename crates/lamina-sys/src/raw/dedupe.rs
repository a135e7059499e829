//! `FIDEDUPERANGE` (ioctl_fideduperange(2)): make a range of one file share the extents of
//! the same range of another, after the kernel itself has compared the bytes. Safe on
//! files in use: the kernel locks both, compares, and remaps only what is equal, so a
//! reader never sees anything but the content the file already had.

use std::fs::File;
use std::os::fd::AsRawFd;

use rustix::io::Errno;

/// `_IOWR(0x94, 54, struct file_dedupe_range)`: the header is 24 bytes.
const FIDEDUPERANGE: libc::c_ulong = 0xC018_9436;

/// What one call may ask for. The kernel caps a request itself (btrfs at 16 MiB, others at
/// 1 GiB); asking in 16 MiB steps keeps every step within every filesystem's cap.
const STEP: u64 = 16 << 20;

/// `FILE_DEDUPE_RANGE_DIFFERS`: the ranges hold different bytes.
const DIFFERS: i32 = 1;

/// `struct file_dedupe_range` with its one `struct file_dedupe_range_info`.
#[repr(C)]
#[derive(Default)]
struct DedupeRange {
    src_offset: u64,
    src_length: u64,
    dest_count: u16,
    reserved1: u16,
    reserved2: u32,
    dest_fd: i64,
    dest_offset: u64,
    bytes_deduped: u64,
    status: i32,
    reserved: u32,
}

/// Makes the first `len` bytes of `into` share `from`'s extents. Returns the bytes now
/// shared: `len` when all of it was equal, less when the files differ from some step on
/// (the rest is left as it was). `EOPNOTSUPP`/`EINVAL`: the filesystem cannot share
/// extents (ext4, tmpfs) or the two are on different filesystems.
pub fn share_extents(from: &File, into: &File, len: u64) -> Result<u64, Errno> {
    let mut done = 0;
    while done < len {
        let step = STEP.min(len - done);
        let mut args = DedupeRange {
            src_offset: done,
            src_length: step,
            dest_count: 1,
            dest_fd: i64::from(into.as_raw_fd()),
            dest_offset: done,
            ..DedupeRange::default()
        };
        // SAFETY: both files are open for the call; `args` is a `file_dedupe_range`
        // header followed by exactly the one `file_dedupe_range_info` `dest_count` says,
        // which the kernel reads and writes only within the struct.
        let rc = unsafe { libc::ioctl(from.as_raw_fd(), FIDEDUPERANGE, &mut args as *mut _) };
        if rc < 0 {
            return Err(super::last_errno());
        }
        if args.status < 0 {
            return Err(Errno::from_raw_os_error(-args.status));
        }
        if args.status == DIFFERS || args.bytes_deduped == 0 {
            break;
        }
        done += args.bytes_deduped;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_and_its_one_entry_are_laid_out_as_the_kernel_reads_them() {
        assert_eq!(std::mem::size_of::<DedupeRange>(), 24 + 32);
        assert_eq!(std::mem::offset_of!(DedupeRange, dest_fd), 24);
        assert_eq!(std::mem::offset_of!(DedupeRange, status), 48);
    }
}
