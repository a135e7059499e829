//! Whether a filesystem puts a direct write ahead of everything it logs after it, so
//! that a new file written with `O_DIRECT` and renamed into place needs no flush of its
//! own ([`crate::HostFs::write_new_direct`]); the same journal logs a new symlink's
//! target with its name ([`crate::HostFs::write_new_symlink`]). Only configurations known
//! to hold pass, each asked of the filesystem itself — a create runs this, and the mount
//! table it could also be read from grows with every container on the host (with 300
//! overlays mounted, reading it was most of a create's CPU time). A process asks once per
//! mount (statx's unique mount ID): of the options below, a remount can change only
//! `barrier`, and under `nobarrier` no fsync reaches the disk either, so a kept answer
//! never skips a flush that would have made anything durable:
//! - ext4 with its journal inside the filesystem, as jbd2 names it
//!   (`/proc/fs/jbd2/<dev>-8`, inode 8 being ext4's journal): ext2, ext4 made without a
//!   journal and an external journal device all lack it. Not mounted `noload` or
//!   `norecovery` (no journal runs), nor with `journal_async_commit`, whose commit block
//!   is written without a flush before it, nor `nobarrier` (no flush or FUA at all): all
//!   read from the superblock's own `/proc/fs/ext4/<dev>/options`.
//! - xfs with its log and data on one device and no realtime section (a realtime
//!   device the log's flush does not cover), from `XFS_IOC_FSGEOMETRY`.
//!
//! What the journal cannot see is checked on the open file instead (`STATX_DIOALIGN`,
//! in `host.rs`): ext4 quietly turns direct I/O into buffered I/O for encrypted files,
//! `data=journal` and inline data.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};

const EXT4: u64 = 0xEF53;
const XFS: u64 = 0x5846_5342;
/// ext4's journal inode.
const EXT4_JOURNAL_INODE: u32 = 8;

pub(crate) fn orders_direct_writes(dir: &Path) -> bool {
    /// Mounts one process keeps answers for: a store's, and a few scratch ones in tests.
    const MOST_KEPT: usize = 64;
    static KEPT: Mutex<Vec<(MountKey, bool)>> = Mutex::new(Vec::new());
    // One open directory is keyed and asked: the answer is that mount's.
    let Ok(dir) = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let Some(key) = MountKey::of(&dir) else {
        return asked_of_filesystem(&dir);
    };
    if let Some((_, orders)) = lock(&KEPT).iter().find(|(k, _)| *k == key) {
        return *orders;
    }
    let orders = asked_of_filesystem(&dir);
    let mut kept = lock(&KEPT);
    if kept.len() >= MOST_KEPT {
        kept.clear();
    }
    kept.push((key, orders));
    orders
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): a 64-bit mount ID the kernel never reuses, where
/// `STATX_MNT_ID`'s is the lowest free one, given again to the next mount (of the same
/// loop device, say) once a mount is gone.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// The mount an open directory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MountKey {
    dev: u64,
    mount_id: u64,
}

impl MountKey {
    /// `None` where the kernel gives no unique mount ID: then every call asks.
    fn of(dir: &OwnedFd) -> Option<MountKey> {
        let st = rustix::fs::statx(
            dir,
            "",
            AtFlags::EMPTY_PATH,
            StatxFlags::BASIC_STATS | StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
        )
        .ok()?;
        (st.stx_mask & STATX_MNT_ID_UNIQUE != 0).then(|| MountKey {
            dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
            mount_id: st.stx_mnt_id,
        })
    }
}

fn asked_of_filesystem(dir: &OwnedFd) -> bool {
    let Ok(fs) = rustix::fs::fstatfs(dir) else {
        return false;
    };
    match fs.f_type as u64 {
        EXT4 => {
            let Ok(st) = rustix::fs::fstat(dir) else {
                return false;
            };
            let Some(name) = block_device_name(st.st_dev) else {
                return false;
            };
            let Ok(options) = std::fs::read_to_string(format!("/proc/fs/ext4/{name}/options"))
            else {
                return false;
            };
            let has = |option: &str| options.lines().any(|o| o == option);
            // `barrier` is printed unless the journal's commits go without their flush
            // and FUA (`nobarrier`, `barrier=0`): then nothing orders them after the
            // drive's cache. `noload` is shown as `norecovery`.
            has("barrier")
                && !has("journal_async_commit")
                && !has("norecovery")
                && internal_journal(&name)
        }
        XFS => crate::raw::xfs::geometry(dir.as_fd()).is_ok_and(|g| g.internal_log && !g.realtime),
        _ => false,
    }
}

/// The kernel's name for block device `dev` (`loop3`, `nvme0n1p2`, `dm-1`): what
/// `/proc/fs/ext4/` and `/proc/fs/jbd2/` call it.
fn block_device_name(dev: u64) -> Option<String> {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(link.file_name()?.to_str()?.to_owned())
}

/// Whether jbd2 runs a journal for block device `name` from the filesystem's own journal
/// inode.
fn internal_journal(name: &str) -> bool {
    Path::new(&format!("/proc/fs/jbd2/{name}-{EXT4_JOURNAL_INODE}")).is_dir()
}
