//! The ownership and metadata calls lamina makes on files, and the writes and syncs
//! whose failure it must survive: the second half of the kernel seam, beside
//! [`crate::Mounter`].
//!
//! These are the calls that need privilege (chown to another user, device nodes,
//! `trusted.*` and `security.capability` xattrs) or whose errors carry meaning
//! (ENOSPC on a record's write, EIO on its fsync or a layer's syncfs). Going through
//! [`HostFs`] lets the fake record them — who a file would be owned by, which device
//! node a layer holds — without root, and fail any of them on demand.

use std::ffi::{OsStr, OsString};
use std::fmt::Debug;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Gid, Mode, OFlags, Uid, XattrFlags};
use rustix::io::Errno;

/// File status as `lstat` reports it (`struct stat`).
pub use rustix::fs::Stat;

/// Which object a call is about. None of the forms follows a final symlink.
#[derive(Debug, Clone, Copy)]
pub enum At<'a> {
    Path(&'a Path),
    /// The object open as this fd (a regular file or a directory). For `get_xattr` and
    /// `remove_xattr`, an `O_PATH` fd, which the `f*xattr` calls refuse (`EBADF`), is
    /// reached through its `/proc/self/fd` link, followed: the link names exactly the
    /// pinned inode. The other calls need an fd opened for reading or writing.
    Fd(BorrowedFd<'a>),
    /// `name` inside the directory open as the fd.
    Child(BorrowedFd<'a>, &'a OsStr),
}

impl At<'_> {
    /// A path naming the same object, for messages and the fake's records: through
    /// `/proc/self/fd` for the fd forms (the magic link pins the directory already
    /// resolved; the final component is not followed by the `l*` calls).
    pub fn path(&self) -> PathBuf {
        match self {
            At::Path(p) => p.to_path_buf(),
            At::Fd(fd) => proc_fd(*fd),
            At::Child(fd, name) => proc_fd(*fd).join(name),
        }
    }
}

fn proc_fd(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A special file an image may ship.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Char { major: u32, minor: u32 },
    Block { major: u32, minor: u32 },
    Fifo,
}

impl Node {
    /// Overlay's whiteout: a character device 0/0.
    pub const WHITEOUT: Node = Node::Char { major: 0, minor: 0 };

    pub fn file_type(self) -> FileType {
        match self {
            Node::Char { .. } => FileType::CharacterDevice,
            Node::Block { .. } => FileType::BlockDevice,
            Node::Fifo => FileType::Fifo,
        }
    }

    pub fn rdev(self) -> u64 {
        match self {
            Node::Char { major, minor } | Node::Block { major, minor } => {
                rustix::fs::makedev(major, minor)
            }
            Node::Fifo => 0,
        }
    }
}

/// Ownership, metadata, and durable-write calls on files.
pub trait HostFs: Send + Sync + Debug {
    /// Whether files may be given to other users here (real: the process is root).
    /// The store's permission tightening asks before it chowns its directories.
    fn may_chown(&self) -> bool;

    /// Sets the owner of `at` (a symlink itself, never its target).
    fn chown(&self, at: At<'_>, uid: u32, gid: u32) -> Result<(), Errno>;

    /// Creates the special file `name` in `dir` with permission bits `mode`.
    fn mknod(&self, dir: BorrowedFd<'_>, name: &OsStr, node: Node, mode: u32) -> Result<(), Errno>;

    fn set_xattr(&self, at: At<'_>, name: &OsStr, value: &[u8]) -> Result<(), Errno>;

    /// The value of xattr `name`; `None` when the object has none by that name or the
    /// filesystem has no xattrs.
    fn get_xattr(&self, at: At<'_>, name: &OsStr) -> Result<Option<Vec<u8>>, Errno>;

    fn list_xattrs(&self, at: At<'_>) -> Result<Vec<OsString>, Errno>;

    /// `lstat`: ownership, type and device number as the calls above left them.
    fn stat(&self, at: At<'_>) -> Result<Stat, Errno>;

    /// Writes all of `bytes` to `file` (which is `path`).
    fn write_all(&self, file: &File, path: &Path, bytes: &[u8]) -> Result<(), Errno>;

    /// `fsync` of `file` (which is `path`): a file's data, or a directory's entries.
    fn fsync(&self, file: &File, path: &Path) -> Result<(), Errno>;

    /// `syncfs` of the filesystem holding `dir` (which is `path`), reporting every write
    /// the device refused on it since `dir` was opened: open it before the writes it must
    /// answer for (a descriptor opened after an error someone else was told of misses it).
    fn syncfs(&self, dir: &File, path: &Path) -> Result<(), Errno>;

    /// Writes `file`'s (which is `path`'s) dirty pages to the device: starts that
    /// writeback (`wait` false), or finishes it and waits for it to end (`wait` true),
    /// with `sync_file_range`. No flush of the device's cache and no journal commit: only
    /// where [`HostFs::write_new_direct`] writes direct does the next journal commit
    /// (whose flush precedes its commit record) make these pages durable.
    fn write_back(&self, file: &File, path: &Path, wait: bool) -> Result<(), Errno>;

    /// Creates the file `path` holding `bytes`, padded with spaces to whole 4 KiB blocks,
    /// with `O_DIRECT`, where the filesystem's journal puts that write ahead of everything
    /// it logs later (journaled ext4 and xfs in the configurations `ordered_journal.rs`
    /// lists) and the file really bypasses the page cache. When this returns the bytes are
    /// on the device (in its cache at worst) and the file's size is in the journal, so the
    /// first commit that carries a later change — a rename of this file, a container's own
    /// fsync — carries this file whole too, and that commit's flush makes the bytes
    /// durable. No flush of its own: a buffered write could reach a commit as a name with
    /// size 0. `Ok(false)`: not such a filesystem or file; nothing is left behind.
    fn write_new_direct(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno>;

    /// Creates a symlink at `path` whose target is `bytes`, where the filesystem's
    /// journal is one [`HostFs::write_new_direct`] writes for: ext4 and xfs log a
    /// symlink's target with its creation (in the inode, or in a block the journal
    /// carries), so it is whole or absent after any crash and in the journal ahead of
    /// everything logged later — what the direct write gives, without its write to the
    /// device (`integration/tests/power_cut_flushes.rs` checks it at every flush).
    /// `Ok(false)`: not such a filesystem, or `bytes` too long for a target there
    /// (xfs takes 1023 bytes, ext4 a block less one), or not one (empty, or with a NUL);
    /// nothing is left behind.
    fn write_new_symlink(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno>;

    /// Makes the first `len` bytes of `into` (which is `path`) share `from`'s extents,
    /// where the kernel finds the bytes equal (`FIDEDUPERANGE`, safe on files in use).
    /// Returns the bytes now shared. `EOPNOTSUPP`/`EINVAL`: the filesystem has no
    /// shared extents (ext4, tmpfs).
    fn share_extents(&self, from: &File, into: &File, path: &Path, len: u64) -> Result<u64, Errno>;

    /// Seals `file` (which is `path`, open read-only, no writer anywhere) with fs-verity:
    /// SHA-256 over 4 KiB blocks, the digest composefs names objects by. Already sealed
    /// is success. `EOPNOTSUPP`/`ENOTTY`: no fs-verity here (this VM's kernel has none).
    fn enable_verity(&self, file: &File, path: &Path) -> Result<(), Errno>;

    /// Sets the permission bits of `at` to `mode & 0o7777`. A symlink is refused
    /// (`EOPNOTSUPP`): its mode means nothing, and following it would change its target.
    fn set_mode(&self, at: At<'_>, mode: u32) -> Result<(), Errno>;

    /// Removes xattr `name` of `at`; one it does not have is success.
    fn remove_xattr(&self, at: At<'_>, name: &OsStr) -> Result<(), Errno>;

    /// Copies bytes `from[offset..offset + len]` to `into` (which is `path`) at its
    /// position, in the kernel (a reflink where the filesystem shares extents). Returns
    /// the bytes copied, fewer at `from`'s end; `EXDEV`/`EOPNOTSUPP`/`EINVAL`: no
    /// in-kernel copy between these files, the caller reads and writes.
    fn copy_range(
        &self,
        from: &File,
        offset: u64,
        into: &File,
        path: &Path,
        len: u64,
    ) -> Result<u64, Errno>;
}

/// One page-aligned block, as `O_DIRECT` needs its buffers.
#[repr(C, align(4096))]
struct Block([u8; 4096]);

/// The host as it is: every call goes to the kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

/// Large enough for any xattr value the kernel stores (XATTR_SIZE_MAX).
const XATTR_MAX: usize = 65536;

impl HostFs for RealHost {
    fn may_chown(&self) -> bool {
        rustix::process::geteuid().is_root()
    }

    fn chown(&self, at: At<'_>, uid: u32, gid: u32) -> Result<(), Errno> {
        let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        match at {
            At::Path(p) => rustix::fs::chownat(CWD, p, uid, gid, AtFlags::SYMLINK_NOFOLLOW),
            At::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
            At::Child(fd, name) => {
                rustix::fs::chownat(fd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            }
        }
    }

    fn mknod(&self, dir: BorrowedFd<'_>, name: &OsStr, node: Node, mode: u32) -> Result<(), Errno> {
        rustix::fs::mknodat(
            dir,
            name,
            node.file_type(),
            Mode::from_raw_mode(mode),
            node.rdev(),
        )
    }

    fn set_xattr(&self, at: At<'_>, name: &OsStr, value: &[u8]) -> Result<(), Errno> {
        match at {
            At::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, XattrFlags::empty()),
            other => rustix::fs::lsetxattr(other.path(), name, value, XattrFlags::empty()),
        }
    }

    fn get_xattr(&self, at: At<'_>, name: &OsStr) -> Result<Option<Vec<u8>>, Errno> {
        let size = || match at {
            At::Fd(fd) => match rustix::fs::fgetxattr_query(fd, name) {
                Err(Errno::BADF) => rustix::fs::getxattr_query(proc_fd(fd), name),
                got => got,
            },
            other => rustix::fs::lgetxattr_query(other.path(), name),
        };
        let get = |buf: &mut [u8]| match at {
            At::Fd(fd) => match rustix::fs::fgetxattr(fd, name, &mut *buf) {
                Err(Errno::BADF) => rustix::fs::getxattr(proc_fd(fd), name, buf),
                got => got,
            },
            other => rustix::fs::lgetxattr(other.path(), name, buf),
        };
        // Asked for its size first: most lookups find nothing (a commit asks every file of
        // an upper for overlay's metacopy mark), and a value is read into a buffer of its
        // size. One that grows between the two calls is asked again, then read whole.
        for attempt in 0..3 {
            let size = match size() {
                Ok(size) => size,
                Err(Errno::NODATA | Errno::NOTSUP) => return Ok(None),
                Err(e) => return Err(e),
            };
            let mut buf = vec![0u8; if attempt < 2 { size } else { XATTR_MAX }];
            match get(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(Some(buf));
                }
                Err(Errno::RANGE) => continue,
                Err(Errno::NODATA | Errno::NOTSUP) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Err(Errno::RANGE)
    }

    fn list_xattrs(&self, at: At<'_>) -> Result<Vec<OsString>, Errno> {
        let mut buf = vec![0u8; XATTR_MAX];
        let got = match at {
            At::Fd(fd) => rustix::fs::flistxattr(fd, &mut buf),
            other => rustix::fs::llistxattr(other.path(), &mut buf),
        };
        let n = match got {
            Ok(n) => n,
            Err(Errno::NOTSUP) => 0,
            Err(e) => return Err(e),
        };
        Ok(buf[..n]
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| OsStr::from_bytes(n).to_os_string())
            .collect())
    }

    fn stat(&self, at: At<'_>) -> Result<Stat, Errno> {
        match at {
            At::Path(p) => rustix::fs::statat(CWD, p, AtFlags::SYMLINK_NOFOLLOW),
            At::Fd(fd) => rustix::fs::fstat(fd),
            At::Child(fd, name) => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW),
        }
    }

    fn write_all(&self, mut file: &File, _path: &Path, bytes: &[u8]) -> Result<(), Errno> {
        file.write_all(bytes).map_err(|e| io_errno(&e))
    }

    fn fsync(&self, file: &File, _path: &Path) -> Result<(), Errno> {
        rustix::fs::fsync(file.as_fd())
    }

    fn syncfs(&self, dir: &File, _path: &Path) -> Result<(), Errno> {
        rustix::fs::syncfs(dir.as_fd())
    }

    fn write_back(&self, file: &File, _path: &Path, wait: bool) -> Result<(), Errno> {
        if wait {
            crate::raw::writeback::finish(file)
        } else {
            crate::raw::writeback::start(file)
        }
    }

    fn share_extents(
        &self,
        from: &File,
        into: &File,
        _path: &Path,
        len: u64,
    ) -> Result<u64, Errno> {
        crate::raw::dedupe::share_extents(from, into, len)
    }

    fn enable_verity(&self, file: &File, _path: &Path) -> Result<(), Errno> {
        crate::raw::verity::enable_verity(file)
    }

    fn set_mode(&self, at: At<'_>, mode: u32) -> Result<(), Errno> {
        let mode = Mode::from_raw_mode(mode & 0o7777);
        let (dir, name) = match at {
            At::Fd(fd) => return rustix::fs::fchmod(fd, mode),
            At::Path(p) => (CWD, p.as_os_str()),
            At::Child(fd, name) => (fd, name),
        };
        // Pinned without following a final symlink, then changed through the pin: no
        // swap between the look and the change reaches another file.
        let pinned = rustix::fs::openat(
            dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        if FileType::from_raw_mode(rustix::fs::fstat(&pinned)?.st_mode) == FileType::Symlink {
            return Err(Errno::OPNOTSUPP);
        }
        rustix::fs::chmodat(CWD, proc_fd(pinned.as_fd()), mode, AtFlags::empty())
    }

    fn remove_xattr(&self, at: At<'_>, name: &OsStr) -> Result<(), Errno> {
        let removed = match at {
            At::Fd(fd) => match rustix::fs::fremovexattr(fd, name) {
                Err(Errno::BADF) => rustix::fs::removexattr(proc_fd(fd), name),
                removed => removed,
            },
            other => rustix::fs::lremovexattr(other.path(), name),
        };
        match removed {
            Ok(()) | Err(Errno::NODATA) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn copy_range(
        &self,
        from: &File,
        offset: u64,
        into: &File,
        _path: &Path,
        len: u64,
    ) -> Result<u64, Errno> {
        let mut at = offset;
        let want = usize::try_from(len).unwrap_or(usize::MAX);
        rustix::fs::copy_file_range(from, Some(&mut at), into, None, want).map(|n| n as u64)
    }

    fn write_new_symlink(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno> {
        if bytes.is_empty() || bytes.contains(&0) || bytes.len() > SYMLINK_MAX {
            return Ok(false);
        }
        let dir = parent_dir(path);
        if !crate::ordered_journal::orders_direct_writes(dir) {
            return Ok(false);
        }
        match rustix::fs::symlink(bytes, path) {
            Ok(()) => Ok(true),
            Err(Errno::NAMETOOLONG) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn write_new_direct(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno> {
        let dir = parent_dir(path);
        if !crate::ordered_journal::orders_direct_writes(dir) {
            return Ok(false);
        }
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::DIRECT | OFlags::CLOEXEC;
        let file = match rustix::fs::open(path, flags, Mode::from_raw_mode(0o666)) {
            Ok(fd) => File::from(fd),
            Err(Errno::INVAL) => return Ok(false),
            Err(e) => return Err(e),
        };
        let written = if direct_io_honoured(&file) {
            write_blocks(&file, bytes).map(|()| true)
        } else {
            Ok(false)
        };
        match written {
            Ok(true) => Ok(true),
            // Not direct after all, or blocks this size are not aligned for the device:
            // the caller takes the fsync path.
            Ok(false) | Err(Errno::INVAL) => {
                let _ = std::fs::remove_file(path);
                Ok(false)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }
}

/// Whether writes to `file` really bypass the page cache in 4 KiB blocks: ext4 falls back
/// to buffered I/O without a word for encrypted files, `data=journal` and inline data,
/// and says so only here (a zero `dio_offset_align`); a device with larger sectors needs
/// larger blocks.
fn direct_io_honoured(file: &File) -> bool {
    let Ok(st) = rustix::fs::statx(
        file,
        "",
        AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::DIOALIGN,
    ) else {
        return false;
    };
    let divides_block = |align: u32| align != 0 && BLOCK.is_multiple_of(align);
    st.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() != 0
        && divides_block(st.stx_dio_offset_align)
        && divides_block(st.stx_dio_mem_align)
}

/// The directory `path` is in (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The block size records are padded to and written in.
const BLOCK: u32 = 4096;

/// The longest symlink target any filesystem here takes (ext4's with 4 KiB blocks; xfs
/// refuses 1024 bytes and more with `ENAMETOOLONG`).
const SYMLINK_MAX: usize = 4095;

/// `bytes` as whole aligned blocks, the last padded with spaces.
fn write_blocks(mut file: &File, bytes: &[u8]) -> Result<(), Errno> {
    let mut block = Box::new(Block([b' '; 4096]));
    for chunk in bytes.chunks(block.0.len()) {
        block.0.fill(b' ');
        block.0[..chunk.len()].copy_from_slice(chunk);
        file.write_all(&block.0).map_err(|e| io_errno(&e))?;
    }
    Ok(())
}

pub(crate) fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An xattr read back through every form of `At`, an `O_PATH` pin included: absent,
    /// empty (overlay's metacopy mark is), and a value (a redirect).
    #[test]
    fn xattrs_read_back_through_every_form_and_an_o_path_pin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let (empty, value, absent) = (
            OsStr::new("user.lamina.empty"),
            OsStr::new("user.lamina.value"),
            OsStr::new("user.lamina.absent"),
        );
        if RealHost.set_xattr(At::Path(&path), empty, b"") == Err(Errno::NOTSUP) {
            eprintln!("skipped: no user xattrs on {}", dir.path().display());
            return;
        }
        RealHost.set_xattr(At::Path(&path), value, b"/h").unwrap();
        let pinned =
            rustix::fs::open(&path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let parent = std::fs::File::open(dir.path()).unwrap();
        for at in [
            At::Path(&path),
            At::Fd(pinned.as_fd()),
            At::Child(parent.as_fd(), OsStr::new("f")),
        ] {
            assert_eq!(RealHost.get_xattr(at, empty).unwrap(), Some(Vec::new()));
            assert_eq!(RealHost.get_xattr(at, value).unwrap(), Some(b"/h".to_vec()));
            assert_eq!(RealHost.get_xattr(at, absent).unwrap(), None);
        }
        RealHost
            .remove_xattr(At::Fd(pinned.as_fd()), value)
            .unwrap();
        RealHost
            .remove_xattr(At::Fd(pinned.as_fd()), value)
            .unwrap();
        assert_eq!(RealHost.get_xattr(At::Path(&path), value).unwrap(), None);
    }

    /// `set_mode` changes a file's bits through a pin and refuses a symlink, whose target
    /// it must never reach.
    #[test]
    fn set_mode_changes_the_file_and_refuses_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("f"), dir.path().join("l"));
        std::fs::write(&file, b"x").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        RealHost.set_mode(At::Path(&file), 0o640).unwrap();
        assert_eq!(
            RealHost.stat(At::Path(&file)).unwrap().st_mode & 0o7777,
            0o640
        );
        assert_eq!(
            RealHost.set_mode(At::Path(&link), 0o777),
            Err(Errno::OPNOTSUPP)
        );
        assert_eq!(
            RealHost.stat(At::Path(&file)).unwrap().st_mode & 0o7777,
            0o640
        );
    }
}
