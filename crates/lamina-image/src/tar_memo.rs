//! Remembering a rootfs tar's content digest, so a warm create names its layer without
//! reading the whole tar again (Garden creates every container from one rootfs tar, often
//! a gigabyte or more).
//!
//! A digest is remembered against the file's identity: device, inode, size, and both the
//! modification and the change time to the nanosecond. Writing to the file moves its
//! change time, and so does setting its modification time back; only setting the system
//! clock could forge a match, which takes the privilege to rewrite the tar anyway.
//!
//! What the identity cannot see, and how it is handled:
//! - two writes within one tick of a coarse clock (before Linux 6.13 the change time
//!   moves in jiffies; some filesystems keep whole seconds): a tar written less than
//!   [`SETTLED`] before it was hashed is not remembered;
//! - writes through a shared mapping move the times only on the first write to a page
//!   after it was written back, and a filesystem over the network or FUSE may report
//!   cached times: a tar changed that way can be named by its earlier content. Garden's
//!   rootfs tars are installed as files and replaced, not edited in place; an import whose
//!   digest check refuses the tar forgets its memo, so the refusal is not repeated.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// How long before it is hashed a tar must have been last written for its digest to be
/// remembered: longer than any filesystem's timestamp tick.
pub const SETTLED: Duration = Duration::from_secs(2);

impl FileIdentity {
    pub fn of(file: &File) -> std::io::Result<Self> {
        Ok(Self::from(&file.metadata()?))
    }

    /// Whether the change time is at least [`SETTLED`] before `now`: a write after this
    /// identity was taken then moves it (every write does; the modification time can be
    /// set anywhere, a future one from a build machine's clock included).
    pub fn settled(&self, now: SystemTime) -> bool {
        let Some(horizon) = now
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| d.checked_sub(SETTLED))
        else {
            return false;
        };
        let before = |(secs, nanos): (i64, i64)| {
            u64::try_from(secs)
                .is_ok_and(|secs| Duration::new(secs, u32::try_from(nanos).unwrap_or(0)) < horizon)
        };
        before(self.ctime)
    }
}

impl From<&std::fs::Metadata> for FileIdentity {
    fn from(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// Where digests of rootfs tars are kept between calls (the store's, in lamina).
pub trait TarMemo {
    /// The digest remembered for `path` when the file still has `identity`.
    fn recall(&self, path: &Path, identity: &FileIdentity) -> Option<Digest>;
    /// Keeps `diff_id` for `path` as it is at `identity`. Best effort: a memo that cannot be
    /// written costs the next call a hash, nothing else.
    fn remember(&self, path: &Path, identity: &FileIdentity, diff_id: &Digest);
    /// Drops what is remembered for `path` (its content was not the digest remembered).
    fn forget(&self, path: &Path);
}

/// Remembers nothing: every resolve hashes the tar.
#[derive(Debug)]
pub struct NoMemo;

impl TarMemo for NoMemo {
    fn recall(&self, _: &Path, _: &FileIdentity) -> Option<Digest> {
        None
    }

    fn remember(&self, _: &Path, _: &FileIdentity, _: &Digest) {}

    fn forget(&self, _: &Path) {}
}
