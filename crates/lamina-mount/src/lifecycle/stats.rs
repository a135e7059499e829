//! Garden's `stats`: what one container uses, and its disk limit. It runs holding the
//! container's ID, like every other step on it, so it never measures a container a
//! create is still making or a delete is taking apart.

use lamina_store::{ContainerUsage, DiskLimitRecord, Store};
use lamina_sys::Mounter;
use serde::Serialize;

use crate::RootfsError;
use crate::lifecycle::one_step::holding_id;
use crate::model::record;
use crate::{UpperBackend, uppers::isolated};

/// `{"disk_usage":{...}}`, GrootFS's shape (its stats_test.go).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub disk_usage: DiskUsage,
}

/// Every field is always present, so a caller never has to tell "no limit" from "field
/// missing": without a limit the quota is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiskUsage {
    /// The image's layers plus what the container wrote.
    pub total_bytes_used: u64,
    /// What the container wrote.
    pub exclusive_bytes_used: u64,
    /// What the container may still write in all: the limit, less the image for an
    /// inclusive one; 0 without a limit.
    pub quota_size_bytes: u64,
    /// The disk space this container holds the store to: its limit, or its image
    /// without one (what Garden adds up against `capacity`).
    pub committed_space_bytes: u64,
}

impl DiskUsage {
    fn new(usage: ContainerUsage, limit: Option<DiskLimitRecord>) -> Self {
        let image = usage
            .total_bytes_used
            .saturating_sub(usage.exclusive_bytes_used);
        let (quota_size_bytes, committed_space_bytes) = match limit {
            None => (0, image),
            Some(limit) if limit.exclude_image => (limit.bytes, limit.bytes),
            Some(limit) => (limit.bytes.saturating_sub(image), limit.bytes),
        };
        DiskUsage {
            total_bytes_used: usage.total_bytes_used,
            exclusive_bytes_used: usage.exclusive_bytes_used,
            quota_size_bytes,
            committed_space_bytes,
        }
    }
}

/// What container `id` uses: the image's layers plus what it wrote, which is its upper
/// wherever its model put it (its own filesystem, for an isolated upper). A quota
/// upper's writes are what its qgroup counts (as of the last btrfs transaction commit,
/// at most 30 s old), read from the kernel instead of walking the upper.
pub fn stats(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Stats, RootfsError> {
    holding_id(store, id, || {
        let container = record::read(store, id)?;
        let dirs = container.dirs(store);
        let quota = container.model().upper_backend() == Some(UpperBackend::Quota);
        // With quotas turned off the qgroup is gone: walk the upper as for the others.
        let counted = quota
            .then(|| isolated::quota_usage(mounter, &dirs).ok())
            .flatten();
        let written = match counted {
            Some(written) => written,
            None => lamina_store::disk_usage(&dirs.upper)?,
        };
        // A pending layer has no import record yet: what it will hold once whole.
        let (pending, mut record) = (
            crate::providers::pending_layers(store, &container.record.layers),
            container.record.clone(),
        );
        record.layers.retain(|c| !pending.contains(c));
        let mut usage = store.container_usage(&record, written)?;
        for c in &pending {
            usage.total_bytes_used += crate::providers::pending_bytes(store, c)?;
        }
        Ok(Stats {
            disk_usage: DiskUsage::new(usage, container.record.disk_limit),
        })
    })
}

/// What a container wrote, in bytes and inodes (containerd's snapshot `Usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub inodes: u64,
    /// The walk of the upper this answer made now (none when a filesystem of its own
    /// counted everything, or the caller's earlier walk was used).
    pub walk: Option<Walked>,
}

/// What a walk of an upper counted, and how long it took: its cost grows with what the
/// container wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    pub bytes: u64,
    pub inodes: u64,
    pub took: std::time::Duration,
}

/// What container `id` wrote, from the cheapest exact account its upper has, since
/// kubelet asks for every container every few seconds:
/// - an upper filesystem of its own (`isolated`, `isolated-memory`): `statfs` of it, its
///   used blocks and inodes. That counts the filesystem's own root, `lost+found` and the
///   overlay's work directory too: a few KiB and about 15 inodes more than a walk, never
///   less;
/// - a quota upper: its qgroup for the bytes (as of btrfs's last transaction commit, at
///   most 30 s old); a qgroup counts no inodes, so those are walked;
/// - any other upper, or an upper filesystem that is not mounted: walked, as
///   containerd's overlayfs snapshotter does.
///
/// The record is read and the filesystem asked while holding the ID; a walk, which can
/// take seconds on a large upper, runs after it is released, so a `Remove` or `Mounts`
/// of the container never waits for it. `earlier`, a walk of this container's upper the
/// caller still trusts, stands in for a walk; what a filesystem or qgroup of its own
/// counts is always read anew.
pub fn written(
    store: &Store,
    mounter: &dyn Mounter,
    id: &str,
    earlier: Option<Walked>,
) -> Result<Written, RootfsError> {
    let account = holding_id(store, id, || account_of(store, mounter, id))?;
    let walk = |dir: &std::path::Path| -> Result<(Walked, Option<Walked>), RootfsError> {
        if let Some(earlier) = earlier {
            return Ok((earlier, None));
        }
        let started = std::time::Instant::now();
        let (bytes, inodes) = lamina_store::disk_usage_and_inodes(dir)?;
        let walked = Walked {
            bytes,
            inodes,
            took: started.elapsed(),
        };
        Ok((walked, Some(walked)))
    };
    match account {
        Account::Counted(written) => Ok(written),
        Account::Bytes(bytes, upper) => {
            let (walked, walk) = walk(&upper)?;
            Ok(Written {
                bytes,
                inodes: walked.inodes,
                walk,
            })
        }
        Account::Walk(upper) => {
            let (walked, walk) = walk(&upper)?;
            Ok(Written {
                bytes: walked.bytes,
                inodes: walked.inodes,
                walk,
            })
        }
    }
}

/// What [`written`] can learn while holding the ID, and what is left to walk.
enum Account {
    Counted(Written),
    /// The bytes; the inodes of this upper are still to be counted.
    Bytes(u64, std::path::PathBuf),
    Walk(std::path::PathBuf),
}

fn account_of(store: &Store, mounter: &dyn Mounter, id: &str) -> Result<Account, RootfsError> {
    let container = record::read(store, id)?;
    let dirs = container.dirs(store);
    Ok(match container.model().upper_backend() {
        Some(UpperBackend::Disk | UpperBackend::Memory) => {
            let mount = dirs.upper_fs_mount();
            if !mounter.is_mountpoint(&mount)? {
                return Ok(Account::Walk(dirs.upper));
            }
            let fs = rustix::fs::statvfs(&mount)
                .map_err(|e| lamina_store::StoreError::errno("measuring", &mount)(e))?;
            // A tmpfs without a size reports no blocks at all: nothing to subtract from.
            if fs.f_blocks == 0 {
                return Ok(Account::Walk(dirs.upper));
            }
            Account::Counted(Written {
                bytes: fs.f_blocks.saturating_sub(fs.f_bfree) * fs.f_frsize,
                inodes: fs.f_files.saturating_sub(fs.f_ffree),
                walk: None,
            })
        }
        // Quotas turned off: the qgroup is gone.
        Some(UpperBackend::Quota) => match isolated::quota_usage(mounter, &dirs) {
            Ok(bytes) => Account::Bytes(bytes, dirs.upper),
            Err(_) => Account::Walk(dirs.upper),
        },
        None => Account::Walk(dirs.upper),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(total: u64, exclusive: u64) -> ContainerUsage {
        ContainerUsage {
            total_bytes_used: total,
            exclusive_bytes_used: exclusive,
        }
    }

    #[test]
    fn quota_and_committed_space_follow_the_limit() {
        let limit = |bytes, exclude_image| {
            Some(DiskLimitRecord {
                bytes,
                exclude_image,
            })
        };
        let none = DiskUsage::new(usage(100, 10), None);
        assert_eq!((none.quota_size_bytes, none.committed_space_bytes), (0, 90));
        let inclusive = DiskUsage::new(usage(100, 10), limit(1000, false));
        assert_eq!(
            (inclusive.quota_size_bytes, inclusive.committed_space_bytes),
            (910, 1000)
        );
        let exclusive = DiskUsage::new(usage(100, 10), limit(1000, true));
        assert_eq!(
            (exclusive.quota_size_bytes, exclusive.committed_space_bytes),
            (1000, 1000)
        );
    }
}
