//! An in-memory [`Mounter`] for testing mount logic without root. It checks what the
//! kernel would check up front (target and layer directories exist, no double mount) so
//! tests catch ordering bugs, and records every call for assertions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::io::Errno;

use crate::{MountError, Mounter, OverlaySpec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeCall {
    Mount(PathBuf, OverlaySpec),
    Unmount(PathBuf),
    BindReadOnly { source: PathBuf, target: PathBuf },
    Sync(PathBuf),
}

#[derive(Debug, Default)]
pub struct FakeMounter {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    mounted: BTreeMap<PathBuf, OverlaySpec>,
    calls: Vec<FakeCall>,
    fail_next_mount: Option<Errno>,
    fail_next_sync: Option<Errno>,
}

impl FakeMounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `mount_overlay` fail with `errno`, as a kernel refusal would.
    pub fn fail_next_mount(&self, errno: Errno) {
        self.lock().fail_next_mount = Some(errno);
    }

    /// Makes the next `sync_filesystem` fail with `errno`, as a volatile overlay reports
    /// a writeback error on its upper filesystem.
    pub fn fail_next_sync(&self, errno: Errno) {
        self.lock().fail_next_sync = Some(errno);
    }

    /// Whether any call so far created a mount (overlay or bind).
    pub fn mounted_anything(&self) -> bool {
        self.calls()
            .iter()
            .any(|c| matches!(c, FakeCall::Mount(..) | FakeCall::BindReadOnly { .. }))
    }

    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    pub fn mounted(&self) -> Vec<PathBuf> {
        self.lock().mounted.keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the assertions after it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Mounter for FakeMounter {
    fn mount_overlay(&self, spec: &OverlaySpec, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        state
            .calls
            .push(FakeCall::Mount(target.to_path_buf(), spec.clone()));
        let err = |errno| MountError::new("mount overlay at", target, errno);
        if let Some(errno) = state.fail_next_mount.take() {
            return Err(err(errno));
        }
        if spec.lowers.is_empty() || spec.upper.is_some() != spec.work.is_some() {
            return Err(err(Errno::INVAL));
        }
        let dirs = spec.lowers.iter().chain(&spec.upper).chain(&spec.work);
        if !target.is_dir() || dirs.into_iter().any(|d| !d.is_dir()) {
            return Err(err(Errno::NOENT));
        }
        if state.mounted.contains_key(target) {
            return Err(err(Errno::BUSY));
        }
        state.mounted.insert(target.to_path_buf(), spec.clone());
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<bool, MountError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::Unmount(target.to_path_buf()));
        Ok(state.mounted.remove(target).is_some())
    }

    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError> {
        Ok(self.lock().mounted.contains_key(path))
    }

    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::BindReadOnly {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
        });
        if !source.is_dir() || !target.is_dir() {
            return Err(MountError::new("attach read-only bind at", target, Errno::NOENT));
        }
        if state.mounted.contains_key(target) {
            return Err(MountError::new("attach read-only bind at", target, Errno::BUSY));
        }
        // A bind shows what the source shows: record it as the source's overlay, or as a
        // plain directory (no lowers) when the source is not a mount.
        let spec = state.mounted.get(source).cloned().unwrap_or(OverlaySpec {
            lowers: vec![source.to_path_buf()],
            upper: None,
            work: None,
            options: Vec::new(),
            read_only: true,
        });
        state.mounted.insert(target.to_path_buf(), OverlaySpec { read_only: true, ..spec });
        Ok(())
    }

    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError> {
        let mut state = self.lock();
        state.calls.push(FakeCall::Sync(path.to_path_buf()));
        match state.fail_next_sync.take() {
            Some(errno) => Err(MountError::new("syncfs", path, errno)),
            None => Ok(()),
        }
    }
}
