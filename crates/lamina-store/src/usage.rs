//! Disk usage, as `du -x` counts it: allocated blocks, each inode once, never crossing
//! into another filesystem. `stats` reports a container's, `clean --threshold-bytes`
//! compares the store's with the operator's threshold.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;

use crate::{ContainerRecord, Store, StoreError};

/// Bytes allocated under `dir` on `dir`'s own filesystem (a mount beneath it is not
/// entered), each hardlinked inode counted once. A missing `dir` uses nothing; entries
/// that vanish mid-walk (a concurrent delete) are skipped.
pub fn disk_usage(dir: &Path) -> Result<u64, StoreError> {
    Ok(disk_usage_and_inodes(dir)?.0)
}

/// [`disk_usage`] and the number of inodes counted (containerd's snapshot `Usage`).
pub fn disk_usage_and_inodes(dir: &Path) -> Result<(u64, u64), StoreError> {
    let root = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(StoreError::io("measuring", dir)(e)),
    };
    // Only inodes that could be met twice are remembered — directories (a bind mount of
    // the same filesystem inside) and files with more than one link — so a tenant's
    // million single-link files cost a count, not a set entry each.
    let mut seen = HashSet::new();
    seen.insert(root.ino());
    let mut inodes = 1u64;
    let mut total = root.blocks() * 512;
    // Walked beneath `dir`, no symlink followed: a live upper's container can swap a
    // directory for a symlink to `/` while containerd asks for its usage.
    let tree = match crate::beneath::Tree::open(dir) {
        Ok(tree) => tree,
        // Removed since it was looked at: it uses nothing now.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(StoreError::io("measuring", dir)(e)),
    };
    tree.walk(|entry| {
        let stat = entry.stat;
        if stat.st_dev != root.dev() {
            return Ok(false);
        }
        let is_dir = stat.st_mode & 0o170000 == 0o040000;
        if (is_dir || stat.st_nlink > 1) && !seen.insert(stat.st_ino) {
            return Ok(false);
        }
        inodes += 1;
        total += stat.st_blocks as u64 * 512;
        Ok(true)
    })
    .map_err(StoreError::io("measuring", dir))?;
    Ok((total, inodes))
}

/// Garden's `stats`: what a container uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ContainerUsage {
    /// The image's layers (their uncompressed size) plus `exclusive_bytes_used`.
    pub total_bytes_used: u64,
    /// What the container wrote: its upper directory.
    pub exclusive_bytes_used: u64,
}

impl Store {
    /// What the container of `record`, which wrote `exclusive` bytes, uses. Layer sizes
    /// are the uncompressed sizes `import` recorded, the same numbers an inclusive disk
    /// limit subtracts.
    pub fn container_usage(
        &self,
        record: &ContainerRecord,
        exclusive: u64,
    ) -> Result<ContainerUsage, StoreError> {
        let mut image = 0;
        for layer in &record.layers {
            image += self.layer_record(layer)?.size;
        }
        Ok(ContainerUsage {
            total_bytes_used: image + exclusive,
            exclusive_bytes_used: exclusive,
        })
    }

    /// Everything the store holds on its own filesystem (layers, containers' uppers,
    /// isolated upper images as allocated, trash, tmp), as `du -x` counts it.
    pub fn usage(&self) -> Result<u64, StoreError> {
        disk_usage(self.root())
    }

    /// The size of the filesystem the store is on.
    pub fn filesystem_size(&self) -> Result<u64, StoreError> {
        let fs = rustix::fs::statvfs(self.root())
            .map_err(StoreError::errno("measuring", self.root()))?;
        Ok(fs.f_blocks * fs.f_frsize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardlinks_count_once_and_missing_dirs_use_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a"), vec![7u8; 64 * 1024]).unwrap();
        let one = disk_usage(&dir).unwrap();
        fs::hard_link(dir.join("a"), dir.join("b")).unwrap();
        assert_eq!(disk_usage(&dir).unwrap(), one);
        fs::write(dir.join("c"), vec![7u8; 64 * 1024]).unwrap();
        assert!(disk_usage(&dir).unwrap() >= one + 64 * 1024);
        assert_eq!(disk_usage(&tmp.path().join("missing")).unwrap(), 0);
    }

    /// A store configured at a symlink is measured through it (guards `clean
    /// --threshold-bytes` against "Not a directory"); a symlink beneath is not followed.
    #[test]
    fn the_root_is_reached_through_a_symlink_and_nothing_beneath_is_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a"), vec![7u8; 64 * 1024]).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(disk_usage(&link).unwrap(), disk_usage(&dir).unwrap());
        let big = tmp.path().join("big");
        fs::create_dir(&big).unwrap();
        fs::write(big.join("b"), vec![7u8; 1024 * 1024]).unwrap();
        let before = disk_usage(&dir).unwrap();
        std::os::unix::fs::symlink(&big, dir.join("into-big")).unwrap();
        assert!(disk_usage(&dir).unwrap() < before + 1024 * 1024);
    }
}
