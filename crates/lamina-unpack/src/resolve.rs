//! Opening directories beneath the layer root. Every lookup goes through openat2 with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so neither a `..` nor a symlink planted by an
//! earlier entry can carry a later entry out of the layer, or anywhere it did not name.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::entry_path::EntryPath;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Why a directory beneath the root could not be opened, with the offending prefix.
#[derive(Debug)]
pub enum ResolveError {
    Symlink(String),
    NotDir(String),
    Missing(String),
    Other(String, Errno),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Symlink(p) => {
                write!(f, "`{p}` is a symlink; refusing to write through it")
            }
            ResolveError::NotDir(p) => write!(f, "`{p}` is not a directory"),
            ResolveError::Missing(p) => write!(f, "`{p}` does not exist in this layer"),
            ResolveError::Other(p, e) => write!(f, "opening `{p}`: {e}"),
        }
    }
}

/// An open layer root directory.
#[derive(Debug)]
pub struct LayerRoot {
    fd: OwnedFd,
}

impl LayerRoot {
    pub fn open(path: &Path) -> Result<Self, Errno> {
        let fd = rustix::fs::open(path, DIR_FLAGS, Mode::empty())?;
        Ok(Self { fd })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Opens the directory at `parts`, creating missing ones (mode 0755, owned by the
    /// unpacker; tars often omit directory entries, and a later entry fixes metadata).
    pub fn open_dir(&self, parts: &[Vec<u8>], create: bool) -> Result<OwnedFd, ResolveError> {
        let joined = if parts.is_empty() {
            b".".to_vec()
        } else {
            EntryPath::join(parts)
        };
        match rustix::fs::openat2(
            self.fd.as_fd(),
            joined.as_slice(),
            DIR_FLAGS,
            Mode::empty(),
            RESOLVE,
        ) {
            Ok(fd) => Ok(fd),
            // Take the slow walk to create what is missing or to name exactly what is wrong.
            Err(_) => self.walk(parts, create),
        }
    }

    fn walk(&self, parts: &[Vec<u8>], create: bool) -> Result<OwnedFd, ResolveError> {
        let mut cur = rustix::io::dup(&self.fd).map_err(|e| ResolveError::Other(".".into(), e))?;
        for (i, part) in parts.iter().enumerate() {
            let shown = || crate::shown(&EntryPath::join(&parts[..=i]));
            let open = |dir: &OwnedFd| {
                rustix::fs::openat2(
                    dir.as_fd(),
                    part.as_slice(),
                    DIR_FLAGS,
                    Mode::empty(),
                    RESOLVE,
                )
            };
            cur = match open(&cur) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(
                        cur.as_fd(),
                        part.as_slice(),
                        Mode::from_raw_mode(0o755),
                    ) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(ResolveError::Other(shown(), e)),
                    }
                    open(&cur).map_err(|e| classify(&cur, part, shown(), e))?
                }
                Err(e) => return Err(classify(&cur, part, shown(), e)),
            };
        }
        Ok(cur)
    }
}

/// Names what is wrong with `part` in `dir`. A symlink opened with O_NOFOLLOW|O_DIRECTORY
/// reports ENOTDIR, not ELOOP, so look at what is really there.
fn classify(dir: &OwnedFd, part: &[u8], path: String, errno: Errno) -> ResolveError {
    let is_symlink = rustix::fs::statat(dir, part, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
        });
    if is_symlink {
        return ResolveError::Symlink(path);
    }
    match errno {
        Errno::LOOP => ResolveError::Symlink(path),
        Errno::NOTDIR => ResolveError::NotDir(path),
        Errno::NOENT => ResolveError::Missing(path),
        e => ResolveError::Other(path, e),
    }
}
