//! The fake's [`HostFs`] half. Ownership, device nodes and xattrs are recorded per inode
//! (so they follow a staged layer through the rename that publishes it, and hardlinks
//! share them) and never reach the kernel: no chown, no mknod of a device, no `trusted.*`
//! xattr — which is what lets a store built on the fake import images as any user.
//! A device node is a regular empty file on disk; [`HostFs::stat`] reports it as the
//! node and every file with the owner it was given. Writes happen for real (tests read
//! the records back); fsync and syncfs do nothing but can be failed.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::fake::{DirId, FakeMounter};
use crate::{At, Call, FakeCall, HostFs, Node, RealHost, Stat};

/// What the fake was asked to set on one inode.
#[derive(Debug, Default, Clone)]
pub(crate) struct FileMeta {
    owner: Option<(u32, u32)>,
    node: Option<Node>,
    xattrs: BTreeMap<OsString, Vec<u8>>,
    /// Sealed with fs-verity through the seam.
    verity: bool,
}

/// The xattr the kernel removes on every chown.
const CAPABILITY: &str = "security.capability";

fn id_of(at: At<'_>) -> Result<DirId, Errno> {
    let st = RealHost.stat(at)?;
    Ok((st.st_dev, st.st_ino))
}

/// The path `at` names, with `/proc/self/fd` links read, for records and predicates.
fn shown(at: At<'_>) -> PathBuf {
    let link = |fd: BorrowedFd<'_>| {
        std::fs::read_link(At::Fd(fd).path()).unwrap_or_else(|_| At::Fd(fd).path())
    };
    match at {
        At::Path(p) => p.to_path_buf(),
        At::Fd(fd) => link(fd),
        At::Child(fd, name) => link(fd).join(name),
    }
}

impl FakeMounter {
    /// The owner `path` was given through the seam, if any.
    pub fn owner_of(&self, path: &Path) -> Option<(u32, u32)> {
        self.meta_of(path).and_then(|m| m.owner)
    }

    /// The special file `path` stands for, if the seam made one there.
    pub fn node_of(&self, path: &Path) -> Option<Node> {
        self.meta_of(path).and_then(|m| m.node)
    }

    /// The value of xattr `name` set on `path` through the seam.
    pub fn xattr_of(&self, path: &Path, name: &str) -> Option<Vec<u8>> {
        self.meta_of(path)
            .and_then(|m| m.xattrs.get(OsStr::new(name)).cloned())
    }

    /// Whether `path` was sealed with fs-verity through the seam.
    pub fn has_verity(&self, path: &Path) -> bool {
        self.meta_of(path).is_some_and(|m| m.verity)
    }

    fn meta_of(&self, path: &Path) -> Option<FileMeta> {
        let id = id_of(At::Path(path)).ok()?;
        self.lock().files.get(&id).cloned()
    }

    /// Checks faults for `call` on `at`, records it, and runs `change` on the inode's
    /// metadata.
    fn record(
        &self,
        call: Call,
        at: At<'_>,
        record: impl FnOnce(PathBuf) -> Option<FakeCall>,
        change: impl FnOnce(&mut FileMeta),
    ) -> Result<(), Errno> {
        let path = shown(at);
        let mut state = self.lock();
        state.enter(call, &path, record(path.clone()))?;
        let id = id_of(at)?;
        change(state.files.entry(id).or_default());
        Ok(())
    }
}

impl HostFs for FakeMounter {
    fn may_chown(&self) -> bool {
        true
    }

    fn chown(&self, at: At<'_>, uid: u32, gid: u32) -> Result<(), Errno> {
        let record = |path| Some(FakeCall::Chown { path, uid, gid });
        self.record(Call::Chown, at, record, |meta| {
            meta.owner = Some((uid, gid));
            meta.xattrs.remove(OsStr::new(CAPABILITY));
        })
    }

    fn mknod(&self, dir: BorrowedFd<'_>, name: &OsStr, node: Node, mode: u32) -> Result<(), Errno> {
        let at = At::Child(dir, name);
        let path = shown(at);
        let mut state = self.lock();
        let record = FakeCall::Mknod {
            path: path.clone(),
            node,
        };
        state.enter(Call::Mknod, &path, Some(record))?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        drop(rustix::fs::openat(
            dir,
            name,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?);
        // A new inode: whatever was recorded for an earlier one of that number is gone.
        let meta = FileMeta {
            node: Some(node),
            ..FileMeta::default()
        };
        state.files.insert(id_of(at)?, meta);
        Ok(())
    }

    fn set_xattr(&self, at: At<'_>, name: &OsStr, value: &[u8]) -> Result<(), Errno> {
        let xattr = name.to_os_string();
        let record = |path| {
            Some(FakeCall::SetXattr {
                path,
                name: xattr.clone(),
            })
        };
        self.record(Call::SetXattr, at, record, |meta| {
            meta.xattrs.insert(xattr.clone(), value.to_vec());
        })
    }

    fn get_xattr(&self, at: At<'_>, name: &OsStr) -> Result<Option<Vec<u8>>, Errno> {
        let mut value = None;
        self.record(
            Call::GetXattr,
            at,
            |_| None,
            |meta| {
                value = meta.xattrs.get(name).cloned();
            },
        )?;
        Ok(value)
    }

    fn list_xattrs(&self, at: At<'_>) -> Result<Vec<OsString>, Errno> {
        let mut names = Vec::new();
        self.record(
            Call::ListXattrs,
            at,
            |_| None,
            |meta| {
                names = meta.xattrs.keys().cloned().collect();
            },
        )?;
        Ok(names)
    }

    fn stat(&self, at: At<'_>) -> Result<Stat, Errno> {
        let mut st = RealHost.stat(at)?;
        let mut meta = FileMeta::default();
        self.record(Call::Stat, at, |_| None, |m| meta = m.clone())?;
        if let Some((uid, gid)) = meta.owner {
            st.st_uid = uid;
            st.st_gid = gid;
        }
        if let Some(node) = meta.node {
            st.st_mode = node.file_type().as_raw_mode() | (st.st_mode & 0o7777);
            st.st_rdev = node.rdev();
        }
        Ok(st)
    }

    fn write_all(&self, mut file: &File, path: &Path, bytes: &[u8]) -> Result<(), Errno> {
        let record = FakeCall::Write(path.to_path_buf());
        self.lock().enter(Call::Write, path, Some(record))?;
        file.write_all(bytes)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
    }

    /// As [`HostFs::write_new_direct`]: made for real where the fake kernel's journal
    /// is ordered, and never otherwise; recorded as a write (and failed as one), and
    /// refused past xfs's 1023 bytes, so the direct write behind it is tried too.
    fn write_new_symlink(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno> {
        const XFS_SYMLINK_MAX: usize = 1023;
        if !self.lock().kernel.ordered_direct_writes
            || bytes.is_empty()
            || bytes.contains(&0)
            || bytes.len() > XFS_SYMLINK_MAX
        {
            return Ok(false);
        }
        let record = FakeCall::Write(path.to_path_buf());
        self.lock().enter(Call::Write, path, Some(record))?;
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(bytes), path)
            .map(|()| true)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
    }

    /// By default the fake's filesystem journals nothing in order: writers take their
    /// durable path, whose calls it records and can fail. Where the fake kernel says the
    /// journal orders direct writes ([`crate::FakeKernel::ordered_direct_writes`]), the
    /// file is written (buffered: the fake has no device).
    fn write_new_direct(&self, path: &Path, bytes: &[u8]) -> Result<bool, Errno> {
        if !self.lock().kernel.ordered_direct_writes {
            return Ok(false);
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        std::io::Write::write_all(&mut file, bytes)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        Ok(true)
    }

    /// Recorded, and done for real (the fake's files are real files).
    fn share_extents(&self, from: &File, into: &File, path: &Path, len: u64) -> Result<u64, Errno> {
        let record = FakeCall::ShareExtents(path.to_path_buf());
        self.lock().enter(Call::ShareExtents, path, Some(record))?;
        RealHost.share_extents(from, into, path, len)
    }

    /// Sealing is recorded on the inode, where the fake kernel has fs-verity
    /// ([`crate::FakeKernel::fs_verity`]); the file is not touched.
    fn enable_verity(&self, file: &File, path: &Path) -> Result<(), Errno> {
        if !self.lock().kernel.fs_verity {
            return Err(Errno::OPNOTSUPP);
        }
        self.record(
            Call::EnableVerity,
            At::Fd(std::os::fd::AsFd::as_fd(file)),
            |_| Some(FakeCall::EnableVerity(path.to_path_buf())),
            |meta| meta.verity = true,
        )
    }

    /// Recorded, and done for real (the fake's files are real files).
    fn set_mode(&self, at: At<'_>, mode: u32) -> Result<(), Errno> {
        let path = shown(at);
        let record = FakeCall::SetMode(path.clone(), mode & 0o7777);
        self.lock().enter(Call::SetMode, &path, Some(record))?;
        RealHost.set_mode(at, mode)
    }

    fn remove_xattr(&self, at: At<'_>, name: &OsStr) -> Result<(), Errno> {
        self.record(
            Call::SetXattr,
            at,
            |_| None,
            |meta| {
                meta.xattrs.remove(name);
            },
        )
    }

    /// Recorded, and done for real.
    fn copy_range(
        &self,
        from: &File,
        offset: u64,
        into: &File,
        path: &Path,
        len: u64,
    ) -> Result<u64, Errno> {
        let record = FakeCall::CopyRange(path.to_path_buf());
        self.lock().enter(Call::CopyRange, path, Some(record))?;
        RealHost.copy_range(from, offset, into, path, len)
    }

    fn fsync(&self, _file: &File, path: &Path) -> Result<(), Errno> {
        let record = FakeCall::Fsync(path.to_path_buf());
        self.lock().enter(Call::Fsync, path, Some(record))
    }

    fn syncfs(&self, _dir: &File, path: &Path) -> Result<(), Errno> {
        let record = FakeCall::Syncfs(path.to_path_buf());
        self.lock().enter(Call::Syncfs, path, Some(record))
    }

    fn write_back(&self, _file: &File, path: &Path, wait: bool) -> Result<(), Errno> {
        let record = FakeCall::WriteBack(path.to_path_buf(), wait);
        self.lock().enter(Call::WriteBack, path, Some(record))
    }
}
