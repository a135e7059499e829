//! Reading the mount table (`/proc/self/mountinfo`): which mounts lie beneath a path, so
//! crash recovery can unmount whatever a dead process left before removing directories.
//! Its cost grows with every mount on the host, so no per-container hot path reads it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Whether `path` (not followed if a symlink) is the root of a mount: statx's
/// `STATX_ATTR_MOUNT_ROOT`. The directory a mount covers is not.
pub fn is_mount_root(path: &Path) -> rustix::io::Result<bool> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags};
    let stx = rustix::fs::statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let root = StatxAttributes::MOUNT_ROOT;
    Ok(stx.stx_attributes_mask.contains(root) && stx.stx_attributes.contains(root))
}

/// Mount points at or beneath `root`, deepest first (the order to unmount them in),
/// spelled under `root` as given. The table names mount points by their real paths, so
/// a store reached through a symlink (or `..`) is looked up at its canonical path and
/// what is found there is given back under `root`: else its mounts are never seen, never
/// unmounted, and what they hold is never removed.
pub fn mounts_under(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let info = std::fs::read("/proc/self/mountinfo")?;
    let canonical = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    Ok(mounts_under_in(&info, &canonical)
        .into_iter()
        .map(|m| match m.strip_prefix(&canonical) {
            Ok(rel) if canonical != root => root.join(rel),
            _ => m,
        })
        .collect())
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

/// A mount on this host (in this mount namespace) through which `dir` can be written,
/// other than `dir` itself and other than at `except`: an overlay with `dir` as its
/// upper, or a read-write bind of `dir`. A commit must not publish an upper a container
/// can still write (`lamina-mount`'s `refuse_upper_in_use`). One read of the mount table
/// per commit, and a `stat` of each read-write mount whose root could be `dir`.
///
/// An overlay's `upperdir` is matched as written when it was mounted: absolute, it must
/// be `dir`; relative (mounted from some directory), `dir` must end with it. A bind of a
/// directory above `dir`, or an upper given through another symlinked path, is not seen.
pub fn writable_mount_of(dir: &Path, except: &Path) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let info = std::fs::read("/proc/self/mountinfo")?;
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        // Nothing writes what is not there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let same_inode = |at: &Path| {
        at != dir
            && std::fs::metadata(at).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
    };
    // The mount table names mount points by their real paths: lamina's own mount, made
    // under a store reached through a symlink, is listed at its canonical path, and is
    // matched there too, or every commit of a container lamina mounted is refused.
    let canonical = std::fs::canonicalize(except).ok();
    let excepted = |at: &Path| at == except || canonical.as_deref() == Some(at);
    Ok(writable_mount_in(&info, dir, excepted, same_inode))
}

fn writable_mount_in(
    info: &[u8],
    dir: &Path,
    excepted: impl Fn(&Path) -> bool,
    same_inode: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    info.split(|&b| b == b'\n').find_map(|line| {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        // Mount point is the fifth field, its own options the sixth; after the lone
        // `-`: type, source, the filesystem's options.
        let dash = fields.iter().position(|f| *f == b"-")?;
        let at = unescape(fields.get(4)?);
        if excepted(&at) {
            return None;
        }
        let (kind, options) = (fields.get(dash + 1)?, fields.get(dash + 3)?);
        if *kind == b"overlay" {
            // Overlay escapes a comma (and a backslash) in a path with a backslash, which
            // mountinfo shows octal-escaped.
            let upper = options
                .split(|&b| b == b',')
                .find_map(|o| o.strip_prefix(b"upperdir="))
                .map(|raw| unbackslash(&unescape(raw)))?;
            let ours = if upper.is_absolute() {
                upper == dir
            } else {
                !upper.as_os_str().is_empty() && dir.ends_with(&upper)
            };
            return ours.then_some(at);
        }
        // A bind of `dir` has `dir`'s name as the last name of its root in the filesystem
        // (whatever comes before it: a btrfs subvolume's `/@var/...` does not end `dir`'s
        // path); a mount of a filesystem's root is looked at too. The rest are not stat'ed.
        // The device in the table is not compared: btrfs gives each subvolume a device of
        // its own that `stat` shows and the table does not, so no bind on btrfs would
        // match; `same_inode` compares what `stat` says on both sides.
        let read_write = fields.get(5)?.split(|&b| b == b',').any(|o| o == b"rw");
        let root_in_fs = unescape(fields.get(3)?);
        let candidate = root_in_fs == Path::new("/") || root_in_fs.file_name() == dir.file_name();
        (read_write && candidate && same_inode(&at)).then_some(at)
    })
}

/// A path with overlay's backslash escapes (`\,`, `\\`) taken out.
fn unbackslash(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut escaped = false;
    for &b in bytes {
        if b == b'\\' && !escaped {
            escaped = true;
            continue;
        }
        escaped = false;
        out.push(b);
    }
    PathBuf::from(OsString::from_vec(out))
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
    #[test]
    fn an_overlay_of_the_upper_or_a_bind_of_it_is_found_and_nothing_else_is() {
        use std::path::{Path, PathBuf};
        let info = b"36 35 98:0 / /mnt rw - ext4 /dev/vda rw\n\
90 36 0:50 / /s/images/snap-1/rootfs rw - overlay overlay rw,lowerdir=/s/l/a,upperdir=/s/images/snap-1/upper,workdir=/s/images/snap-1/work\n\
90 36 0:50 / /run/c\\040d/rootfs rw - overlay overlay rw,lowerdir=/s/l/a:/s/l/b,upperdir=/s/images/snap-1/upper,workdir=/s/images/snap-1/work\n\
91 36 0:51 / /other rw - overlay overlay rw,lowerdir=/s/l/a,upperdir=/s/images/snap-10/upper,workdir=/w\n\
92 36 98:0 /s/images/snap-3/upper /run/bind-ro ro,relatime - ext4 /dev/vda rw\n\
93 36 98:0 /s/images/snap-3/upper /run/bind-rw rw,relatime - ext4 /dev/vda rw\n\
96 36 98:0 /@var/s/images/snap-5/upper /run/bind-subvol rw,relatime - btrfs /dev/vda rw\n\
94 36 0:52 / /run/rel rw - overlay overlay rw,lowerdir=l,upperdir=snap-4/upper,workdir=w\n\
95 36 0:53 / /run/comma rw - overlay overlay rw,lowerdir=/l,upperdir=/s/a\\134\\054b/upper,workdir=/w\n";
        let lamina_own = Path::new("/s/images/snap-1/rootfs");
        // The binds are of snap-3's upper (the same inode).
        let found = |dir: &str| {
            let bind = |at: &Path| {
                (dir == "/s/images/snap-3/upper"
                    && (at == Path::new("/run/bind-ro") || at == Path::new("/run/bind-rw")))
                    || (dir == "/var/s/images/snap-5/upper" && at == Path::new("/run/bind-subvol"))
            };
            super::writable_mount_in(info, Path::new(dir), |at| at == lamina_own, bind)
        };
        assert_eq!(
            found("/s/images/snap-1/upper"),
            Some(PathBuf::from("/run/c d/rootfs")),
            "lamina's own mount is passed over, containerd's bind of it is not"
        );
        assert_eq!(
            found("/s/images/snap-3/upper"),
            Some(PathBuf::from("/run/bind-rw"))
        );
        assert_eq!(
            found("/s/images/snap-4/upper"),
            Some(PathBuf::from("/run/rel"))
        );
        assert_eq!(found("/s/a,b/upper"), Some(PathBuf::from("/run/comma")));
        assert_eq!(
            found("/var/s/images/snap-5/upper"),
            Some(PathBuf::from("/run/bind-subvol")),
            "a bind from a btrfs subvolume, whose root in the filesystem is not a tail of it"
        );
        let nothing = |dir: &str| {
            super::writable_mount_in(info, Path::new(dir), |at| at == lamina_own, |_| false)
        };
        assert_eq!(nothing("/s/images/snap-2/upper"), None);
        assert_eq!(nothing("/s/l/a"), None, "a lower is not an upper");
    }

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
