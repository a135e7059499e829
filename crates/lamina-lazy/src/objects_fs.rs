//! The FUSE filesystem of a lazy layer's objects: the root directory, and under it one
//! read-only regular file per object. Inode 1 is the root; object `n` is inode `n + 2`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};
use lamina_image::lazy::{LazyFile, chunk_from, inflate_member};

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

/// Where a chunk of an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Missing,
    /// One read is fetching it; the others wanting it wait for that one.
    Fetching,
    Present,
}

/// An object and which of its chunks its copy holds (for the life of this server: a
/// restarted one fetches again). The copy is opened per use, so a layer of many files
/// holds no descriptor per file.
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) object: LazyObject,
    pub(crate) state: Mutex<Vec<State>>,
    /// Signalled whenever a chunk stops being fetched (present, or missing again).
    pub(crate) settled: Condvar,
    /// Where the last read of it ended: a read that starts there reads on, and the
    /// chunks after it are fetched with it ([`READ_AHEAD_BYTES`]).
    last_end: AtomicU64,
    /// For each chunk, the chunks of this file in the same member as it (itself alone
    /// for a zeros chunk): a member is fetched and decompressed whole, so every chunk
    /// of it is claimed with any one of them.
    mates: Vec<std::ops::Range<usize>>,
}

/// For each of `chunks` (in file order, so chunks of one member are adjacent), the range
/// of those sharing its member.
fn member_mates(chunks: &[lamina_image::lazy::Chunk]) -> Vec<std::ops::Range<usize>> {
    let mut mates = Vec::with_capacity(chunks.len());
    let mut start = 0;
    for i in 0..=chunks.len() {
        let ends = i == chunks.len()
            || i == 0
            || chunks[i].zeros
            || chunks[i - 1].zeros
            || chunks[i].member != chunks[i - 1].member;
        if ends && i > 0 {
            mates.extend(std::iter::repeat_n(start..i, i - start));
            start = i;
        }
    }
    mates
}

/// How far past a sequential read the chunks of its file are fetched with it: one round
/// trip for what a reader reading on would otherwise wait a round trip per chunk for.
/// A read that does not continue the last one fetches only what it covers.
const READ_AHEAD_BYTES: u64 = 4 << 20;

/// The most one request fetches for a run of adjacent chunks a read wants.
const MAX_RUN_BYTES: u64 = 8 << 20;

/// The filesystem; [`ObjectsFs::mount`] serves it.
pub struct ObjectsFs {
    pub(crate) objects: Vec<Served>,
    by_name: HashMap<OsString, usize>,
    pub(crate) source: Arc<dyn ChunkSource>,
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
    /// Serves `objects`, their copies made anew (sparse, empty) at their paths, fetching
    /// from `source`. Refused: a name or a copy given twice (the caller gives files of one
    /// content one object), and a file whose chunks do not run in order over all of it.
    /// A copy must be this server's alone: another writer could change checked bytes.
    pub fn new(objects: Vec<LazyObject>, source: Arc<dyn ChunkSource>) -> io::Result<Self> {
        let mut by_name = HashMap::new();
        let mut copies = std::collections::HashSet::new();
        let mut served = Vec::new();
        for (n, object) in objects.into_iter().enumerate() {
            if by_name.insert(object.name.clone(), n).is_some()
                || !copies.insert(object.copy.clone())
            {
                return Err(io::Error::other(format!(
                    "object {:?} (copy {}) given twice",
                    object.name,
                    object.copy.display()
                )));
            }
            lamina_image::lazy::check_chunks(&object.file).map_err(io::Error::other)?;
            // Root's alone: a copy holds a file's bytes whatever the file's own mode.
            let copy = File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&object.copy)?;
            copy.set_len(object.file.size)?;
            let chunks = object.file.chunks.len();
            let mates = member_mates(&object.file.chunks);
            served.push(Served {
                object,
                state: Mutex::new(vec![State::Missing; chunks]),
                settled: Condvar::new(),
                last_end: AtomicU64::new(0),
                mates,
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
        Arc::new(self).mount_shared(mountpoint)
    }

    /// [`ObjectsFs::mount`], keeping a handle for work besides the kernel's reads (a
    /// prefetch).
    pub fn mount_shared(
        self: &Arc<Self>,
        mountpoint: &std::path::Path,
    ) -> io::Result<fuser::BackgroundSession> {
        let mut config = fuser::Config::default();
        // Reads of different chunks, and of chunks present, go on while others are
        // fetched: a stalled registry holds one thread per read waiting on it, so reads
        // of what is present need threads to spare.
        config.n_threads = Some(16);
        config.mount_options = vec![
            fuser::MountOption::RO,
            fuser::MountOption::FSName("lamina-lazy".into()),
            fuser::MountOption::Subtype("lamina-lazy".into()),
        ];
        fuser::spawn_mount(Mounted(self.clone()), mountpoint, &config)
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

    /// Makes every chunk of object `n` covering `offset..end` present. Each missing one
    /// is fetched by one read only: a read claims the chunks no other read is fetching,
    /// fetches each run of adjacent ones in one request (members that follow each other
    /// in the blob, up to [`MAX_RUN_BYTES`]), checks and writes it, and marks that run
    /// present (or missing again) before the next; then it waits for the chunks it needs
    /// that other reads claimed. A sequential read also claims the missing chunks right
    /// after it, up to [`READ_AHEAD_BYTES`], fetched in the same request (one round trip);
    /// if that fails, what is needed is fetched again without them, so a read-ahead never
    /// fails a read. No lock is held while fetching.
    pub(crate) fn fill(&self, n: usize, offset: u64, end: u64) -> io::Result<()> {
        let served = &self.objects[n];
        let chunks = &served.object.file.chunks;
        let sequential = served.last_end.swap(end, Ordering::Relaxed) == offset;
        let ahead_to = if sequential {
            end.saturating_add(READ_AHEAD_BYTES)
        } else {
            end
        };
        // Chunks are in file order (checked in `new`): those covering the range are one run.
        let first = chunks.partition_point(|c| c.file_offset + c.size <= offset);
        let needed = first..first + chunks[first..].partition_point(|c| c.file_offset < end);
        let ahead_end =
            needed.end + chunks[needed.end..].partition_point(|c| c.file_offset < ahead_to);
        // Another read's fetch failing (or this one's with its read-ahead) is tried once
        // more, without read-ahead.
        for attempt in 0..2 {
            // The members of what is needed come whole: their other chunks too.
            let mates =
                served.mates[needed.start].start..served.mates[needed.end - 1].end.max(needed.end);
            let mine = {
                let mut state = served.state.lock().unwrap_or_else(|e| e.into_inner());
                let mut mine = Vec::new();
                for i in mates.clone() {
                    if state[i] == State::Missing {
                        state[i] = State::Fetching;
                        mine.push(i);
                    }
                }
                // Read-ahead only while it runs on from the last chunk claimed, so one
                // request fetches it with what is needed.
                if attempt == 0 && mine.last() == Some(&(mates.end - 1)) {
                    for i in mates.end..ahead_end.max(mates.end) {
                        if state[i] != State::Missing {
                            break;
                        }
                        state[i] = State::Fetching;
                        mine.push(i);
                    }
                }
                mine
            };
            if self.fetch_chunks(served, &mine).is_err() && attempt == 1 {
                return Err(io::Error::other("a chunk could not be fetched"));
            }
            let mut state = served.state.lock().unwrap_or_else(|e| e.into_inner());
            while needed.clone().any(|i| state[i] == State::Fetching) {
                state = served
                    .settled
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if needed.clone().all(|i| state[i] == State::Present) {
                return Ok(());
            }
        }
        Err(io::Error::other("a chunk could not be fetched"))
    }

    /// Fetches, checks and writes chunks `claimed` (in file order, each claimed
    /// `Fetching` by this read) of `served`, run by run, each run marked present once
    /// written, or missing again if it failed (as is every run after it, unfetched). A
    /// panic on the way leaves none of them `Fetching`.
    fn fetch_chunks(&self, served: &Served, claimed: &[usize]) -> io::Result<()> {
        let mut guard = Settle {
            served,
            left: claimed,
        };
        if claimed.is_empty() {
            return Ok(());
        }
        let chunks = &served.object.file.chunks;
        let copy = File::options().write(true).open(&served.object.copy)?;
        while !guard.left.is_empty() {
            let mine = guard.left;
            let first = &chunks[mine[0]];
            // The run: `first`, and the chunks after it of its member or of members
            // that follow each other, within the bound.
            let mut last = 0;
            while last + 1 < mine.len() {
                let (this, next) = (&chunks[mine[last]], &chunks[mine[last + 1]]);
                // A member's chunks are one fetch whatever its size (it is fetched whole
                // for any of them); the next member joins while it follows, within bound.
                let same = !this.zeros && !next.zeros && next.member == this.member;
                let follows = mine[last + 1] == mine[last] + 1
                    && !this.zeros
                    && !next.zeros
                    && next.member.0 == this.member.1
                    && next.member.1 - first.member.0 <= MAX_RUN_BYTES;
                if !same && !follows {
                    break;
                }
                last += 1;
            }
            let run = &mine[..=last];
            let bytes = if first.zeros {
                Vec::new()
            } else {
                self.source
                    .fetch(first.member.0, chunks[mine[last]].member.1)?
            };
            // Chunks sharing a member share one decompression of it, up to the furthest
            // of them: decompressing it from the start for each would cost a hostile
            // index's thousands of tiny chunks quadratic time.
            let mut inflated: Option<((u64, u64), Vec<u8>)> = None;
            for (k, i) in run.iter().enumerate() {
                let chunk = &chunks[*i];
                let checked = if chunk.zeros {
                    chunk_from(&[], chunk)
                } else {
                    if inflated.as_ref().is_none_or(|(m, _)| *m != chunk.member) {
                        let from = (chunk.member.0 - first.member.0) as usize;
                        let to = (chunk.member.1 - first.member.0) as usize;
                        let member = bytes
                            .get(from..to)
                            .ok_or_else(|| io::Error::other("a short fetch"))?;
                        let upto = run[k..]
                            .iter()
                            .map(|j| &chunks[*j])
                            .take_while(|c| c.member == chunk.member && !c.zeros)
                            .map(|c| c.inner_offset + c.size)
                            .max()
                            .unwrap_or(0);
                        let whole =
                            inflate_member(member, chunk.codec, upto).map_err(io::Error::other)?;
                        inflated = Some((chunk.member, whole));
                    }
                    let whole = inflated.as_ref().map_or(&[][..], |(_, b)| &b[..]);
                    chunk_from(whole, chunk)
                }
                .map_err(io::Error::other)?;
                copy.write_all_at(&checked, chunk.file_offset)?;
            }
            guard.settle(run.len(), State::Present);
        }
        Ok(())
    }
}

/// The chunks a read claimed and has not settled yet: marked `Missing` again when it is
/// dropped (an error or a panic), so no other read waits for them for ever.
struct Settle<'a> {
    served: &'a Served,
    left: &'a [usize],
}

impl Settle<'_> {
    /// Marks the first `n` chunks left `state`, and wakes the reads waiting.
    fn settle(&mut self, n: usize, state: State) {
        let mut states = self.served.state.lock().unwrap_or_else(|e| e.into_inner());
        for i in &self.left[..n] {
            states[*i] = state;
        }
        self.left = &self.left[n..];
        self.served.settled.notify_all();
    }
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        if !self.left.is_empty() {
            self.settle(self.left.len(), State::Missing);
        }
    }
}

/// The filesystem as the kernel's session holds it, shared with a prefetch.
struct Mounted(Arc<ObjectsFs>);

impl std::ops::Deref for Mounted {
    type Target = ObjectsFs;

    fn deref(&self) -> &ObjectsFs {
        &self.0
    }
}

impl Filesystem for Mounted {
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
        match File::open(&self.objects[n].object.copy)
            .and_then(|copy| copy.read_exact_at(&mut buf, offset))
        {
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
        // Entry `i` is ".", "..", then object `i - 2`; a reply resumes at its offset.
        for i in offset as usize..self.objects.len() + 2 {
            let (ino, kind, name) = match i {
                0 => (ROOT, FileType::Directory, OsStr::new(".")),
                1 => (ROOT, FileType::Directory, OsStr::new("..")),
                n => (
                    INodeNo(n as u64),
                    FileType::RegularFile,
                    self.objects[n - 2].object.name.as_os_str(),
                ),
            };
            if reply.add(ino, (i + 1) as u64, kind, name) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_image::Digest;
    use lamina_image::lazy::estargz::{Toc, TocEntry};
    use std::io::Write;

    /// A blob in memory that counts its fetches.
    struct Counting {
        blob: Vec<u8>,
        fetches: AtomicU64,
    }

    impl ChunkSource for Counting {
        fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
            self.fetches.fetch_add(1, Ordering::Relaxed);
            Ok(self.blob[start as usize..end as usize].to_vec())
        }
    }

    /// `n` chunks of 4 KiB of one file, all in one gzip member (stored, so the member is
    /// as large as the file), as an eStargz TOC the reader accepts: the blob, the file
    /// and its bytes.
    fn one_member(n: usize) -> (Vec<u8>, LazyFile, Vec<u8>) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let bytes: Vec<u8> = (0..n * 4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        gz.write_all(&bytes).unwrap();
        let member = gz.finish().unwrap();
        let entries = (0..n)
            .map(|i| TocEntry {
                name: "f".into(),
                kind: if i == 0 { "reg" } else { "chunk" }.into(),
                size: if i == 0 { bytes.len() as u64 } else { 0 },
                digest: if i == 0 {
                    Digest::of(&bytes).to_string()
                } else {
                    String::new()
                },
                chunk_offset: (i * 4096) as u64,
                chunk_size: 4096,
                chunk_digest: Digest::of(&bytes[i * 4096..(i + 1) * 4096]).to_string(),
                inner_offset: (i * 4096) as u64,
                ..TocEntry::default()
            })
            .collect();
        let toc = Toc {
            version: 1,
            entries,
        };
        let file = toc.files(member.len() as u64).unwrap().remove(0);
        (member, file, bytes)
    }

    fn serve(n: usize, dir: &std::path::Path) -> (ObjectsFs, Arc<Counting>, Vec<u8>) {
        let (blob, file, bytes) = one_member(n);
        let source = Arc::new(Counting {
            blob,
            fetches: AtomicU64::new(0),
        });
        let object = LazyObject {
            name: "o".into(),
            file,
            copy: dir.join("copy"),
        };
        (
            ObjectsFs::new(vec![object], source.clone()).unwrap(),
            source,
            bytes,
        )
    }

    fn read(fs: &ObjectsFs, offset: u64, len: u64) -> Vec<u8> {
        fs.fill(0, offset, offset + len).unwrap();
        let mut buf = vec![0; len as usize];
        File::open(&fs.objects[0].object.copy)
            .unwrap()
            .read_exact_at(&mut buf, offset)
            .unwrap();
        buf
    }

    #[test]
    fn a_member_past_the_run_bound_is_fetched_once_for_all_its_chunks() {
        let dir = tempfile::tempdir().unwrap();
        // 2400 chunks of 4 KiB in one member of ~9.4 MiB, past MAX_RUN_BYTES.
        let (fs, source, bytes) = serve(2400, dir.path());
        assert_eq!(read(&fs, 4096, 128 << 10), bytes[4096..4096 + (128 << 10)]);
        let after = 4096 + (128 << 10);
        assert_eq!(
            read(&fs, after as u64, 128 << 10),
            bytes[after..after + (128 << 10)]
        );
        assert_eq!(read(&fs, 0, 4096), bytes[..4096]);
        assert_eq!(source.fetches.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn reads_in_reverse_over_one_member_fetch_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let n = 512;
        let (fs, source, bytes) = serve(n, dir.path());
        for i in (0..n as u64).rev() {
            let at = (i * 4096) as usize;
            assert_eq!(read(&fs, i * 4096, 4096), bytes[at..at + 4096]);
        }
        assert_eq!(source.fetches.load(Ordering::Relaxed), 1);
    }
}
