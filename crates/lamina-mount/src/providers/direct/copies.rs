//! A flattened tree of copies, for a store whose layers keep their data in `objects/`:
//! a layer's stub holds no data to bind, and a hardlink into the layers (or to an
//! object) would show this image's tree in the link count of another image's files.
//! Regular files are copied (a reflink where the filesystem has them: `copy_file_range`),
//! symlinks and device nodes made again, each with its layer entry's owner, mode, xattrs
//! and times; the image's own hardlinks stay one inode.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_sys::{At, HostFs, Node, Stat};
use rustix::fs::{AtFlags, CWD, FileType, Timespec, Timestamps};

/// What the copies of one flattened tree share.
pub(super) struct Copies {
    /// The store's `objects/`, where a stub's data is.
    objects: PathBuf,
    /// Each layer inode already copied: the copy's path and inode, so another name of it
    /// in the image becomes a hardlink to that copy while the copy is still there.
    copied: HashMap<(u64, u64), (PathBuf, u64)>,
    /// The layer being laid is an import whose files may be stubs.
    pub(super) stubs: bool,
}

impl Copies {
    pub(super) fn new(objects: PathBuf) -> Self {
        Copies {
            objects,
            copied: HashMap::new(),
            stubs: false,
        }
    }

    /// Makes `to` a copy of the layer entry `from` (`st`, not a directory).
    pub(super) fn copy(
        &mut self,
        host: &dyn HostFs,
        from: &Path,
        st: &Stat,
        to: &Path,
    ) -> io::Result<()> {
        let key = (st.st_dev, st.st_ino);
        if let Some((first, ino)) = self.copied.get(&key)
            && fs::symlink_metadata(first).is_ok_and(|m| m.ino() == *ino)
        {
            return fs::hard_link(first, to);
        }
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {
                let stub = match self.stubs {
                    true => lamina_store::object_layers::stub_object(host, At::Path(from))?,
                    false => None,
                };
                let data = match stub {
                    Some(object) => self.objects.join(object),
                    None => from.to_path_buf(),
                };
                copy_data(&data, st.st_size as u64, to)?;
            }
            FileType::Symlink => std::os::unix::fs::symlink(fs::read_link(from)?, to)?,
            kind => {
                let node = match kind {
                    FileType::CharacterDevice => Node::Char {
                        major: rustix::fs::major(st.st_rdev),
                        minor: rustix::fs::minor(st.st_rdev),
                    },
                    FileType::BlockDevice => Node::Block {
                        major: rustix::fs::major(st.st_rdev),
                        minor: rustix::fs::minor(st.st_rdev),
                    },
                    FileType::Fifo => Node::Fifo,
                    _ => {
                        return Err(io::Error::other(format!(
                            "{}: neither file, directory, link nor device",
                            from.display()
                        )));
                    }
                };
                let (Some(dir), Some(name)) = (to.parent(), to.file_name()) else {
                    return Err(io::Error::other(format!("{}: no parent", to.display())));
                };
                let dir = fs::File::open(dir)?;
                host.mknod(dir.as_fd(), name, node, st.st_mode & 0o7777)?;
            }
        }
        copy_metadata(host, from, st, to)?;
        let ino = fs::symlink_metadata(to)?.ino();
        self.copied.insert(key, (to.to_path_buf(), ino));
        Ok(())
    }
}

/// Copies `len` bytes of `data` into a new file `to`.
fn copy_data(data: &Path, len: u64, to: &Path) -> io::Result<()> {
    let source = lamina_store::open_regular_file(data)?;
    let mut dest = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)?;
    // `io::copy` between files asks the kernel first (`copy_file_range`: a reflink on
    // xfs and btrfs), and never reads past what the layer's entry says.
    let copied = io::copy(&mut io::Read::take(&source, len), &mut dest)?;
    if copied != len {
        return Err(io::Error::other(format!(
            "{}: {copied} bytes where its layer says {len}",
            data.display()
        )));
    }
    Ok(())
}

/// Owner, mode (not a symlink's), xattrs other than overlay's, then times.
fn copy_metadata(host: &dyn HostFs, from: &Path, st: &Stat, to: &Path) -> io::Result<()> {
    host.chown(At::Path(to), st.st_uid, st.st_gid)?;
    let symlink = FileType::from_raw_mode(st.st_mode) == FileType::Symlink;
    if !symlink {
        host.set_mode(At::Path(to), st.st_mode & 0o7777)?;
    }
    super::copy_xattrs(host, from, to)?;
    let time = |sec: i64, nsec: u64| Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    let times = Timestamps {
        last_access: time(st.st_atime, st.st_atime_nsec),
        last_modification: time(st.st_mtime, st.st_mtime_nsec),
    };
    rustix::fs::utimensat(CWD, to, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}
