//! Remembering a rootfs tar's content digest, so a warm create names its layer without
//! reading the whole tar again (Garden creates every container from one rootfs tar, often
//! a gigabyte or more).
//!
//! A digest is remembered against the file's identity: device, inode, size, and both the
//! modification and the change time to the nanosecond. Writing to the file moves its
//! change time, and so does setting its modification time back; only setting the system
//! clock could forge a match, which takes the privilege to rewrite the tar anyway.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Digest;

/// What a remembered digest is valid for: the file as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileIdentity {
    pub fn of(file: &File) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// Where digests of rootfs tars are kept between calls (the store's, in lamina).
pub trait TarMemo {
    /// The digest remembered for `path` when the file still has `identity`.
    fn recall(&self, path: &Path, identity: &FileIdentity) -> Option<Digest>;
    /// Keeps `diff_id` for `path` as it is at `identity`. Best effort: a memo that cannot be
    /// written costs the next call a hash, nothing else.
    fn remember(&self, path: &Path, identity: &FileIdentity, diff_id: &Digest);
}

/// Remembers nothing: every resolve hashes the tar.
#[derive(Debug)]
pub struct NoMemo;

impl TarMemo for NoMemo {
    fn recall(&self, _: &Path, _: &FileIdentity) -> Option<Digest> {
        None
    }

    fn remember(&self, _: &Path, _: &FileIdentity, _: &Digest) {}
}
