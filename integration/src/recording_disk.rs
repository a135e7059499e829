//! A disk that records every write and flush it is sent: one file, `disk`, on a FUSE
//! filesystem served by this process, for a loop device to use as its backing file. The
//! loop driver writes through to the file (no writeback cache: each write is a FUSE
//! `WRITE` answered before the block write completes) and fsyncs it on every flush, so
//! the log holds, in completion order, what a real disk would have been sent.
//!
//! What a power cut may leave is then known exactly: everything before the last flush
//! completed, and any subset of the writes completed after it (a disk keeps unflushed
//! writes in any order). [`Recording::image`] rebuilds each such image.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
    WriteFlags,
};

/// One thing the disk was sent, in the order it completed.
#[derive(Debug, Clone)]
pub enum Event {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    /// A range zeroed (the loop driver's discard and write-zeroes, as `fallocate`).
    Zero {
        offset: u64,
        len: u64,
    },
    Flush,
    /// A point the test named: an operation returned here.
    Mark(String),
}

#[derive(Debug, Default)]
struct State {
    bytes: Vec<u8>,
    /// `None` until [`RecordingDisk::start`]: the writes of `mkfs` and the set-up are the
    /// base image, not part of what is tried.
    log: Option<Vec<Event>>,
}

impl State {
    fn apply(&mut self, event: Event) {
        if let Event::Write { offset, data } = &event {
            let at = *offset as usize;
            self.bytes[at..at + data.len()].copy_from_slice(data);
        }
        if let Event::Zero { offset, len } = &event {
            self.bytes[*offset as usize..(*offset + *len) as usize].fill(0);
        }
        if let Some(log) = &mut self.log {
            log.push(event);
        }
    }
}

/// The disk, mounted until dropped.
#[allow(missing_debug_implementations)]
pub struct RecordingDisk {
    // Unmounted before its mount point is removed.
    _session: fuser::BackgroundSession,
    mountpoint: tempfile::TempDir,
    state: Arc<Mutex<(State, Option<Vec<u8>>)>>,
}

const ROOT: INodeNo = INodeNo(1);
const DISK: INodeNo = INodeNo(2);
const NAME: &str = "disk";
const TTL: Duration = Duration::from_secs(1);

impl RecordingDisk {
    /// A zeroed disk of `size` bytes.
    pub fn new(size: u64) -> Self {
        let mountpoint = tempfile::Builder::new()
            .prefix("lamina-recording-disk-")
            .tempdir()
            .expect("temp dir");
        let state = Arc::new(Mutex::new((
            State {
                bytes: vec![0; size as usize],
                log: None,
            },
            None,
        )));
        let mut config = fuser::Config::default();
        // One thread: requests are answered, and logged, in the order they came.
        config.n_threads = Some(1);
        config.mount_options = vec![fuser::MountOption::FSName("lamina-recording-disk".into())];
        let served = Served(state.clone());
        let session =
            fuser::spawn_mount(served, mountpoint.path(), &config).expect("mounting the disk");
        Self {
            _session: session,
            mountpoint,
            state,
        }
    }

    /// The file a loop device is set up on.
    pub fn path(&self) -> PathBuf {
        self.mountpoint.path().join(NAME)
    }

    /// Takes what the disk holds now as the base image, and logs from here on.
    pub fn start(&self) {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let base = guard.0.bytes.clone();
        guard.1 = Some(base);
        guard.0.log = Some(Vec::new());
    }

    /// Notes that `what` returned at this point of the log.
    pub fn mark(&self, what: &str) {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(log) = &mut guard.0.log {
            log.push(Event::Mark(what.to_string()));
        }
    }

    /// Stops logging; the base image and what was logged since [`RecordingDisk::start`].
    pub fn stop(&self) -> Recording {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let log = guard.0.log.take().expect("started");
        let base = guard.1.take().expect("started");
        Recording { base, log }
    }
}

/// A base image and the events after it.
#[derive(Debug)]
pub struct Recording {
    pub base: Vec<u8>,
    pub log: Vec<Event>,
}

/// One image a power cut may leave: every event before flush number `flushes` (all of
/// them for a recording's end), and of the writes between that flush and the next those
/// whose indexes (into [`Recording::log`]) are in `unflushed`.
#[derive(Debug, Clone)]
pub struct CutImage {
    pub flushes: usize,
    pub unflushed: Vec<usize>,
    pub label: String,
}

impl Recording {
    /// Indexes into the log of each flush, in order.
    pub fn flush_indexes(&self) -> Vec<usize> {
        self.log
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Flush))
            .map(|(i, _)| i)
            .collect()
    }

    /// How many flushes had completed when the operation named `what` returned.
    pub fn flushes_before(&self, what: &str) -> usize {
        let at = self
            .log
            .iter()
            .position(|e| matches!(e, Event::Mark(m) if m == what))
            .unwrap_or_else(|| panic!("no mark {what}"));
        self.log[..at]
            .iter()
            .filter(|e| matches!(e, Event::Flush))
            .count()
    }

    /// The writes (log indexes) between flush `flushes` and the next.
    pub fn unflushed_after(&self, flushes: usize) -> Vec<usize> {
        let indexes = self.flush_indexes();
        let start = match flushes {
            0 => 0,
            n => indexes[n - 1] + 1,
        };
        let end = indexes.get(flushes).copied().unwrap_or(self.log.len());
        (start..end)
            .filter(|i| matches!(self.log[*i], Event::Write { .. } | Event::Zero { .. }))
            .collect()
    }

    /// The images tried: at each flush, nothing of what follows it; the first half of
    /// the writes up to the next flush; and `random` subsets of them drawn by `rng`
    /// (writes kept out of order: what flush ordering must survive). After the last
    /// flush, every write too (elsewhere that image is the next flush's).
    pub fn cut_images(&self, random: usize, rng: &mut crate::rng::Xorshift) -> Vec<CutImage> {
        let mut images = Vec::new();
        let last = self.flush_indexes().len();
        for flushes in 0..=last {
            let writes = self.unflushed_after(flushes);
            let mut push = |unflushed: Vec<usize>, what: &str| {
                images.push(CutImage {
                    flushes,
                    label: format!(
                        "after flush {flushes}, {what} ({} of {} writes after it)",
                        unflushed.len(),
                        writes.len()
                    ),
                    unflushed,
                })
            };
            push(Vec::new(), "none");
            if writes.is_empty() {
                continue;
            }
            if flushes == last {
                push(writes.clone(), "all");
            }
            if writes.len() > 1 {
                push(writes[..writes.len() / 2].to_vec(), "the first half");
                for n in 0..random {
                    let subset = writes
                        .iter()
                        .copied()
                        .filter(|_| rng.below(2) == 0)
                        .collect();
                    push(subset, &format!("random subset {n}"));
                }
            }
        }
        images
    }

    /// The bytes of `cut`.
    pub fn image(&self, cut: &CutImage) -> Vec<u8> {
        let mut state = State {
            bytes: self.base.clone(),
            log: None,
        };
        let end = match cut.flushes {
            0 => 0,
            n => self.flush_indexes()[n - 1] + 1,
        };
        for event in &self.log[..end] {
            state.apply(event.clone());
        }
        for i in &cut.unflushed {
            state.apply(self.log[*i].clone());
        }
        state.bytes
    }
}

struct Served(Arc<Mutex<(State, Option<Vec<u8>>)>>);

impl Served {
    fn size(&self) -> u64 {
        let guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0.bytes.len() as u64
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = match ino {
            ROOT => (FileType::Directory, 0, 0o755, 2),
            DISK => (FileType::RegularFile, self.size(), 0o600, 1),
            _ => return None,
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

    fn apply(&self, event: Event) {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0.apply(event);
    }
}

impl Filesystem for Served {
    fn init(&mut self, _req: &Request, _config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // This thread answers the loop device's writes: memory it allocates should not
        // wait on writeback, which may wait on it. Best effort: it needs
        // CAP_SYS_RESOURCE, which a container may lack (the disks are small beside RAM).
        let _ = rustix::process::configure_io_flusher_behavior(true);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name == NAME) {
            (ROOT, true) => reply.entry(&TTL, &self.attr(DISK).expect("disk"), Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            DISK => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = &guard.0.bytes;
        let start = (offset as usize).min(bytes.len());
        let end = (start + size as usize).min(bytes.len());
        reply.data(&bytes[start..end]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if offset.saturating_add(data.len() as u64) > self.size() {
            return reply.error(Errno::ENOSPC);
        }
        self.apply(Event::Write {
            offset,
            data: data.to_vec(),
        });
        reply.written(data.len() as u32);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.apply(Event::Flush);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close, not a barrier: the loop driver's flushes come as fsync.
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const KEEP_SIZE: i32 = 0x01;
        const PUNCH_HOLE: i32 = 0x02;
        const ZERO_RANGE: i32 = 0x10;
        let zeroes = mode & (PUNCH_HOLE | ZERO_RANGE) != 0
            && mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) == 0;
        if !zeroes || offset.saturating_add(length) > self.size() {
            return reply.error(Errno::EOPNOTSUPP);
        }
        self.apply(Event::Zero {
            offset,
            len: length,
        });
        reply.ok();
    }
}
