//! An in-memory [`Mounter`] for testing mount logic without root. It checks what the
//! kernel would check up front (target and layer directories exist, no double mount) so
//! tests catch ordering bugs, and records every call for assertions.
//!
//! Any call can be made to fail ([`FakeMounter::fail`]). The same fake is also a
//! [`crate::HostFs`] (see `fake_host.rs`): it records ownership, device nodes and xattrs
//! in memory instead of asking the kernel, so a store built on it imports layers as an
//! unprivileged user.
//!
//! Like the kernel, it tracks a mount by its directory, not by the path it was mounted
//! at: a mount follows its directory through renames (pool claims and deferred deletes
//! rely on that), so mounts are keyed by the target's device and inode.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::io::Errno;

use crate::faults::Faults;
use crate::{Call, MountApiSupport, MountError, Mounter, OverlaySpec, UpperFs, UserNsMaps, When};

/// A recorded call that changes something or asks the kernel a question only a
/// privileged caller can. Read-only queries (is-mountpoint, mounts-under, stat, xattr
/// reads, the loop device list) can be failed but are not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    Mount(PathBuf, OverlaySpec),
    Unmount(PathBuf),
    BindReadOnly {
        source: PathBuf,
        target: PathBuf,
    },
    Sync(PathBuf),
    MountUpperFs(PathBuf, UpperFs),
    /// A composefs metadata image (target, image).
    MountErofs(PathBuf, PathBuf),
    ProbeMountApi,
    ProbeIdmappedLayers {
        lower: PathBuf,
        maps: UserNsMaps,
    },
    DetachLoopDevice(PathBuf),
    /// A btrfs subvolume and its qgroup limit.
    CreateSubvolume(PathBuf, u64),
    DeleteSubvolume(PathBuf),
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
    },
    Mknod {
        path: PathBuf,
        node: crate::Node,
    },
    SetXattr {
        path: PathBuf,
        name: std::ffi::OsString,
    },
    Write(PathBuf),
    Fsync(PathBuf),
    Syncfs(PathBuf),
    /// A layer file's pages written to the device; `true`: waited for.
    WriteBack(PathBuf, bool),
    /// A layer file made to share an object's extents (the layer file).
    ShareExtents(PathBuf),
    /// A composefs object or metadata image sealed with fs-verity.
    EnableVerity(PathBuf),
    /// Permission bits set (the bits).
    SetMode(PathBuf, u32),
    /// Bytes copied in the kernel into this file.
    CopyRange(PathBuf),
}

/// What the fake kernel supports, as its probes report it. Everything by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeKernel {
    pub mount_api: MountApiSupport,
    pub idmapped_layers: bool,
    /// The store is on btrfs with quotas enabled (`isolated-quota` works). Off by
    /// default: the fake's store is on whatever filesystem the test runs on.
    pub btrfs_quotas: bool,
    /// The store's filesystem seals files with fs-verity (composefs's objects are
    /// sealed and mounted with `verity=require`). Off by default, as on this VM.
    pub fs_verity: bool,
    /// The store's journal orders a direct write ahead of what it logs later
    /// ([`crate::HostFs::write_new_direct`] writes, and a layer's files are written back
    /// rather than its filesystem synced). Off by default: the fake's files are on
    /// whatever filesystem the test runs on.
    pub ordered_direct_writes: bool,
}

impl Default for FakeKernel {
    fn default() -> Self {
        Self {
            mount_api: MountApiSupport {
                new_mount_api: true,
                lowerdir_plus: true,
            },
            idmapped_layers: true,
            btrfs_quotas: false,
            fs_verity: false,
            ordered_direct_writes: false,
        }
    }
}

/// What the fake has mounted on a directory.
#[derive(Debug, Clone)]
enum Mounted {
    Overlay(OverlaySpec),
    UpperFs(UpperFs),
    Erofs(PathBuf),
}

#[derive(Debug, Default)]
pub struct FakeMounter {
    state: Mutex<State>,
}

/// A directory's identity: (device, inode).
pub(crate) type DirId = (u64, u64);

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Mounted directories, with the path they were mounted at, what is mounted, and
    /// when (a sequence number: siblings unmount latest first, as from the kernel).
    mounted: BTreeMap<DirId, (PathBuf, Mounted, u64)>,
    mounts_made: u64,
    pub(crate) calls: Vec<FakeCall>,
    pub(crate) faults: Faults,
    pub(crate) kernel: FakeKernel,
    /// Subvolumes made (a real directory each), with their qgroup limit: like a mount,
    /// a subvolume follows its directory through renames.
    subvolumes: BTreeMap<DirId, u64>,
    /// What the [`crate::HostFs`] half recorded, per inode.
    pub(crate) files: BTreeMap<DirId, crate::fake_host::FileMeta>,
}

impl State {
    /// Records `call` (if given) and returns the error an injected fault makes of it.
    pub(crate) fn enter(
        &mut self,
        kind: Call,
        path: &Path,
        record: Option<FakeCall>,
    ) -> Result<(), Errno> {
        self.calls.extend(record);
        match self.faults.check(kind, path) {
            Some(errno) => Err(errno),
            None => Ok(()),
        }
    }
}

fn dir_id(path: &Path) -> Option<DirId> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

/// Overlay's limit on lower layers, which the kernel enforces with EINVAL.
const MAX_LOWERS: usize = 500;

/// How deep `mounts_under` looks: a container directory's mounts are one level down.
const SEARCH_DEPTH: usize = 3;

impl FakeMounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes calls of kind `call` fail with `errno` when `when` says, before the call
    /// does anything: `fake.fail(Call::Unmount, When::Nth(1), Errno::BUSY)`. Rules add
    /// up; the first added that fires decides.
    pub fn fail(&self, call: Call, when: When, errno: Errno) {
        self.lock().faults.add(call, when, errno);
    }

    /// Makes the next mount (an overlay or an upper filesystem, whichever comes first)
    /// fail with `errno`, as a kernel refusal would.
    pub fn fail_next_mount(&self, errno: Errno) {
        self.lock()
            .faults
            .add_any(&[Call::Mount, Call::MountUpperFs], When::Nth(1), errno);
    }

    /// Makes the next `mount_overlay` fail with `errno` while other mounts succeed: a
    /// failure after an isolated container's own upper filesystem is mounted.
    pub fn fail_next_overlay_mount(&self, errno: Errno) {
        self.fail(Call::Mount, When::Nth(1), errno);
    }

    /// Makes the next `sync_filesystem` fail with `errno`, as a volatile overlay reports
    /// a writeback error on its upper filesystem.
    pub fn fail_next_sync(&self, errno: Errno) {
        self.fail(Call::Sync, When::Nth(1), errno);
    }

    /// Sets what the fake kernel's probes report.
    pub fn set_kernel(&self, kernel: FakeKernel) {
        self.lock().kernel = kernel;
    }

    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// Paths (as mounted) of everything still mounted.
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.lock()
            .mounted
            .values()
            .map(|(p, _, _)| p.clone())
            .collect()
    }

    /// What is mounted on directory `path`, wherever it has been renamed to.
    pub fn spec_at(&self, path: &Path) -> Option<OverlaySpec> {
        let id = dir_id(path)?;
        match self.lock().mounted.get(&id) {
            Some((_, Mounted::Overlay(spec), _)) => Some(spec.clone()),
            _ => None,
        }
    }

    /// The EROFS image file mounted on directory `path`.
    pub fn erofs_image_at(&self, path: &Path) -> Option<PathBuf> {
        let id = dir_id(path)?;
        match self.lock().mounted.get(&id) {
            Some((_, Mounted::Erofs(image), _)) => Some(image.clone()),
            _ => None,
        }
    }

    /// The upper filesystem mounted on directory `path`, wherever it has been renamed to.
    pub fn upper_fs_at(&self, path: &Path) -> Option<UpperFs> {
        let id = dir_id(path)?;
        match self.lock().mounted.get(&id) {
            Some((_, Mounted::UpperFs(fs), _)) => Some(fs.clone()),
            _ => None,
        }
    }

    /// The qgroup limit of the subvolume at `path`, wherever it has been renamed to.
    pub fn subvolume_limit(&self, path: &Path) -> Option<u64> {
        let id = dir_id(path)?;
        self.lock().subvolumes.get(&id).copied()
    }

    /// How many subvolumes exist.
    pub fn subvolume_count(&self) -> usize {
        self.lock().subvolumes.len()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the assertions after it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn attach(
        &self,
        state: &mut State,
        target: &Path,
        what: Mounted,
        op: &'static str,
    ) -> Result<(), MountError> {
        let Some(id) = dir_id(target) else {
            return Err(MountError::new(op, target, Errno::NOENT));
        };
        if state.mounted.contains_key(&id) {
            return Err(MountError::new(op, target, Errno::BUSY));
        }
        state.mounts_made += 1;
        let order = state.mounts_made;
        state
            .mounted
            .insert(id, (target.to_path_buf(), what, order));
        Ok(())
    }
}

impl Mounter for FakeMounter {
    fn mount_overlay(&self, spec: &OverlaySpec, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        let err = |errno| MountError::new("mount overlay at", target, errno);
        let record = FakeCall::Mount(target.to_path_buf(), spec.clone());
        state
            .enter(Call::Mount, target, Some(record))
            .map_err(err)?;
        if spec.lowers.is_empty()
            || spec.lowers.len() > MAX_LOWERS
            || spec.upper.is_some() != spec.work.is_some()
        {
            return Err(err(Errno::INVAL));
        }
        let dirs = spec.lowers.iter().chain(&spec.upper).chain(&spec.work);
        let dirs = dirs.chain(&spec.data_lowers);
        // A directory inside a (fake) mounted EROFS image exists while it is mounted.
        let in_erofs = |d: &Path| {
            d.parent()
                .and_then(dir_id)
                .is_some_and(|id| matches!(state.mounted.get(&id), Some((_, Mounted::Erofs(_), _))))
        };
        if dirs.into_iter().any(|d| !d.is_dir() && !in_erofs(d)) {
            return Err(err(Errno::NOENT));
        }
        self.attach(
            &mut state,
            target,
            Mounted::Overlay(spec.clone()),
            "mount overlay at",
        )
    }

    fn unmount(&self, target: &Path) -> Result<bool, MountError> {
        let mut state = self.lock();
        let record = FakeCall::Unmount(target.to_path_buf());
        state
            .enter(Call::Unmount, target, Some(record))
            .map_err(|e| MountError::new("unmount", target, e))?;
        Ok(dir_id(target).is_some_and(|id| state.mounted.remove(&id).is_some()))
    }

    /// Idle unless a fault is injected for [`Call::InUse`] at `mount`.
    fn in_use(&self, mount: &Path) -> bool {
        self.lock().enter(Call::InUse, mount, None).is_err()
    }

    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError> {
        let mut state = self.lock();
        state
            .enter(Call::IsMountpoint, path, None)
            .map_err(|e| MountError::new("statx", path, e))?;
        Ok(dir_id(path).is_some_and(|id| state.mounted.contains_key(&id)))
    }

    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        let record = FakeCall::BindReadOnly {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
        };
        state
            .enter(Call::BindReadOnly, target, Some(record))
            .map_err(|e| MountError::new("attach read-only bind at", target, e))?;
        let Some(source_id) = dir_id(source) else {
            return Err(MountError::new(
                "clone mount for bind",
                source,
                Errno::NOENT,
            ));
        };
        // A bind shows what the source shows: record it as the source's overlay, or as a
        // plain directory (its only "lower") when the source is not a mount.
        let spec = match state.mounted.get(&source_id) {
            Some((_, Mounted::Overlay(spec), _)) => spec.clone(),
            _ => OverlaySpec {
                lowers: vec![source.to_path_buf()],
                ..OverlaySpec::default()
            },
        };
        let spec = OverlaySpec {
            read_only: true,
            ..spec
        };
        self.attach(
            &mut state,
            target,
            Mounted::Overlay(spec),
            "attach read-only bind at",
        )
    }

    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError> {
        let record = FakeCall::Sync(path.to_path_buf());
        self.lock()
            .enter(Call::Sync, path, Some(record))
            .map_err(|e| MountError::new("syncfs", path, e))
    }

    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        let record = FakeCall::MountUpperFs(target.to_path_buf(), fs.clone());
        state
            .enter(Call::MountUpperFs, target, Some(record))
            .map_err(|e| MountError::new("mount upper filesystem at", target, e))?;
        // The image file is real, so removal and crash-recovery code see what they would.
        if let UpperFs::Disk { image, format, .. } = fs {
            let made = if *format {
                std::fs::File::create_new(image).map(drop)
            } else {
                std::fs::metadata(image).map(drop)
            };
            made.map_err(|e| {
                let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
                MountError::new("create upper image", image, errno)
            })?;
        }
        self.attach(
            &mut state,
            target,
            Mounted::UpperFs(fs.clone()),
            "mount upper filesystem at",
        )
    }

    fn mount_erofs(&self, image: &Path, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        let record = FakeCall::MountErofs(target.to_path_buf(), image.to_path_buf());
        state
            .enter(Call::MountErofs, target, Some(record))
            .map_err(|e| MountError::new("mount EROFS image at", target, e))?;
        if !image.is_file() {
            return Err(MountError::new(crate::MOUNT_EROFS_OP, image, Errno::NOENT));
        }
        self.attach(
            &mut state,
            target,
            Mounted::Erofs(image.to_path_buf()),
            "mount EROFS image at",
        )
    }

    fn probe_mount_api(&self) -> MountApiSupport {
        let mut state = self.lock();
        let kernel = state.kernel.mount_api;
        match state.enter(
            Call::ProbeMountApi,
            Path::new(""),
            Some(FakeCall::ProbeMountApi),
        ) {
            Ok(()) => kernel,
            // fsopen refused: the probe reports no new mount API at all.
            Err(_) => MountApiSupport {
                new_mount_api: false,
                lowerdir_plus: false,
            },
        }
    }

    fn probe_idmapped_layers(&self, lower: &Path, _other: &Path, maps: &UserNsMaps) -> bool {
        let mut state = self.lock();
        let record = FakeCall::ProbeIdmappedLayers {
            lower: lower.to_path_buf(),
            maps: maps.clone(),
        };
        let supported = state.kernel.idmapped_layers;
        state
            .enter(Call::ProbeIdmappedLayers, lower, Some(record))
            .is_ok()
            && supported
    }

    fn detach_loop_device(&self, device: &Path) -> Result<(), MountError> {
        let record = FakeCall::DetachLoopDevice(device.to_path_buf());
        self.lock()
            .enter(Call::DetachLoopDevice, device, Some(record))
            .map_err(|e| MountError::new("detach loop device", device, e))
    }

    /// The fake attaches no loop devices: an image file's "device" lives and dies with
    /// its mount.
    fn loop_backing_files(&self) -> Vec<(PathBuf, PathBuf)> {
        let _ = self
            .lock()
            .enter(Call::LoopBackingFiles, Path::new(""), None);
        Vec::new()
    }

    fn writable_mount_of(
        &self,
        upper: &Path,
        except: &Path,
    ) -> Result<Option<PathBuf>, MountError> {
        let mut state = self.lock();
        state
            .enter(Call::MountsUnder, upper, None)
            .map_err(|e| MountError::new("read /proc/self/mountinfo for", upper, e))?;
        Ok(state
            .mounted
            .values()
            .find_map(|(target, mounted, _)| match mounted {
                Mounted::Overlay(spec)
                    if spec.upper.as_deref() == Some(upper) && target != except =>
                {
                    Some(target.clone())
                }
                _ => None,
            }))
    }

    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError> {
        let mut state = self.lock();
        state
            .enter(Call::MountsUnder, dir, None)
            .map_err(|e| MountError::new("read /proc/self/mountinfo for", dir, e))?;
        let mut found = Vec::new();
        let mut pending = vec![(dir.to_path_buf(), 0)];
        while let Some((path, depth)) = pending.pop() {
            if let Some((_, _, order)) = dir_id(&path).and_then(|id| state.mounted.get(&id)) {
                found.push((*order, path.clone()));
            }
            if depth < SEARCH_DEPTH
                && let Ok(entries) = std::fs::read_dir(&path)
            {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        pending.push((entry.path(), depth + 1));
                    }
                }
            }
        }
        found.sort_by_key(|(order, p)| std::cmp::Reverse((p.components().count(), *order)));
        Ok(found.into_iter().map(|(_, p)| p).collect())
    }

    /// A real directory, remembered as a subvolume with its limit; nothing is enforced.
    fn create_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        let mut state = self.lock();
        let record = FakeCall::CreateSubvolume(path.to_path_buf(), limit_bytes);
        state
            .enter(Call::CreateSubvolume, path, Some(record))
            .map_err(|e| MountError::new("create subvolume", path, e))?;
        std::fs::create_dir(path).map_err(|e| {
            let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
            MountError::new("create subvolume", path, errno)
        })?;
        let id = dir_id(path).expect("just made");
        state.subvolumes.insert(id, limit_bytes);
        Ok(())
    }

    fn delete_subvolume(&self, path: &Path) -> Result<bool, MountError> {
        let mut state = self.lock();
        let Some(id) = dir_id(path).filter(|id| state.subvolumes.contains_key(id)) else {
            return Ok(false);
        };
        let record = FakeCall::DeleteSubvolume(path.to_path_buf());
        state
            .enter(Call::DeleteSubvolume, path, Some(record))
            .map_err(|e| MountError::new("delete subvolume", path, e))?;
        std::fs::remove_dir_all(path).map_err(|e| {
            let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
            MountError::new("delete subvolume", path, errno)
        })?;
        state.subvolumes.remove(&id);
        Ok(true)
    }

    /// What the files in it take, as `du` counts them: the fake has no qgroup.
    fn subvolume_usage(&self, path: &Path) -> Result<u64, MountError> {
        let mut state = self.lock();
        state
            .enter(Call::SubvolumeUsage, path, None)
            .map_err(|e| MountError::new("read qgroup usage", path, e))?;
        if !dir_id(path).is_some_and(|id| state.subvolumes.contains_key(&id)) {
            return Err(MountError::new("look up subvolume", path, Errno::NOTTY));
        }
        Ok(du(path))
    }

    fn limit_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        let mut state = self.lock();
        state
            .enter(Call::LimitSubvolume, path, None)
            .map_err(|e| MountError::new("limit qgroup of subvolume", path, e))?;
        match dir_id(path).filter(|id| state.subvolumes.contains_key(id)) {
            Some(id) => {
                state.subvolumes.insert(id, limit_bytes);
                Ok(())
            }
            None => Err(MountError::new("open subvolume", path, Errno::NOTTY)),
        }
    }

    fn btrfs_quotas(&self, _dir: &Path) -> bool {
        self.lock().kernel.btrfs_quotas
    }
}

/// Bytes allocated to the files beneath `dir`.
fn du(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            if let Ok(meta) = entry.path().symlink_metadata() {
                total += meta.blocks() * 512;
                if meta.is_dir() {
                    pending.push(entry.path());
                }
            }
        }
    }
    total
}
