//! The chown fallback of a uid-mapped store: every file of a freshly unpacked layer is
//! given to the host ids its owner maps to, so the container's root owns what the
//! image's root owned. Used where the kernel cannot idmap layers at mount time.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;

use lamina_sys::{At, HostFs};
use rustix::fs::FileType;

use crate::{IdMap, file_caps};

/// Chowns everything under `dir` (and `dir`) through `map`, each inode once (a hardlink
/// shifted twice would map an already-mapped id). chown clears the setuid and setgid
/// bits and the file capabilities, so a file that had them gets them back afterwards:
/// `ping` keeps `cap_net_raw` and `su` its setuid bit.
///
/// Owners are read and set through `host` (the kernel seam), which on the fake records
/// them instead of chowning.
pub(crate) fn shift_ownership(host: &dyn HostFs, dir: &Path, map: &IdMap) -> io::Result<()> {
    let mut shifted = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    shift_one(host, dir, map, &mut shifted)?;
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let child = entry.path();
            shift_one(host, &child, map, &mut shifted)?;
            if entry.file_type()?.is_dir() {
                stack.push(child);
            }
        }
    }
    Ok(())
}

fn shift_one(
    host: &dyn HostFs,
    path: &Path,
    map: &IdMap,
    shifted: &mut HashSet<(u64, u64)>,
) -> io::Result<()> {
    let st = host.stat(At::Path(path))?;
    if !shifted.insert((st.st_dev, st.st_ino)) {
        return Ok(());
    }
    let kind = FileType::from_raw_mode(st.st_mode);
    // Only regular files carry capabilities the kernel honours.
    let caps = if kind == FileType::RegularFile {
        file_caps::read(host, path)?
    } else {
        None
    };
    host.chown(
        At::Path(path),
        map.host_uid(st.st_uid),
        map.host_gid(st.st_gid),
    )?;
    let special = st.st_mode & 0o6000;
    if special != 0 && kind != FileType::Symlink {
        host.set_mode(At::Path(path), st.st_mode)?;
    }
    if let Some(caps) = caps {
        file_caps::write(host, path, &file_caps::shifted(&caps, map))?;
    }
    Ok(())
}
