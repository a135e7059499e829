//! A layer's index as the changes it makes to the tree below it: what a lazy layer's
//! metadata is built from, before any file's bytes are present. The rules are the tar
//! unpacker's (`lamina_unpack`), so a lazy layer shows what the same layer pulled whole
//! shows: names beneath the layer root (no `..`, no absolute path, no NUL), whiteouts and
//! opaque markers by name, aufs bookkeeping ignored, overlay's and lamina's own xattrs
//! dropped, hardlinks only to an earlier file of the same layer, nothing inside a
//! non-directory or a whiteout of this layer, no whiteout of what this layer holds, no
//! non-directory where this layer has a directory, symlink targets non-empty, without NUL
//! and under PATH_MAX. Anything the unpacker would refuse, and anything an index cannot
//! say safely (a name given twice, a path deeper than 128, a device number past Linux's,
//! an owner of -1), refuses the index: the layer is pulled whole.

use std::collections::HashMap;

use lamina_unpack::{EntryPath, is_reserved_xattr};

use crate::lazy::{IndexError, LazyFile, index_error};

/// Linux's largest device major and minor numbers.
const MAX_MAJOR: u64 = (1 << 12) - 1;
const MAX_MINOR: u64 = (1 << 20) - 1;
/// Linux's PATH_MAX, the longest symlink target the tar path takes.
const PATH_MAX: usize = 4096;
/// The deepest an entry may lie: each component costs memory per entry, and a name of
/// thousands of one-byte components is no layer's.
const MAX_DEPTH: usize = 128;

/// What a path of the layer is, as the entries so far make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Dir,
    /// A directory only because an entry lies inside it.
    ImpliedDir,
    NonDir {
        file: bool,
    },
    Whiteout,
}

/// Marks every directory of `parents` as one, refusing a path through something that is
/// not a directory in this layer (a file, a symlink, a whiteout), as the tar unpacker's
/// opening of the parent would.
fn within_directories(
    seen: &mut HashMap<Vec<u8>, Seen>,
    parents: &[Vec<u8>],
) -> Result<(), &'static str> {
    for depth in 1..=parents.len() {
        match seen
            .entry(EntryPath::join(&parents[..depth]))
            .or_insert(Seen::ImpliedDir)
        {
            Seen::Dir | Seen::ImpliedDir => {}
            Seen::NonDir { .. } => {
                return Err("inside something that is no directory in this layer");
            }
            Seen::Whiteout => return Err("inside what this layer whites out"),
        }
    }
    Ok(())
}

/// The largest extended attribute value Linux stores.
const MAX_XATTR_VALUE: usize = 64 << 10;

/// What one index entry makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    /// A regular file: the layer's `files[n]`.
    File(usize),
    Symlink(Vec<u8>),
    /// Another name for an earlier file of this layer; its metadata is the target's (the
    /// node's mode and owners are the index's claim, and its xattrs are dropped).
    Hardlink(EntryPath),
    Char(u32, u32),
    Block(u32, u32),
    Fifo,
}

/// A node of the layer's tree with its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub path: EntryPath,
    pub kind: NodeKind,
    /// Permission bits only (`& 0o7777`): the kind says the type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch; 0 where the index gives none it can parse.
    pub mtime: i64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One change a layer makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Node(Node),
    /// Hides what the layers below hold at this path.
    Whiteout(EntryPath),
    /// Hides what the layers below hold inside this directory.
    Opaque(EntryPath),
}

/// A layer's changes and its regular files' chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerTree {
    pub changes: Vec<Change>,
    pub files: Vec<LazyFile>,
}

/// One index entry as the tree needs it, whichever format listed it.
pub(crate) struct RawEntry<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub link_name: &'a str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub dev: (u64, u64),
    /// RFC 3339, or empty.
    pub mtime: &'a str,
    /// Values base64.
    pub xattrs: &'a std::collections::BTreeMap<String, String>,
}

fn refused(name: &str, why: impl std::fmt::Display) -> IndexError {
    index_error(format!(
        "`{}`: {why}",
        lamina_unpack::shown(name.as_bytes())
    ))
}

/// The tree `entries` make, their regular files being `files` (as the format's reader
/// checked them, in entry order: the `n`th `reg` entry is `files[n]`).
pub(crate) fn build<'a>(
    entries: impl Iterator<Item = RawEntry<'a>>,
    files: Vec<LazyFile>,
) -> Result<LayerTree, IndexError> {
    let mut changes = Vec::new();
    // What each path of this layer is so far, keyed by its joined name: as the tar
    // unpacker's filesystem would say, one name is one thing.
    let mut seen: HashMap<Vec<u8>, Seen> = HashMap::new();
    let mut next_file = 0usize;
    for entry in entries {
        if entry.kind == "chunk" {
            continue;
        }
        let path = EntryPath::parse(entry.name.as_bytes()).map_err(|r| refused(entry.name, r))?;
        let file_index = (entry.kind == "reg").then(|| {
            next_file += 1;
            next_file - 1
        });
        let Some(name) = path.name() else {
            continue; // the layer root's own entry: its metadata is the image's
        };
        if path.components().len() > MAX_DEPTH {
            return Err(refused(
                entry.name,
                format!("deeper than {MAX_DEPTH} directories"),
            ));
        }
        within_directories(&mut seen, path.parent()).map_err(|why| refused(entry.name, why))?;
        if name == b".wh..wh..opq" {
            if path.parent().is_empty() {
                return Err(refused(entry.name, "an opaque marker at the layer root"));
            }
            changes.push(Change::Opaque(
                EntryPath::parse(&EntryPath::join(path.parent()))
                    .map_err(|r| refused(entry.name, r))?,
            ));
            continue;
        }
        if name.starts_with(b".wh..wh.") {
            continue; // aufs bookkeeping
        }
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(refused(entry.name, "a whiteout that names no entry"));
            }
            let mut parts = path.parent().to_vec();
            parts.push(hidden.to_vec());
            let hides = EntryPath::join(&parts);
            // OCI: a whiteout hides what lower layers hold, never this layer's own.
            if seen.insert(hides.clone(), Seen::Whiteout).is_some() {
                return Err(refused(
                    entry.name,
                    "a whiteout of what this layer itself holds",
                ));
            }
            changes.push(Change::Whiteout(
                EntryPath::parse(&hides).map_err(|r| refused(entry.name, r))?,
            ));
            continue;
        }
        let key = EntryPath::join(path.components());
        let now = if entry.kind == "dir" {
            Seen::Dir
        } else {
            Seen::NonDir {
                file: entry.kind == "reg",
            }
        };
        match seen.get(&key) {
            None => {}
            Some(Seen::ImpliedDir) if now == Seen::Dir => {}
            Some(Seen::ImpliedDir) => {
                return Err(refused(entry.name, "a directory earlier in this layer"));
            }
            Some(Seen::Whiteout) => {
                return Err(refused(entry.name, "whited out earlier in this layer"));
            }
            Some(_) => return Err(refused(entry.name, "listed twice")),
        }
        seen.insert(key, now);
        let kind = match entry.kind {
            "dir" => NodeKind::Dir,
            "reg" => NodeKind::File(file_index.unwrap_or_default()),
            "symlink" => {
                let target = entry.link_name.as_bytes();
                if target.is_empty() || target.contains(&0) || target.len() >= PATH_MAX {
                    return Err(refused(
                        entry.name,
                        "a symlink target empty, with a NUL, or past PATH_MAX",
                    ));
                }
                NodeKind::Symlink(target.to_vec())
            }
            "hardlink" => {
                let target = EntryPath::parse(entry.link_name.as_bytes())
                    .map_err(|r| refused(entry.name, format!("hardlink target: {r}")))?;
                let target_key = EntryPath::join(target.components());
                if seen.get(&target_key) != Some(&Seen::NonDir { file: true }) {
                    return Err(refused(
                        entry.name,
                        "a hardlink to no earlier file of this layer",
                    ));
                }
                NodeKind::Hardlink(target)
            }
            "char" | "block" => {
                let (major, minor) = entry.dev;
                if major > MAX_MAJOR || minor > MAX_MINOR {
                    return Err(refused(entry.name, "a device number past Linux's"));
                }
                let (major, minor) = (major as u32, minor as u32);
                if entry.kind == "char" {
                    NodeKind::Char(major, minor)
                } else {
                    NodeKind::Block(major, minor)
                }
            }
            "fifo" => NodeKind::Fifo,
            other => return Err(refused(entry.name, format!("entry type `{other}`"))),
        };
        if entry.uid == u32::MAX || entry.gid == u32::MAX {
            return Err(refused(entry.name, "an owner of -1"));
        }
        let mut xattrs = Vec::new();
        // A hardlink is another name of its target: the tar path gives it none of its own
        // metadata, and neither does the tree.
        let own_xattrs = if matches!(kind, NodeKind::Hardlink(_)) {
            None
        } else {
            Some(entry.xattrs)
        };
        for (key, value) in own_xattrs.into_iter().flatten() {
            use base64::Engine;
            let value = base64::engine::general_purpose::STANDARD
                .decode(value)
                .map_err(|e| refused(entry.name, format!("xattr `{key}`: {e}")))?;
            if value.len() > MAX_XATTR_VALUE || key.is_empty() || key.contains('\0') {
                return Err(refused(entry.name, format!("xattr `{key}`")));
            }
            if !is_reserved_xattr(key.as_bytes()) {
                xattrs.push((key.as_bytes().to_vec(), value));
            }
        }
        let mtime = humantime::parse_rfc3339_weak(entry.mtime)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as i64);
        changes.push(Change::Node(Node {
            path,
            kind,
            mode: entry.mode & 0o7777,
            uid: entry.uid,
            gid: entry.gid,
            mtime,
            xattrs,
        }));
    }
    if next_file != files.len() {
        return Err(index_error("its regular files and their chunks disagree"));
    }
    Ok(LayerTree { changes, files })
}
