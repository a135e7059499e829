//! Whether a filesystem puts a direct write ahead of everything it logs after it, so
//! that a new file written with `O_DIRECT` and renamed into place needs no flush of its
//! own ([`crate::HostFs::write_new_direct`]). Only configurations known to hold pass,
//! checked on every call (three small reads; no state to go stale):
//! - ext4 with its journal inside the filesystem, as jbd2 names it
//!   (`/proc/fs/jbd2/<dev>-8`, inode 8 being ext4's journal): ext2, ext4 made without a
//!   journal or mounted `noload`, and an external journal device all lack it. Not with
//!   `journal_async_commit`, whose commit block is written without a flush before it.
//! - xfs with its log and data on one device: no `logdev=` (an external log), no
//!   `rtdev=` (a realtime device the log's flush does not cover).
//!
//! What the journal cannot see is checked on the open file instead (`STATX_DIOALIGN`,
//! in `host.rs`): ext4 quietly turns direct I/O into buffered I/O for encrypted files,
//! `data=journal` and inline data.

use std::path::Path;

const EXT4: u64 = 0xEF53;
const XFS: u64 = 0x5846_5342;
/// ext4's journal inode.
const EXT4_JOURNAL_INODE: u32 = 8;

pub(crate) fn orders_direct_writes(dir: &Path) -> bool {
    let Ok(fs) = rustix::fs::statfs(dir) else {
        return false;
    };
    let Ok(st) = rustix::fs::stat(dir) else {
        return false;
    };
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let Some(options) = crate::mountinfo::super_options(major, minor) else {
        return false;
    };
    let has = |option: &str| {
        options
            .split(',')
            .any(|o| o == option || o.starts_with(&format!("{option}=")))
    };
    match fs.f_type as u64 {
        EXT4 => {
            !has("journal_async_commit")
                && !has("noload")
                && !has("norecovery")
                && internal_journal(major, minor)
        }
        XFS => !has("logdev") && !has("rtdev"),
        _ => false,
    }
}

/// Whether jbd2 runs a journal for the block device `major:minor` from the filesystem's
/// own journal inode.
fn internal_journal(major: u32, minor: u32) -> bool {
    let Ok(link) = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")) else {
        return false;
    };
    let Some(name) = link.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    Path::new(&format!("/proc/fs/jbd2/{name}-{EXT4_JOURNAL_INODE}")).is_dir()
}
