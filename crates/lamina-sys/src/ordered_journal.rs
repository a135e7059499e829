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
    let Some(options) = super_options(major, minor) else {
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

/// The superblock options of the mount whose device is `major:minor`, from mountinfo.
fn super_options(major: u32, minor: u32) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    super_options_in(&info, &format!("{major}:{minor}"))
}

fn super_options_in(info: &str, device: &str) -> Option<String> {
    info.lines()
        .find(|line| line.split(' ').nth(2) == Some(device))
        .and_then(|line| line.split_once(" - "))
        .and_then(|(_, rest)| rest.split(' ').nth(2))
        .map(str::to_string)
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

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro
97 22 7:3 / /tmp/a rw,relatime shared:50 - ext4 /dev/loop3 rw,data=writeback,journal_async_commit
98 22 7:4 / /tmp/b\\040c rw - xfs /dev/loop4 rw,attr2,inode64,logdev=/dev/loop5,noquota
";

    #[test]
    fn the_superblock_options_are_the_mounts_of_that_device() {
        assert_eq!(
            super_options_in(INFO, "254:0").as_deref(),
            Some("rw,errors=remount-ro")
        );
        assert_eq!(
            super_options_in(INFO, "7:3").as_deref(),
            Some("rw,data=writeback,journal_async_commit")
        );
        assert!(super_options_in(INFO, "7:4").unwrap().contains("logdev="));
        assert_eq!(super_options_in(INFO, "7:9"), None);
    }
}
