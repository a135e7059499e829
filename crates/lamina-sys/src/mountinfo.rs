//! Reading the mount table (`/proc/self/mountinfo`): which mounts lie beneath a path, so
//! crash recovery can unmount whatever a dead process left before removing directories.
//! Its cost grows with every mount on the host, so no per-container hot path reads it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Mount points at or beneath `root`, deepest first (the order to unmount them in).
pub fn mounts_under(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let info = std::fs::read("/proc/self/mountinfo")?;
    Ok(mounts_under_in(&info, root))
}

fn mounts_under_in(info: &[u8], root: &Path) -> Vec<PathBuf> {
    // mountinfo lists mounts in the order they were made. Deepest first, and among
    // siblings the latest first: an overlay is unmounted before the upper filesystem it
    // was mounted on top of (strategy `isolated`).
    let mut found: Vec<(usize, PathBuf)> = info
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape)
        .filter(|p| p.starts_with(root))
        .enumerate()
        .collect();
    found.sort_by_key(|(order, p)| std::cmp::Reverse((p.components().count(), *order)));
    let mut seen = std::collections::HashSet::new();
    found
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| seen.insert(p.clone()))
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (field[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_escaped_mounts_beneath_a_root_deepest_first() {
        let info = b"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
            30 22 0:40 / /s/images/a\\040b/rootfs rw - overlay overlay rw\n\
            31 22 0:41 / /s/shared/x rw - overlay overlay ro\n\
            32 31 0:41 / /s/shared/x/rootfs/inner rw - overlay overlay ro\n\
            33 22 0:42 / /sx rw - tmpfs tmpfs rw\n\
            34 22 0:43 / /s/images/c/upperfs rw - ext4 /dev/loop3 rw\n\
            35 22 0:44 / /s/images/c/rootfs rw - overlay overlay rw\n";
        assert_eq!(
            mounts_under_in(info, Path::new("/s")),
            vec![
                PathBuf::from("/s/shared/x/rootfs/inner"),
                PathBuf::from("/s/images/c/rootfs"),
                PathBuf::from("/s/images/c/upperfs"),
                PathBuf::from("/s/images/a b/rootfs"),
                PathBuf::from("/s/shared/x"),
            ]
        );
    }
}
