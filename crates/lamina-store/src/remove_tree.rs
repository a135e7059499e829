//! Removing a directory tree whatever its depth. `std::fs::remove_dir_all` recurses once
//! per level, so a container that nests tens of thousands of directories in its upper
//! would make the delete, the reaper or a `clean` that removes it overflow its stack and
//! abort (the daemon with it). Here the tree is taken apart in a loop, children before
//! their directory: an empty directory is removed where it is listed, any other opened
//! as `beneath::Tree::walk` opens it (from the nearest ancestor kept open, no symlink
//! followed, no other mount entered). Nothing is moved: after a failure, what is left is
//! where it was.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::beneath::Node;

/// Removes `path` and everything under it, as `fs::remove_dir_all` does (a symlink or
/// file at `path` is removed itself; nothing is followed; a missing `path` is `NotFound`,
/// but what someone else removes meanwhile is not an error; the first error stops it),
/// in constant stack. A mount beneath is not entered: it fails the removal (`EXDEV`).
pub fn remove_tree(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    if !fs::symlink_metadata(path)?.is_dir() {
        return fs::remove_file(path);
    }
    let root = rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    /// A directory to empty, or one emptied to remove.
    enum Step {
        Empty(Option<Rc<Node>>),
        Remove(Rc<Node>),
    }
    let mut steps = vec![Step::Empty(None)];
    // The files at the top go last: a container's `lock` is one, and while it is there
    // nobody else takes the directory for free to remove.
    let mut top_files = Vec::new();
    while let Some(step) = steps.pop() {
        match step {
            Step::Empty(node) => {
                let fd = match open(&root, node.as_deref()) {
                    Ok(fd) => fd,
                    // Removed meanwhile by someone else (the reaper and an inline delete
                    // of the same trash entry), as std's remove_dir_all allows.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                if let Some(node) = &node {
                    steps.push(Step::Remove(node.clone()));
                }
                let mut entries = Dir::new(fd)?;
                while let Some(entry) = entries.read() {
                    let entry = entry?;
                    let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
                    if name == "." || name == ".." {
                        continue;
                    }
                    let dir = entries.fd()?;
                    let kind = match entry.file_type() {
                        FileType::Unknown => {
                            match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                                Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                                Err(Errno::NOENT) => continue,
                                Err(e) => return Err(e.into()),
                            }
                        }
                        kind => kind,
                    };
                    if kind == FileType::Directory {
                        // An empty directory (a container's rootfs, an unused upper) goes
                        // in one call; one with entries, or a mount point (`EBUSY`), is
                        // opened and emptied as before.
                        match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
                            Ok(()) | Err(Errno::NOENT) => continue,
                            Err(_) => {}
                        }
                        let child = Node::under(node.clone(), name.to_os_string());
                        steps.push(Step::Empty(Some(Rc::new(child))));
                        continue;
                    }
                    if node.is_none() {
                        top_files.push(name.to_os_string());
                        continue;
                    }
                    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Step::Remove(node) => {
                let parent = match open(&root, node.parent.as_deref()) {
                    Ok(fd) => fd,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                match rustix::fs::unlinkat(&parent, node.name.as_os_str(), AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    for name in top_files {
        match rustix::fs::unlinkat(&root, name.as_os_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop(root);
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        done => done,
    }
}

/// The directory `node` names under `root` (none: the root itself), open to list.
fn open(root: &OwnedFd, node: Option<&Node>) -> io::Result<OwnedFd> {
    match node {
        None => Ok(rustix::fs::openat(
            root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?),
        Some(node) => node.open(root.as_fd()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_of_every_kind_goes_and_nothing_beyond_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("t");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::create_dir_all(root.join("a/empty")).unwrap();
        fs::create_dir_all(root.join("empty")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("kept"), "kept").unwrap();
        fs::write(root.join("a/b/c/f"), "x").unwrap();
        fs::write(root.join("top"), "x").unwrap();
        fs::hard_link(root.join("top"), root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/b/to-outside")).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(fs::read_to_string(outside.join("kept")).unwrap(), "kept");
        assert_eq!(
            remove_tree(&root).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::os::unix::fs::symlink(&outside, &root).unwrap();
        remove_tree(&root).unwrap();
        assert!(
            outside.join("kept").exists(),
            "a symlink goes, not what it names"
        );
    }

    /// The reaper and an inline delete can remove the same trash entry at once: neither
    /// fails on what the other removed (caught by CI: a commit failed with "No such file
    /// or directory"). A round in which both began while the tree was there has both
    /// succeed; on a loaded host some rounds do not overlap (the second finds nothing:
    /// `NotFound`, as std's), so it is asked of one round in ten.
    #[test]
    fn two_removals_of_one_tree_both_succeed() {
        let mut both = 0;
        for _ in 0..10 {
            let tmp = tempfile::tempdir_in(
                Some("/dev/shm")
                    .filter(|p| Path::new(p).is_dir())
                    .unwrap_or("/tmp"),
            )
            .unwrap();
            let root = tmp.path().join("t");
            for i in 0..2000 {
                fs::create_dir_all(root.join(format!("{i}/a/b"))).unwrap();
                fs::create_dir_all(root.join(format!("{i}/a/empty"))).unwrap();
                fs::create_dir_all(root.join(format!("{i}/empty"))).unwrap();
                fs::write(root.join(format!("{i}/a/b/f")), "x").unwrap();
            }
            let start = std::sync::Arc::new(std::sync::Barrier::new(2));
            let (other, other_start) = (root.clone(), start.clone());
            let racing = std::thread::spawn(move || {
                other_start.wait();
                remove_tree(&other)
            });
            start.wait();
            let here = remove_tree(&root);
            let there = racing.join().unwrap();
            match (&here, &there) {
                (Ok(()), Ok(())) => both += 1,
                (Ok(()), Err(e)) | (Err(e), Ok(())) if e.kind() == io::ErrorKind::NotFound => {}
                _ => panic!("{here:?} {there:?}"),
            }
            assert!(!root.exists());
        }
        assert!(both > 0, "no round had both succeed");
    }
}
