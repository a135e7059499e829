//! The chown fallback of a uid-mapped store: every file of a freshly unpacked layer is
//! given to the host ids its owner maps to, so the container's root owns what the
//! image's root owned. Used where the kernel cannot idmap layers at mount time.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::IdMap;

/// Chowns everything under `dir` (and `dir`) through `map`, each inode once (a hardlink
/// shifted twice would map an already-mapped id). chown clears setuid and setgid bits,
/// so a file that had them gets its mode back afterwards.
pub(crate) fn shift_ownership(dir: &Path, map: &IdMap) -> io::Result<()> {
    let mut shifted = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    shift_one(dir, map, &mut shifted)?;
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let child = entry.path();
            shift_one(&child, map, &mut shifted)?;
            if entry.file_type()?.is_dir() {
                stack.push(child);
            }
        }
    }
    Ok(())
}

fn shift_one(path: &Path, map: &IdMap, shifted: &mut HashSet<u64>) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if !shifted.insert(meta.ino()) {
        return Ok(());
    }
    std::os::unix::fs::lchown(
        path,
        Some(map.host_uid(meta.uid())),
        Some(map.host_gid(meta.gid())),
    )?;
    let special = meta.mode() & 0o6000;
    if special != 0 && !meta.file_type().is_symlink() {
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    }
    Ok(())
}
