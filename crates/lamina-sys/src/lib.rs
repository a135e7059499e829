//! The one place lamina asks the kernel to mount or unmount anything.
//!
//! Mount logic elsewhere talks to the [`Mounter`] trait, so it can be tested with
//! [`FakeMounter`] without root or a kernel overlay module; [`RealMounter`] is the
//! implementation that really mounts. Keeping every mount syscall here means a reader
//! auditing what lamina does to the host's mount table reads one crate.

mod api_probe;
mod error;
mod fake;
mod mountinfo;
mod overlay_spec;
mod raw;
mod real;
mod upper_fs;
mod userns;

pub use api_probe::{MountApiSupport, probe_idmapped_layers, probe_mount_api};
/// `Errno` is re-exported so callers can match on it without depending on rustix.
pub use error::{Errno, MountError};
pub use fake::{FakeCall, FakeMounter};
pub use mountinfo::mounts_under;
pub use overlay_spec::OverlaySpec;
pub use real::RealMounter;
pub use upper_fs::{DiskFs, UpperFs, detach_loop_device, loop_backing_files};
pub use userns::{UserNsMaps, user_namespace};

use std::fmt::Debug;
use std::path::{Path, PathBuf};

/// Mount operations lamina needs, small enough to fake faithfully.
pub trait Mounter: Send + Sync + Debug {
    /// Mounts the overlay described by `spec` on the existing directory `target`.
    fn mount_overlay(&self, spec: &OverlaySpec, target: &Path) -> Result<(), MountError>;

    /// Unmounts `target`. Returns `Ok(false)` when `target` was not a mount point, so
    /// callers can make delete idempotent without racing a separate check.
    fn unmount(&self, target: &Path) -> Result<bool, MountError>;

    /// Whether `path` is the root of a mount.
    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError>;

    /// Attaches a read-only bind of the mount (or directory) at `source` on `target`:
    /// a clone of the source mount, so no new superblock is made and every bind shares
    /// the source's page and inode caches.
    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError>;

    /// `syncfs` on the filesystem holding `path`. On a volatile overlay this is how the
    /// upper filesystem's writeback errors are reported; elsewhere it makes writes durable.
    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError>;

    /// Mounts a container's own upper filesystem (strategy `isolated`) on the existing
    /// directory `target`: a tmpfs, or an image file formatted and attached to a loop
    /// device that detaches itself when the filesystem is unmounted.
    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError>;

    /// Mount points at or beneath `dir`, deepest first: what crash recovery must unmount
    /// before it may remove `dir`.
    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError>;
}
