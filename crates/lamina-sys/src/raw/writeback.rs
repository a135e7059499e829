//! `sync_file_range(2)`: write a file's dirty pages to the device without a flush of the
//! device's cache or a journal commit. What makes them durable is the next journal commit
//! on filesystems whose commit flushes the cache first (`ordered_journal.rs`).

use std::fs::File;
use std::os::fd::AsRawFd;

use rustix::io::Errno;

/// Starts writeback of every dirty page of `file`, waiting for none.
pub fn start(file: &File) -> Result<(), Errno> {
    range(file, libc::SYNC_FILE_RANGE_WRITE)
}

/// Writes every dirty page of `file` and waits until all of its writeback has ended:
/// on ext4 and xfs that is after the extents written into were converted from
/// unwritten, so the file's size and blocks are in the journal when this returns.
pub fn finish(file: &File) -> Result<(), Errno> {
    range(
        file,
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    )
}

fn range(file: &File, flags: libc::c_uint) -> Result<(), Errno> {
    // SAFETY: the descriptor is borrowed from a live `File`; offset 0 and length 0 mean
    // the whole file; the call reads and writes no memory of ours.
    let ret = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if ret == 0 {
        Ok(())
    } else {
        Err(super::last_errno())
    }
}
