//! The FUSE filesystem of a lazy layer's objects: the root directory, and under it one
//! read-only regular file per object. Inode 1 is the root; object `n` is inode `n + 2`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};
use lamina_image::lazy::{Chunk, LazyFile, chunk_bytes};

/// Where a layer's chunks come from: the bytes `start..end` of its blob (a registry's
/// byte range in production).
pub trait ChunkSource: Send + Sync {
    fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>>;
}

/// One file the filesystem serves: its name, its chunks, and its sparse copy on disk
/// (`file.size` long; a chunk's bytes are in it once the chunk is marked present).
#[derive(Debug, Clone)]
pub struct LazyObject {
    pub name: OsString,
    pub file: LazyFile,
    pub copy: PathBuf,
}

/// An object and which of its chunks its copy holds.
#[derive(Debug)]
struct Served {
    object: LazyObject,
    copy: File,
    present: Mutex<Vec<bool>>,
}

/// The filesystem; [`ObjectsFs::mount`] serves it.
pub struct ObjectsFs {
    objects: Vec<Served>,
    by_name: HashMap<OsString, usize>,
    source: Arc<dyn ChunkSource>,
}

impl std::fmt::Debug for ObjectsFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectsFs")
            .field("objects", &self.objects.len())
            .finish_non_exhaustive()
    }
}

/// What the kernel may cache of names and attributes: nothing here ever changes.
const TTL: Duration = Duration::from_secs(3600);
const ROOT: INodeNo = INodeNo::ROOT;

impl ObjectsFs {
    /// Serves `objects` (their copies created, sparse, if missing), fetching from
    /// `source`. A name given twice is refused.
    pub fn new(objects: Vec<LazyObject>, source: Arc<dyn ChunkSource>) -> io::Result<Self> {
        let mut by_name = HashMap::new();
        let mut served = Vec::new();
        for (n, object) in objects.into_iter().enumerate() {
            if by_name.insert(object.name.clone(), n).is_some() {
                return Err(io::Error::other(format!(
                    "object {:?} given twice",
                    object.name
                )));
            }
            let copy = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&object.copy)?;
            copy.set_len(object.file.size)?;
            let chunks = object.file.chunks.len();
            served.push(Served {
                object,
                copy,
                present: Mutex::new(vec![false; chunks]),
            });
        }
        Ok(ObjectsFs {
            objects: served,
            by_name,
            source,
        })
    }

    /// Mounts the filesystem read-only at `mountpoint`, served by a thread of this
    /// process until the session is dropped (which unmounts it).
    pub fn mount(self, mountpoint: &std::path::Path) -> io::Result<fuser::BackgroundSession> {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::RO,
            fuser::MountOption::FSName("lamina-lazy".into()),
            fuser::MountOption::Subtype("lamina-lazy".into()),
        ];
        fuser::spawn_mount(self, mountpoint, &config)
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o555, 2)
        } else {
            let served = self.objects.get(ino.0.checked_sub(2)? as usize)?;
            (FileType::RegularFile, served.object.file.size, 0o444, 1)
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// Makes every chunk of object `n` covering `offset..end` present, fetching and
    /// checking the missing ones in order.
    fn fill(&self, n: usize, offset: u64, end: u64) -> io::Result<()> {
        let served = &self.objects[n];
        let chunks = &served.object.file.chunks;
        // Held while filling: a chunk is fetched once, however many reads want it.
        let mut present = served.present.lock().unwrap_or_else(|e| e.into_inner());
        for (i, chunk) in chunks.iter().enumerate() {
            let covers = chunk.file_offset < end && offset < chunk.file_offset + chunk.size;
            if !covers || present[i] {
                continue;
            }
            let bytes = self.chunk(chunk)?;
            served.copy.write_all_at(&bytes, chunk.file_offset)?;
            present[i] = true;
        }
        Ok(())
    }

    fn chunk(&self, chunk: &Chunk) -> io::Result<Vec<u8>> {
        let member = if chunk.zeros {
            Vec::new()
        } else {
            self.source.fetch(chunk.member.0, chunk.member.1)?
        };
        chunk_bytes(&member, chunk).map_err(io::Error::other)
    }
}

impl Filesystem for ObjectsFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent == ROOT)
            .then(|| self.by_name.get(name))
            .flatten()
            .and_then(|n| self.attr(INodeNo(*n as u64 + 2)));
        match found {
            Some(attr) => reply.entry(&TTL, &attr, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self
            .attr(ino)
            .is_none_or(|a| a.kind != FileType::RegularFile)
        {
            return reply.error(Errno::ENOENT);
        }
        if flags.0 & libc_write_mask() != 0 {
            return reply.error(Errno::EROFS);
        }
        // What the page cache holds was checked: keep it across opens.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(n) = ino
            .0
            .checked_sub(2)
            .map(|n| n as usize)
            .filter(|n| *n < self.objects.len())
        else {
            return reply.error(Errno::ENOENT);
        };
        let file_size = self.objects[n].object.file.size;
        let end = offset.saturating_add(u64::from(size)).min(file_size);
        if offset >= end {
            return reply.data(&[]);
        }
        if let Err(e) = self.fill(n, offset, end) {
            tracing::warn!(object = ?self.objects[n].object.name, offset, error = %e, "a lazy read failed");
            return reply.error(Errno::EIO);
        }
        let mut buf = vec![0; (end - offset) as usize];
        match self.objects[n].copy.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, OsString::from(".")),
            (ROOT, FileType::Directory, OsString::from("..")),
        ]
        .into_iter()
        .chain(self.objects.iter().enumerate().map(|(n, s)| {
            (
                INodeNo(n as u64 + 2),
                FileType::RegularFile,
                s.object.name.clone(),
            )
        }));
        for (i, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }
}

/// `O_WRONLY | O_RDWR`: an open that could write.
fn libc_write_mask() -> i32 {
    0o1 | 0o2
}
