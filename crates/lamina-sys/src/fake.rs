//! An in-memory [`Mounter`] for testing mount logic without root. It checks what the
//! kernel would check up front (target and layer directories exist, no double mount) so
//! tests catch ordering bugs, and records every call for assertions.
//!
//! Like the kernel, it tracks a mount by its directory, not by the path it was mounted
//! at: a mount follows its directory through renames (pool claims and deferred deletes
//! rely on that), so mounts are keyed by the target's device and inode.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::io::Errno;

use crate::{MountError, Mounter, OverlaySpec, UpperFs};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    Mount(PathBuf, OverlaySpec),
    Unmount(PathBuf),
    BindReadOnly { source: PathBuf, target: PathBuf },
    Sync(PathBuf),
    MountUpperFs(PathBuf, UpperFs),
}

/// What the fake has mounted on a directory.
#[derive(Debug, Clone)]
enum Mounted {
    Overlay(OverlaySpec),
    UpperFs(UpperFs),
}

#[derive(Debug, Default)]
pub struct FakeMounter {
    state: Mutex<State>,
}

/// A directory's identity: (device, inode).
type DirId = (u64, u64);

#[derive(Debug, Default)]
struct State {
    /// Mounted directories, with the path they were mounted at, what is mounted, and
    /// when (a sequence number: siblings unmount latest first, as from the kernel).
    mounted: BTreeMap<DirId, (PathBuf, Mounted, u64)>,
    mounts_made: u64,
    calls: Vec<FakeCall>,
    fail_next_mount: Option<Errno>,
    fail_next_overlay: Option<Errno>,
    fail_next_sync: Option<Errno>,
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

    /// Makes the next `mount_overlay` fail with `errno`, as a kernel refusal would.
    pub fn fail_next_mount(&self, errno: Errno) {
        self.lock().fail_next_mount = Some(errno);
    }

    /// Makes the next `mount_overlay` fail with `errno` while other mounts succeed: a
    /// failure after an isolated container's own upper filesystem is mounted.
    pub fn fail_next_overlay_mount(&self, errno: Errno) {
        self.lock().fail_next_overlay = Some(errno);
    }

    /// Makes the next `sync_filesystem` fail with `errno`, as a volatile overlay reports
    /// a writeback error on its upper filesystem.
    pub fn fail_next_sync(&self, errno: Errno) {
        self.lock().fail_next_sync = Some(errno);
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

    /// The upper filesystem mounted on directory `path`, wherever it has been renamed to.
    pub fn upper_fs_at(&self, path: &Path) -> Option<UpperFs> {
        let id = dir_id(path)?;
        match self.lock().mounted.get(&id) {
            Some((_, Mounted::UpperFs(fs), _)) => Some(fs.clone()),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
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
        state
            .calls
            .push(FakeCall::Mount(target.to_path_buf(), spec.clone()));
        let err = |errno| MountError::new("mount overlay at", target, errno);
        if let Some(errno) = state
            .fail_next_mount
            .take()
            .or_else(|| state.fail_next_overlay.take())
        {
            return Err(err(errno));
        }
        if spec.lowers.is_empty()
            || spec.lowers.len() > MAX_LOWERS
            || spec.upper.is_some() != spec.work.is_some()
        {
            return Err(err(Errno::INVAL));
        }
        let dirs = spec.lowers.iter().chain(&spec.upper).chain(&spec.work);
        if dirs.into_iter().any(|d| !d.is_dir()) {
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
        state.calls.push(FakeCall::Unmount(target.to_path_buf()));
        Ok(dir_id(target).is_some_and(|id| state.mounted.remove(&id).is_some()))
    }

    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError> {
        Ok(dir_id(path).is_some_and(|id| self.lock().mounted.contains_key(&id)))
    }

    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::BindReadOnly {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
        });
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
        let mut state = self.lock();
        state.calls.push(FakeCall::Sync(path.to_path_buf()));
        match state.fail_next_sync.take() {
            Some(errno) => Err(MountError::new("syncfs", path, errno)),
            None => Ok(()),
        }
    }

    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        state
            .calls
            .push(FakeCall::MountUpperFs(target.to_path_buf(), fs.clone()));
        if let Some(errno) = state.fail_next_mount.take() {
            return Err(MountError::new("mount upper filesystem at", target, errno));
        }
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

    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError> {
        let state = self.lock();
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
}
