//! A directory tree as a comparable value: what "the store is unchanged" and "nothing was
//! written outside" mean in a test.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Every path under a root with its type, mode and (for files and symlinks) size or
/// target. Directory mtimes are left out: reading a tree must not count as a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree(BTreeMap<PathBuf, String>);

impl Tree {
    /// Walks `root` without following symlinks, leaving out the subtrees at the relative
    /// paths in `skip` (a store's `locks/` and `run/`: empty flock files and per-boot
    /// caches, no state a reader trusts).
    pub fn of(root: &Path, skip: &[&str]) -> Tree {
        let mut map = BTreeMap::new();
        walk(root, root, skip, false, &mut map);
        Tree(map)
    }

    /// [`Tree::of`] with each regular file's content digest too: a file of the right
    /// size holding zeros (a power cut's) differs. A walk that cannot read what it lists
    /// panics rather than leave the entry out.
    pub fn with_contents(root: &Path) -> Tree {
        let mut map = BTreeMap::new();
        walk(root, root, &[], true, &mut map);
        Tree(map)
    }

    /// The entries that differ, one per line, for a failure message.
    pub fn diff(&self, after: &Tree) -> String {
        let mut out = String::new();
        for (path, before) in &self.0 {
            match after.0.get(path) {
                None => out.push_str(&format!("- {} {before}\n", path.display())),
                Some(a) if a != before => {
                    out.push_str(&format!("~ {} {before} -> {a}\n", path.display()))
                }
                Some(_) => {}
            }
        }
        for (path, a) in &after.0 {
            if !self.0.contains_key(path) {
                out.push_str(&format!("+ {} {a}\n", path.display()));
            }
        }
        out
    }
}

fn walk(
    root: &Path,
    dir: &Path,
    skip: &[&str],
    contents: bool,
    map: &mut BTreeMap<PathBuf, String>,
) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if contents => panic!("reading {}: {e}", dir.display()),
        Err(_) => return,
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let rel = path.strip_prefix(root).expect("under root").to_path_buf();
        if skip.iter().any(|s| rel == Path::new(s)) {
            continue;
        }
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if contents => panic!("looking at {}: {e}", path.display()),
            Err(_) => continue,
        };
        let mode = meta.permissions().mode() & 0o7777;
        let what = if meta.is_dir() {
            format!("dir {mode:o}")
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(&path).unwrap_or_default();
            format!("symlink -> {}", target.display())
        } else if meta.is_file() && contents {
            let bytes =
                fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let digest = lamina_image::Digest::of(&bytes);
            format!("file {mode:o} {} bytes {}", meta.len(), digest.hex())
        } else if meta.is_file() {
            format!("file {mode:o} {} bytes", meta.len())
        } else {
            format!("special {:o} rdev {}", meta.mode(), meta.rdev())
        };
        map.insert(rel, what);
        if meta.is_dir() {
            walk(root, &path, skip, contents, map);
        }
    }
}
