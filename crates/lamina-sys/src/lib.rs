//! The kernel seam: every call lamina makes that needs privilege, probes a kernel
//! feature, or whose failure it must handle goes through one of two traits here, so all
//! of it can be tested with [`FakeMounter`] as an unprivileged user and any such call
//! made to fail with a chosen errno ([`FakeMounter::fail`]).
//!
//! What goes through the seam:
//! - [`Mounter`]: mounts, unmounts, binds, syncfs of a mounted upper, the container's
//!   own upper filesystem (tmpfs, or an image on a loop device), the mount-table
//!   queries, the mount-API and idmapped-layer probes (with the user namespace they
//!   make), loop-device listing and detaching, and btrfs subvolumes with qgroup limits
//!   (create, delete, usage, "are quotas enabled"). [`RealMounter`] really does them.
//! - [`HostFs`]: ownership and metadata a layer's files get (chown, permission bits,
//!   device nodes and whiteouts, xattrs including `trusted.*` and `security.capability`,
//!   and `lstat` to read them back), the store's permission tightening, the write, fsync
//!   and syncfs of durable records, markers and layers, and in-kernel copies of
//!   composefs objects. [`RealHost`] calls the kernel.
//!
//! What does not, and why: plain file IO an unprivileged user can do on its own files
//! (mkdir, rename, remove, open, read, timestamps, flock) stays
//! on `std`/rustix where it is used. It needs no privilege, so it runs the same under
//! the fake, and faking it would only test the fake. The free functions exported below
//! are the real implementations the traits call; lamina's other crates reach them only
//! through the traits.
//!
//! Keeping these calls here means a reader auditing what lamina asks of the kernel
//! reads one crate, and `raw` is the only place with `unsafe`. clippy.toml lists the
//! calls that must go through the seam under `disallowed-methods`; this crate alone
//! allows them, so a bypass anywhere else fails the lint.

#![allow(clippy::disallowed_methods)]

mod api_probe;
mod discard;
mod error;
mod fake;
mod fake_host;
mod faults;
mod host;
mod limits;
mod mountinfo;
mod ordered_journal;
mod overlay_spec;
mod raw;
mod real;
mod subvolume;
mod upper_fs;
mod userns;

pub use api_probe::{MountApiSupport, probe_idmapped_layers, probe_mount_api};
/// `Errno` is re-exported so callers can match on it without depending on rustix.
pub use discard::{mount_in_use, shut_down_own_fs, unlink_written, unlinks_at_once};
pub use error::{Errno, MountError};
pub use limits::raise_open_file_limit;

/// The [`MountError::op`] of [`Mounter::mount_erofs`]'s step that reads the image (not
/// the attach at the target): its errors are the kernel's verdict on the image.
pub const MOUNT_EROFS_OP: &str = "mount EROFS image";
pub use fake::{FakeCall, FakeKernel, FakeMounter};
pub use faults::{Call, When};
pub use host::{At, HostFs, Node, RealHost, Stat};
pub use mountinfo::{is_mount_root, mounts_under, writable_mount_of};
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

    /// Whether the mount at `mount` is in use in this mount namespace (an open file, a
    /// working directory, a mount on it); unknown counts as in use. A process in another
    /// mount namespace's copy of it is not seen. Ask once per teardown: the real answer
    /// (`umount2(MNT_EXPIRE)`) marks an idle mount expired, and a second ask of a mount
    /// still idle unmounts it (and answers idle).
    fn in_use(&self, mount: &Path) -> bool;

    /// Attaches a read-only bind of the mount (or directory) at `source` on `target`:
    /// a clone of the source mount, so no new superblock is made and every bind shares
    /// the source's page and inode caches.
    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError>;

    /// `syncfs` on the filesystem holding `path`. On a volatile overlay this is how the
    /// upper filesystem's writeback errors are reported; elsewhere it makes writes durable.
    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError>;

    /// Mounts the EROFS image file `image` read-only on the existing directory `target`,
    /// file-backed (no loop device): a composefs metadata image, one mount per image
    /// that every composefs overlay of it names as its lower.
    fn mount_erofs(&self, image: &Path, target: &Path) -> Result<(), MountError>;

    /// Mounts a container's own upper filesystem (strategy `isolated`) on the existing
    /// directory `target`: a tmpfs, or an image file formatted and attached to a loop
    /// device that detaches itself when the filesystem is unmounted.
    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError>;

    /// Mount points at or beneath `dir`, deepest first: what crash recovery must unmount
    /// before it may remove `dir`.
    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError>;

    /// A mount through which `dir` can still be written ([`writable_mount_of`]: an
    /// overlay with it as upper, a read-write bind of it), if there is one: containerd
    /// mounts a snapshot itself, and its writes would land in a layer a commit published.
    /// Mounts at `except` (lamina's own, which the caller unmounts) are passed over.
    fn writable_mount_of(&self, dir: &Path, except: &Path) -> Result<Option<PathBuf>, MountError>;

    /// Which parts of the new mount API the kernel has ([`probe_mount_api`]).
    fn probe_mount_api(&self) -> MountApiSupport;

    /// Whether overlay accepts a lower layer idmapped with `maps`: a user namespace with
    /// those maps is made, `lower` is cloned and idmapped with it, and an overlay with
    /// `other` above it is created but never attached.
    fn probe_idmapped_layers(&self, lower: &Path, other: &Path, maps: &UserNsMaps) -> bool;

    /// Detaches a loop device a crash left attached (`lamina check --repair`).
    fn detach_loop_device(&self, device: &Path) -> Result<(), MountError>;

    /// Attached loop devices and their backing files.
    fn loop_backing_files(&self) -> Vec<(PathBuf, PathBuf)>;

    /// Creates the btrfs subvolume `path` (which must not exist) with its qgroup limited
    /// to `limit_bytes` referenced bytes (strategy `isolated-quota`). A failure leaves no
    /// subvolume.
    fn create_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError>;

    /// Deletes the subvolume `path` (and destroys its qgroup). Returns `Ok(false)` when
    /// `path` is missing or not a subvolume's root, so every removal path can call it
    /// without knowing what the directory holds.
    fn delete_subvolume(&self, path: &Path) -> Result<bool, MountError>;

    /// Sets the qgroup limit of subvolume `path` to `limit_bytes` (again): turning btrfs
    /// quotas off and on drops every limit, and `mount` restores the container's.
    fn limit_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError>;

    /// Bytes the qgroup of subvolume `path` counts, as of the last transaction commit.
    fn subvolume_usage(&self, path: &Path) -> Result<u64, MountError>;

    /// Whether `dir` is on btrfs with quotas enabled: where `isolated-quota` works.
    fn btrfs_quotas(&self, dir: &Path) -> bool;
}
