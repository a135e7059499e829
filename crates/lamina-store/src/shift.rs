//! The chown fallback of a uid-mapped store: every file of a freshly unpacked layer is
//! given to the host ids its owner maps to, so the container's root owns what the
//! image's root owned. Used where the kernel cannot idmap layers at mount time.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{IdMap, file_caps};

/// Chowns everything under `dir` (and `dir`) through `map`, each inode once (a hardlink
/// shifted twice would map an already-mapped id). chown clears the setuid and setgid
/// bits and the file capabilities, so a file that had them gets them back afterwards:
/// `ping` keeps `cap_net_raw` and `su` its setuid bit.
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
    let regular = meta.file_type().is_file();
    // Only regular files carry capabilities the kernel honours.
    let caps = if regular {
        file_caps::read(path)?
    } else {
        None
    };
    std::os::unix::fs::lchown(
        path,
        Some(map.host_uid(meta.uid())),
        Some(map.host_gid(meta.gid())),
    )?;
    let special = meta.mode() & 0o6000;
    if special != 0 && !meta.file_type().is_symlink() {
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    }
    if let Some(caps) = caps {
        file_caps::write(path, &file_caps::shifted(&caps, map))?;
    }
    Ok(())
}
