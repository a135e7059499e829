//! Reading a tree that someone else may change while lamina reads it, without ever
//! leaving it. A containerd snapshot's upper is such a tree: containerd, not lamina,
//! mounts it, so a container can still be writing through that mount while the snapshot
//! is committed or measured, and it can swap a directory for a symlink to `/` or a file
//! for a device node between lamina's listing and its open. A path walk would then read,
//! write or open the host's files with lamina's privileges.
//!
//! So every path is resolved from the tree's root descriptor with `openat2`, refusing
//! any symlink, any `..` out of the tree and any other mount on the way; and a file is
//! opened for I/O only after its `O_PATH` descriptor says it is a regular file, reopened
//! through `/proc/self/fd`, so a device node swapped in is never opened. What lamina
//! made and nobody else writes (a pull's staging directory) goes the same way: one walk
//! for both.

use std::cell::OnceCell;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};

/// A directory tree, held by its root's descriptor.
#[derive(Debug)]
pub struct Tree {
    root: OwnedFd,
    path: PathBuf,
}

/// What [`Tree::walk`] shows its visitor of one entry.
#[derive(Debug)]
pub struct Entry<'a> {
    /// The directory the entry is in, open.
    pub dir: BorrowedFd<'a>,
    /// The entry's name in it.
    pub name: &'a OsStr,
    /// `lstat` of the entry, from its directory's descriptor.
    pub stat: &'a Stat,
    /// The directory, as the walk knows it (none: the root).
    node: Option<&'a Rc<Node>>,
}

impl Entry<'_> {
    pub fn kind(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }

    /// The entry's path from the tree's root (as long as the entry is deep: build it
    /// only for the entries that need it).
    pub fn rel(&self) -> PathBuf {
        let mut rel = self.node.map(|n| n.rel()).unwrap_or_default();
        rel.push(self.name);
        rel
    }

    /// A descriptor of the entry that reads nothing (`O_PATH`), from its directory's, and
    /// what it is now.
    pub fn pin(&self) -> io::Result<(OwnedFd, Stat)> {
        pin_at(self.dir, Path::new(self.name))
    }
}

impl Tree {
    /// The tree whose root is the directory `path`. The root is the caller's to name
    /// (a store configured at a symlink is reached through it); only what is beneath it
    /// is resolved without following anything.
    pub fn open(path: &Path) -> io::Result<Tree> {
        let root = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Tree {
            root,
            path: path.to_path_buf(),
        })
    }

    /// Where the tree was opened, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` (relative, inside the tree) opened as `flags` say, no symlink followed on
    /// the way or at the end, nothing outside the tree or on another mount reached.
    fn resolve(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        resolve_from(self.root.as_fd(), rel, flags)
    }

    /// The root directory, open: to look names up from it ([`pin_at`]).
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The regular file at `rel`, opened to read. Anything else there is refused before
    /// it is opened for I/O.
    pub fn open_regular(&self, rel: &Path) -> io::Result<File> {
        let pinned = self.resolve(rel, OFlags::PATH)?;
        let kind = FileType::from_raw_mode(rustix::fs::fstat(&pinned)?.st_mode);
        if kind != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "{}: not a regular file",
                self.path.join(rel).display()
            )));
        }
        let file = rustix::fs::open(
            proc_path(&pinned),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(file))
    }

    /// Calls `visit` for every entry under the root (not the root itself), depth first;
    /// `visit` returns whether to go into a directory. An entry that is gone by the time
    /// it is looked at, or a directory that is no longer one inside the tree when it is
    /// opened (removed, or replaced by a symlink or a file meanwhile), is skipped: what
    /// the tree holds then is what it holds. So is what lies deeper than [`MAX_DEPTH`]
    /// directories. Returns whether nothing was skipped.
    ///
    /// Depth costs neither time nor descriptors nor stack without bound (a container can
    /// nest 20 000 directories, and opening each from the root takes minutes): a directory
    /// is opened from the nearest ancestor kept open (`anchor_spacing`), the directories
    /// still to visit are kept as names under their parents', and an entry's path is built
    /// only when asked for.
    pub fn walk(&self, mut visit: impl FnMut(&Entry<'_>) -> io::Result<bool>) -> io::Result<bool> {
        use rustix::io::Errno;
        let mut whole = true;
        let mut pending: Vec<Rc<Node>> = Vec::new();
        let mut current: Option<Rc<Node>> = None;
        loop {
            let fd = match &current {
                None => self.resolve(Path::new(""), OFlags::DIRECTORY | OFlags::RDONLY)?,
                Some(node) => match node.open(self.root.as_fd()) {
                    Err(e)
                        if matches!(
                            Errno::from_io_error(&e),
                            Some(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::XDEV)
                        ) =>
                    {
                        whole = false;
                        match pending.pop() {
                            Some(next) => {
                                current = Some(next);
                                continue;
                            }
                            None => return Ok(whole),
                        }
                    }
                    opened => opened?,
                },
            };
            let depth = current.as_ref().map_or(0, |n| n.depth);
            let mut dir = Dir::new(fd)?;
            while let Some(entry) = dir.read() {
                let entry = entry?;
                let name = OsStr::from_bytes(entry.file_name().to_bytes());
                if name == "." || name == ".." {
                    continue;
                }
                let stat = match rustix::fs::statat(dir.fd()?, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Err(Errno::NOENT) => {
                        whole = false;
                        continue;
                    }
                    found => found?,
                };
                let go_in = visit(&Entry {
                    dir: dir.fd()?,
                    name,
                    stat: &stat,
                    node: current.as_ref(),
                })?;
                if go_in && FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
                    if depth + 1 > MAX_DEPTH {
                        whole = false;
                        continue;
                    }
                    pending.push(Rc::new(Node::under(current.clone(), name.to_os_string())));
                }
            }
            match pending.pop() {
                Some(next) => current = Some(next),
                None => return Ok(whole),
            }
        }
    }
}

/// Bytes of path one `openat2` resolves at most: well under `PATH_MAX` (4096).
const STRETCH: usize = 2048;

/// Levels between the directories a walk keeps open near the top of a tree: one every
/// 64 levels down to 8192, then twice as far apart each time the depth doubles, so a
/// chain of a million levels keeps about 600 open (one every 64 levels without end runs
/// out of descriptors past 60 000 levels, and such a tree could not be removed), and no
/// open walks more names than one spacing.
fn anchor_spacing(depth: usize) -> usize {
    const NEAR: usize = 64;
    const BAND: usize = 8192;
    if depth <= BAND {
        return NEAR;
    }
    NEAR << (depth.div_ceil(BAND)).next_power_of_two().trailing_zeros()
}

/// Levels of directories [`Tree::walk`] goes down at most.
pub const MAX_DEPTH: usize = 65_536;

/// A directory [`Tree::walk`] has visited or has still to visit: its name under its
/// parent's, and, every so many levels ([`anchor_spacing`]), its descriptor.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) parent: Option<Rc<Node>>,
    pub(crate) name: OsString,
    /// Levels below the root (its entries are at 1).
    pub(crate) depth: usize,
    pub(crate) anchor: OnceCell<OwnedFd>,
}

impl Node {
    /// The directory's path from the tree's root.
    fn rel(&self) -> PathBuf {
        let mut names = vec![self.name.as_os_str()];
        let mut up = self.parent.as_deref();
        while let Some(dir) = up {
            names.push(dir.name.as_os_str());
            up = dir.parent.as_deref();
        }
        names.iter().rev().collect()
    }

    /// A directory `name` under `parent` (none: under the root).
    pub(crate) fn under(parent: Option<Rc<Node>>, name: OsString) -> Node {
        let depth = parent.as_ref().map_or(0, |p| p.depth) + 1;
        Node {
            parent,
            name,
            depth,
            anchor: OnceCell::new(),
        }
    }

    /// Opens the directory to list it, from its nearest ancestor kept open (or `root`),
    /// keeping it open itself if it is an anchor.
    pub(crate) fn open(&self, root: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        if let Some(kept) = self.anchor.get() {
            return resolve_from(
                kept.as_fd(),
                Path::new(""),
                OFlags::DIRECTORY | OFlags::RDONLY,
            );
        }
        let mut names = vec![self.name.as_os_str()];
        let mut up = self.parent.as_deref();
        let from = loop {
            match up {
                None => break root,
                Some(dir) => match dir.anchor.get() {
                    Some(fd) => break fd.as_fd(),
                    None => {
                        names.push(dir.name.as_os_str());
                        up = dir.parent.as_deref();
                    }
                },
            }
        };
        let rel: PathBuf = names.iter().rev().collect();
        let fd = resolve_from(from, &rel, OFlags::DIRECTORY | OFlags::RDONLY)?;
        if self.depth.is_multiple_of(anchor_spacing(self.depth)) {
            let _ = self.anchor.set(fd.try_clone()?);
        }
        Ok(fd)
    }
}

impl Drop for Node {
    /// Unlinks the chain of parents a level at a time: dropped recursively, a chain of
    /// tens of thousands of levels overflows the stack.
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(parent) = next {
            next = match Rc::try_unwrap(parent) {
                Ok(mut only) => only.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// `rel` under the directory `from` opened as `flags` say, no symlink followed on the way
/// or at the end, nothing outside `from` or on another mount reached. A path longer than
/// one `openat2` takes (a container can nest directories past `PATH_MAX`) is resolved a
/// stretch at a time, each from the directory the last one reached.
pub(crate) fn resolve_from(from: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let mut names = rel.components().peekable();
    let mut at: Option<OwnedFd> = None;
    loop {
        let mut stretch = PathBuf::new();
        while let Some(name) = names.peek() {
            let long = stretch.as_os_str().len() + name.as_os_str().len() + 1 > STRETCH;
            if long && !stretch.as_os_str().is_empty() {
                break;
            }
            stretch.push(name);
            names.next();
        }
        let last = names.peek().is_none();
        let how = if last {
            flags
        } else {
            OFlags::PATH | OFlags::DIRECTORY
        };
        let base = at.as_ref().map_or(from, |fd| fd.as_fd());
        let target = if stretch.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &stretch
        };
        let opened = rustix::fs::openat2(
            base,
            target,
            how | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV,
        )?;
        if last {
            return Ok(opened);
        }
        at = Some(opened);
    }
}

/// A descriptor that reads nothing (`O_PATH`) of `rel` under the directory `dir`, resolved
/// as [`Tree`] resolves every path, and what it is.
pub fn pin_at(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<(OwnedFd, Stat)> {
    let pinned = resolve_from(dir, rel, OFlags::PATH)?;
    let stat = rustix::fs::fstat(&pinned)?;
    Ok((pinned, stat))
}

/// The path through which `fd`'s own inode is reached again (`/proc/self/fd/N`): opening
/// or reading the xattrs of it never resolves a name that could have changed.
pub fn proc_path(fd: &impl AsFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_symlink_anywhere_on_the_way_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(root.join("d/f"), "inside").unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("f"), "outside").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), root.join("d/file-link")).unwrap();
        let tree = Tree::open(&root).unwrap();

        assert_eq!(
            io::read_to_string(tree.open_regular(Path::new("d/f")).unwrap()).unwrap(),
            "inside"
        );
        for rel in ["link/f", "d/file-link", "../outside/f", "d/../../outside/f"] {
            assert!(
                tree.open_regular(Path::new(rel)).is_err(),
                "{rel} was opened"
            );
        }
        let mut seen = Vec::new();
        tree.walk(|e| {
            seen.push(e.rel());
            Ok(true)
        })
        .unwrap();
        seen.sort();
        let expected: Vec<PathBuf> = ["d", "d/f", "d/file-link", "link"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen, expected, "the walk went through a symlink");
    }

    /// What a container writing its live upper can do between the listing and the open.
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_not_entered() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("d")).unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), "host").unwrap();
        let tree = Tree::open(&root).unwrap();
        let mut seen = Vec::new();
        let whole = tree
            .walk(|e| {
                if e.rel() == Path::new("d") {
                    fs::remove_dir(root.join("d")).unwrap();
                    std::os::unix::fs::symlink(&outside, root.join("d")).unwrap();
                }
                seen.push(e.rel());
                Ok(true)
            })
            .unwrap();
        assert_eq!(seen, vec![PathBuf::from("d")], "the walk went outside");
        assert!(!whole, "the skipped directory is said");
    }

    /// A container can nest directories past `PATH_MAX`; walking and opening them must
    /// not fail on the path's length (which would fail `stats`, Usage and the store-wide
    /// `clean --threshold-bytes`).
    #[test]
    fn a_tree_deeper_than_path_max_is_walked_and_opened() {
        let dir = tempfile::tempdir().unwrap();
        let name = "d".repeat(50);
        let mut at = rustix::fs::open(dir.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..200 {
            rustix::fs::mkdirat(&at, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            at = rustix::fs::openat(&at, name.as_str(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        let file = rustix::fs::openat(
            &at,
            "bottom",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&file, b"deep").unwrap();
        let tree = Tree::open(dir.path()).unwrap();
        let mut deepest = PathBuf::new();
        let whole = tree
            .walk(|e| {
                let rel = e.rel();
                if rel.as_os_str().len() > deepest.as_os_str().len() {
                    deepest = rel;
                }
                Ok(true)
            })
            .unwrap();
        assert!(whole);
        assert!(deepest.as_os_str().len() > 10_000, "{}", deepest.display());
        assert!(deepest.ends_with("bottom"));
        let read = io::read_to_string(tree.open_regular(&deepest).unwrap()).unwrap();
        assert_eq!(read, "deep");
    }

    /// A container can nest 20 000 directories: the walk must neither overflow the stack of
    /// the thread walking them (which aborts the daemon) nor take minutes.
    #[test]
    fn twenty_thousand_levels_are_walked_on_a_small_stack() {
        let base = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm")
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        let root = base.path().to_path_buf();
        let mut at = rustix::fs::open(&root, OFlags::DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..20_000 {
            rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
            at = rustix::fs::openat(&at, "d", OFlags::DIRECTORY, Mode::empty()).unwrap();
        }
        // Held open, the deepest directory would pin every dentry above it, and each
        // rmdir would walk them all.
        drop(at);
        let walked = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                let tree = Tree::open(&root).unwrap();
                let mut seen = 0;
                let whole = tree
                    .walk(|_| {
                        seen += 1;
                        Ok(true)
                    })
                    .unwrap();
                (whole, seen)
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(walked, (true, 20_000));
        // std's remove_dir_all recurses once a level, and overflows here too.
        crate::remove_tree(base.path()).unwrap();
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the FIFO an attacker would plant
    fn what_is_not_a_regular_file_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        fs::create_dir(dir.path().join("dir")).unwrap();
        let tree = Tree::open(dir.path()).unwrap();
        // Opening a FIFO without a writer would block; refused before any open for I/O.
        for rel in ["fifo", "dir"] {
            let err = tree.open_regular(Path::new(rel)).unwrap_err();
            assert!(
                err.to_string().contains("not a regular file"),
                "{rel}: {err}"
            );
        }
    }
}
