//! Who may enter the store. Layers hold whatever images ship — setuid-root binaries, 0666
//! device nodes — so a host user who can reach `layers/<chain>/diff/…` or a mounted
//! `images/<id>/rootfs/…` can become root through them (the class of Docker's
//! CVE-2021-41091). Nothing under the store root is reachable by anyone but root, whatever
//! the process umask:
//!
//! - the store root and every directory lamina keeps at its top are `0700`, owned by root;
//! - on a uid-mapped store, a user-namespaced runtime must still walk to its rootfs as the
//!   mapped root, so the root and `images/` are `0710` with the mapped root's *group*:
//!   enough to traverse, not to list or create; `layers/` and the rest stay `0700`.
//!
//! Every open tightens an existing store that is looser than this and logs each change.

use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use lamina_sys::{At, HostFs};
use rustix::fs::{CWD, Mode, OFlags};
use rustix::io::Errno;

use crate::{Layout, StoreError, StoreProperties};

/// Mode of every store directory no runtime needs to walk through.
pub const PRIVATE_MODE: u32 = 0o700;
/// Mode of the root and `images/` on a mapped store: the mapped root's group traverses.
pub const TRAVERSE_MODE: u32 = 0o710;

/// The group that may traverse to rootfses: the host gid of the containers' root, on a
/// store with a gid mapping for 0.
fn traverse_group(properties: &StoreProperties) -> Option<u32> {
    properties
        .id_map
        .gids
        .iter()
        .find_map(|m| m.to_host(0))
        .filter(|&gid| gid != 0)
}

/// Sets the process umask to 022. The store's privacy comes from the explicit modes
/// here, not from the caller's umask; a fixed one makes everything else (a rootfs's
/// directories, which a user-namespaced runtime must walk) the same whoever runs lamina.
pub fn use_fixed_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
}

/// Creates `dir` (and missing parents) with mode 0700 from the start, so there is no
/// moment at which the umask's mode lets anyone in.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_MODE)
        .create(dir)
}

/// Whether [`secure_store`] may make the store's root (and its parents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Root {
    Make,
    Existing,
}

/// Creates the top-level directories that are missing, then brings the root and each
/// of them to the mode and group above, logging every change. The root is opened once
/// (following a symlink there: operators link stores elsewhere) and everything below is
/// made and opened relative to that fd without following symlinks, so a directory
/// swapped for a symlink mid-way is refused, never followed.
///
/// The ownership is read and changed through `host` (the kernel seam): giving a
/// directory to root needs privilege, so the fake records it instead.
///
/// Only `init` makes the root (`Root::Make`). An open finds it or fails: a process that
/// read the marker just before the store's filesystem went away (a lingering reaper, a
/// test's scratch filesystem detached) must not make an empty store where it was.
pub(crate) fn secure_store(
    layout: &Layout,
    properties: &StoreProperties,
    host: &dyn HostFs,
    root_is: Root,
) -> Result<(), StoreError> {
    let (walk_mode, walk_gid) = match traverse_group(properties) {
        Some(gid) => (TRAVERSE_MODE, gid),
        None => (PRIVATE_MODE, 0),
    };
    let root = layout.root();
    if root_is == Root::Make {
        create_private_dir(root).map_err(StoreError::io("creating", root))?;
    }
    let root_fd = match open_dir(CWD, root, OFlags::empty(), root) {
        Err(_) if root_is == Root::Existing && !root.exists() => {
            return Err(StoreError::NotInitialised(root.to_path_buf()));
        }
        opened => opened?,
    };
    // The marker where the root was opened: the store's filesystem may have gone from
    // under an open path since the marker was read.
    let marker = layout.marker();
    if root_is == Root::Existing {
        let name = marker.file_name().unwrap_or_default();
        match host.stat(At::Child(root_fd.as_fd(), name)) {
            Ok(_) => {}
            Err(Errno::NOENT) => return Err(StoreError::NotInitialised(root.to_path_buf())),
            Err(e) => return Err(StoreError::errno("reading", &marker)(e)),
        }
    }
    tighten(host, &root_fd, root, walk_mode, walk_gid)?;
    let dirs = std::iter::once((layout.images(), walk_mode, walk_gid))
        .chain(private_dirs(layout).map(|dir| (dir, PRIVATE_MODE, 0)));
    for (dir, mode, gid) in dirs {
        let name = dir.file_name().unwrap_or_default();
        // Every command opens the store: one lstat settles a directory that is already
        // right (a check only; anything else takes the fd path below).
        if host
            .stat(At::Child(root_fd.as_fd(), name))
            .is_ok_and(|st| already_right(host, &st, mode, gid))
        {
            continue;
        }
        match rustix::fs::mkdirat(&root_fd, name, Mode::from_raw_mode(PRIVATE_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(StoreError::errno("creating", &dir)(e)),
        }
        let fd = open_dir(root_fd.as_fd(), Path::new(name), OFlags::NOFOLLOW, &dir)?;
        tighten(host, &fd, &dir, mode, gid)?;
    }
    Ok(())
}

/// Whether `st` (an lstat) is a directory [`tighten`] would leave as it is.
fn already_right(host: &dyn HostFs, st: &rustix::fs::Stat, mode: u32, gid: u32) -> bool {
    let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
    let owner_right = (st.st_uid == 0 && st.st_gid == gid) || !host.may_chown();
    is_dir && owner_right && st.st_mode & 0o7777 == mode
}

/// Every top-level directory but the root and `images/`. `run/` is last: its presence
/// says the rest exist (see [`crate::Store::open`]).
fn private_dirs(layout: &Layout) -> [std::path::PathBuf; 12] {
    [
        layout.layers(),
        layout.links(),
        layout.tmp(),
        layout.locks(),
        layout.trash(),
        layout.shared(),
        layout.flat(),
        layout.objects(),
        layout.composefs(),
        layout.pool(),
        layout.snapshots(),
        layout.run(),
    ]
}

fn open_dir(
    at: BorrowedFd<'_>,
    path: &Path,
    extra: OFlags,
    shown: &Path,
) -> Result<OwnedFd, StoreError> {
    rustix::fs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => StoreError::io("securing", shown)(std::io::Error::other(
            "expected a directory, found a symlink or a file",
        )),
        e => StoreError::errno("securing", shown)(e),
    })
}

/// Sets the directory open as `fd` to exactly `mode` (permission bits), owner root and
/// group `gid`, if it is anything else; logs what it changed. The mode is read again
/// after a chown: a previous owner could have changed it in between.
fn tighten(
    host: &dyn HostFs,
    fd: &OwnedFd,
    dir: &Path,
    mode: u32,
    gid: u32,
) -> Result<(), StoreError> {
    let at = At::Fd(fd.as_fd());
    let mut st = host.stat(at).map_err(StoreError::errno("securing", dir))?;
    // Only root can give a directory away; an unprivileged caller (unit tests on the
    // real host) keeps its own ownership, which no other user can use either.
    let owner_wrong = st.st_uid != 0 || st.st_gid != gid;
    if owner_wrong && host.may_chown() {
        host.chown(at, 0, gid)
            .map_err(StoreError::errno("securing", dir))?;
        tracing::warn!(
            path = %dir.display(),
            from = format!("{}:{}", st.st_uid, st.st_gid),
            to = format!("0:{gid}"),
            "changed the owner of a store directory"
        );
        st = host.stat(at).map_err(StoreError::errno("securing", dir))?;
    }
    let old_mode = st.st_mode & 0o7777;
    if old_mode != mode {
        host.set_mode(At::Fd(fd.as_fd()), mode)
            .map_err(StoreError::errno("securing", dir))?;
        tracing::warn!(
            path = %dir.display(),
            from = format!("{old_mode:04o}"),
            to = format!("{mode:04o}"),
            "tightened a store directory's mode: no other host user may reach the store"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_root_group_traverses() {
        let mut props = StoreProperties::default();
        assert_eq!(traverse_group(&props), None);
        props.id_map = crate::properties::test_map(100_000, 200_000);
        assert_eq!(traverse_group(&props), Some(200_000));
    }

    #[test]
    fn private_dirs_are_created_0700_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let made = create_private_dir(&dir);
        rustix::process::umask(old);
        made.unwrap();
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&dir).unwrap()) & 0o7777;
        assert_eq!(mode, PRIVATE_MODE);
    }

    #[test]
    fn an_open_makes_no_store_where_one_went_away() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("gone/store");
        let layout = Layout::new(&root);
        let host = lamina_sys::RealHost;
        let props = StoreProperties::default();
        assert!(matches!(
            secure_store(&layout, &props, &host, Root::Existing),
            Err(StoreError::NotInitialised(_))
        ));
        assert!(!tmp.path().join("gone").exists());
        // A root left behind without its marker (the store's filesystem detached from it).
        std::fs::create_dir_all(&root).unwrap();
        assert!(matches!(
            secure_store(&layout, &props, &host, Root::Existing),
            Err(StoreError::NotInitialised(_))
        ));
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        secure_store(&layout, &props, &host, Root::Make).unwrap();
        assert!(layout.locks().is_dir());
    }
}
