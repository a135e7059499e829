//! Every regular file of an imported layer with the fs-verity digest of its content
//! (`layers/<chain-id>/file-list`), written at import beside `layer.json`, so that
//! `check --verify` can hash a layer's tree again and name each file changed, added or
//! gone since. Without it a changed byte in a classic layer's tree (`diff/bin/busybox`)
//! would run in every container of that image and no check would see it.
//!
//! The digest is composefs's object name (SHA-256 fs-verity, 4 KiB blocks), the same
//! hashing sharing stores use to store each file's content once. Each inode is hashed
//! once, whatever number of names it has.
//!
//! The list is as trustworthy as the store (root's, 0700): it finds damage and edits that
//! did not also rewrite the list, not an attacker who can write the store.
//!
//! Format: a header line, then one line per file sorted by path: the digest in hex, a
//! space, the path with every byte outside `!`..`~` and every `%` written as `%XX`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use composefs::fsverity::{FsVerityHashValue, FsVerityHasher};
use rustix::fs::{FileType, OFlags};

use crate::beneath::{Entry, Tree};
use crate::file_objects::ObjectId;

/// The file beside a layer's `diff/`.
pub const FILE_LIST: &str = "file-list";

const HEADER: &str = "lamina file list 1";

/// Files listed in one layer, and bytes of their paths: past either the layer gets no list
/// (a tar of a few megabytes can name a million files under a deep directory).
const MAX_FILES: usize = 1_000_000;
const MAX_PATH_BYTES: usize = 64 << 20;

/// The largest list read: [`MAX_FILES`] digests and [`MAX_PATH_BYTES`] escaped.
const MAX_LIST_BYTES: u64 = (MAX_FILES as u64) * 66 + 3 * MAX_PATH_BYTES as u64;

/// A layer's regular files and their digests, by path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileList {
    files: BTreeMap<PathBuf, ObjectId>,
}

/// How a layer's tree differs from its list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// Listed, and its content hashes to something else now.
    Changed(PathBuf),
    /// A regular file the list does not name.
    Added(PathBuf),
    /// Listed, and no longer a regular file there.
    Gone(PathBuf),
    /// Part of the tree could not be walked (moved or replaced while it was read).
    Unwalked,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Changed(p) => write!(f, "{}: content changed since import", shown(p)),
            Self::Added(p) => write!(f, "{}: a file the layer did not have", shown(p)),
            Self::Gone(p) => write!(f, "{}: gone (or no longer a regular file)", shown(p)),
            Self::Unwalked => f.write_str("the tree changed while it was read"),
        }
    }
}

fn shown(path: &Path) -> String {
    lamina_image::shown(&path.display().to_string())
}

impl FileList {
    /// Hashes every regular file under `diff`. `None` when the layer is past what is
    /// listed, or part of it could not be walked; stops when `cancelled`.
    pub fn hash(diff: &Path, cancelled: &AtomicBool) -> io::Result<Option<FileList>> {
        let tree = Tree::open(diff)?;
        let mut list = FileList::default();
        let mut path_bytes = 0;
        let mut by_inode = HashMap::new();
        let walked = tree.walk(|entry| {
            if entry.kind() != FileType::RegularFile {
                return Ok(true);
            }
            if cancelled.load(Ordering::Relaxed) {
                return Err(io::Error::other("the import is being given up"));
            }
            let rel = entry.rel();
            path_bytes += rel.as_os_str().len();
            if list.files.len() >= MAX_FILES || path_bytes > MAX_PATH_BYTES {
                return Err(io::Error::other(PastBounds));
            }
            let key = (entry.stat.st_dev, entry.stat.st_ino);
            let digest = match by_inode.get(&key) {
                Some(digest) => Clone::clone(digest),
                None => {
                    let digest = hash_entry(&tree, entry)?;
                    by_inode.insert(key, digest.clone());
                    digest
                }
            };
            list.files.insert(rel, digest);
            Ok(true)
        });
        match walked {
            Ok(true) => Ok(Some(list)),
            Ok(false) => Ok(None),
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<PastBounds>()) => {
                tracing::info!(layer = %diff.display(), "layer past what is listed for check --verify");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The list as written beside a layer's `diff/`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.files.len() * 100);
        out.extend_from_slice(HEADER.as_bytes());
        out.push(b'\n');
        for (path, digest) in &self.files {
            out.extend_from_slice(digest.to_hex().as_bytes());
            out.push(b' ');
            escape(path.as_os_str().as_bytes(), &mut out);
            out.push(b'\n');
        }
        out
    }

    /// The list of the layer at `layer_dir`: `Ok(None)` when it has none (imported before
    /// lists were written, a committed containerd snapshot, a layer past the bounds).
    pub fn read(layer_dir: &Path) -> io::Result<Option<FileList>> {
        let path = layer_dir.join(FILE_LIST);
        let file = match crate::open_regular_file(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.take(MAX_LIST_BYTES + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_LIST_BYTES {
            return Err(io::Error::other(format!("{}: too large", path.display())));
        }
        parse(&bytes)
            .map(Some)
            .ok_or_else(|| io::Error::other(format!("{}: not a file list", path.display())))
    }

    /// How the tree under `diff` differs from this list, each file hashed again.
    pub fn differences(&self, diff: &Path) -> io::Result<Vec<Difference>> {
        let tree = Tree::open(diff)?;
        let mut found = Vec::new();
        let mut seen = 0;
        let mut by_inode: HashMap<(u64, u64), ObjectId> = HashMap::new();
        let whole = tree.walk(|entry| {
            if entry.kind() != FileType::RegularFile {
                return Ok(true);
            }
            let rel = entry.rel();
            let Some(listed) = self.files.get(&rel) else {
                found.push(Difference::Added(rel));
                return Ok(true);
            };
            seen += 1;
            let key = (entry.stat.st_dev, entry.stat.st_ino);
            let digest = match by_inode.get(&key) {
                Some(digest) => Clone::clone(digest),
                None => {
                    let digest = hash_entry(&tree, entry)?;
                    by_inode.insert(key, digest.clone());
                    digest
                }
            };
            if digest != *listed {
                found.push(Difference::Changed(rel));
            }
            Ok(true)
        })?;
        if !whole {
            found.push(Difference::Unwalked);
        }
        if seen < self.files.len() {
            for path in self.files.keys() {
                let is_file = crate::beneath::pin_at(tree.root(), path)
                    .is_ok_and(|(_, st)| FileType::from_raw_mode(st.st_mode).is_file());
                if !is_file {
                    found.push(Difference::Gone(path.clone()));
                }
            }
        }
        Ok(found)
    }
}

/// Past [`MAX_FILES`] or [`MAX_PATH_BYTES`].
#[derive(Debug)]
struct PastBounds;

impl std::fmt::Display for PastBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("past the files a layer's list holds")
    }
}

impl std::error::Error for PastBounds {}

/// The fs-verity digest of the regular file `entry`, opened from the directory the walk
/// holds without following its name, and checked to be the inode the walk listed.
fn hash_entry(tree: &Tree, entry: &Entry<'_>) -> io::Result<ObjectId> {
    let fd = rustix::fs::openat(
        entry.dir,
        entry.name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let now = rustix::fs::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (entry.stat.st_dev, entry.stat.st_ino) {
        return Err(io::Error::other(format!(
            "{}: changed while hashed",
            tree.path().join(entry.rel()).display()
        )));
    }
    let mut hasher = FsVerityHasher::<ObjectId, 12>::new();
    io::copy(&mut File::from(fd), &mut hasher)?;
    Ok(hasher.digest())
}

fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if (b'!'..=b'~').contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

fn unescape(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%' {
            let hex = std::str::from_utf8(text.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    Some(out)
}

fn parse(bytes: &[u8]) -> Option<FileList> {
    let mut lines = bytes.strip_suffix(b"\n")?.split(|&b| b == b'\n');
    if lines.next()? != HEADER.as_bytes() {
        return None;
    }
    let mut files = BTreeMap::new();
    for line in lines {
        let space = line.iter().position(|&b| b == b' ')?;
        let digest = ObjectId::from_hex(std::str::from_utf8(&line[..space]).ok()?).ok()?;
        let path = PathBuf::from(OsStr::from_bytes(&unescape(&line[space + 1..])?));
        if path.as_os_str().is_empty() || files.insert(path, digest).is_some() {
            return None;
        }
    }
    Some(FileList { files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_reads_back_as_written_whatever_bytes_its_paths_hold() {
        let dir = tempfile::tempdir().unwrap();
        let diff = dir.path().join("diff");
        std::fs::create_dir_all(diff.join("etc")).unwrap();
        std::fs::write(diff.join("etc/passwd"), b"root:x:0:0\n").unwrap();
        std::fs::write(diff.join("odd name%\n\u{7f}"), b"odd").unwrap();
        std::fs::hard_link(diff.join("etc/passwd"), diff.join("linked")).unwrap();
        std::os::unix::fs::symlink("etc/passwd", diff.join("link")).unwrap();
        let list = FileList::hash(&diff, &AtomicBool::new(false))
            .unwrap()
            .unwrap();
        assert_eq!(list.len(), 3, "regular files only, every name of an inode");
        std::fs::write(dir.path().join(FILE_LIST), list.to_bytes()).unwrap();
        let read = FileList::read(dir.path()).unwrap().unwrap();
        assert_eq!(read, list);
        assert_eq!(read.differences(&diff).unwrap(), vec![]);
    }

    #[test]
    fn differences_name_each_file_changed_added_and_gone() {
        let dir = tempfile::tempdir().unwrap();
        let diff = dir.path().join("diff");
        std::fs::create_dir_all(diff.join("bin")).unwrap();
        std::fs::write(diff.join("bin/busybox"), vec![7u8; 10_000]).unwrap();
        std::fs::write(diff.join("bin/gone"), b"x").unwrap();
        std::fs::write(diff.join("kept"), b"kept").unwrap();
        let list = FileList::hash(&diff, &AtomicBool::new(false))
            .unwrap()
            .unwrap();
        let mut changed = vec![7u8; 10_000];
        changed[4321] = 8;
        std::fs::write(diff.join("bin/busybox"), changed).unwrap();
        std::fs::remove_file(diff.join("bin/gone")).unwrap();
        std::fs::write(diff.join("ld.so.preload"), b"/evil.so").unwrap();
        let mut found = list.differences(&diff).unwrap();
        found.sort_by_key(|d| format!("{d:?}"));
        assert_eq!(
            found,
            vec![
                Difference::Added(PathBuf::from("ld.so.preload")),
                Difference::Changed(PathBuf::from("bin/busybox")),
                Difference::Gone(PathBuf::from("bin/gone")),
            ]
        );
    }

    #[test]
    fn a_damaged_list_is_refused_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [
            &b"not a list\n"[..],
            b"lamina file list 1\nzz path\n",
            b"lamina file list 1\n",
        ] {
            std::fs::write(dir.path().join(FILE_LIST), bad).unwrap();
            let read = FileList::read(dir.path());
            if bad == b"lamina file list 1\n" {
                assert_eq!(read.unwrap().unwrap().len(), 0);
            } else {
                assert!(read.is_err(), "{}", String::from_utf8_lossy(bad));
            }
        }
        assert!(FileList::read(&dir.path().join("none")).unwrap().is_none());
    }
}
